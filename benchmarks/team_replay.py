"""What the adaptive team's rule costs, on recorded calls: record, then replay.

Run:
    python benchmarks/team_replay.py record ROW OUT.npz [--blocks 500] [--background-load 2]
    python benchmarks/team_replay.py replay TRACE.npz [TRACE.npz ...] [--runtime PATH[:DEFS]]

``record`` builds ``threads_ab.py``'s step of ``ROW`` (moons10, mlp, w1024, cnn, gpt) once
and times single calls of it, switching the same library between the full team
(``sg_set_threads(n, 0)``) and one thread with blocks cut for ``n`` (``sg_set_threads(n,
2)``: what the adaptive default's one-thread calls run). Each block runs ``CHUNK`` calls of
one option, then ``CHUNK`` of the other, in a random order per block, so every block holds
both options' times under the same load, and each chunk's first call carries the cost of
the switch (the other core's caches, a waking pool thread). ``--background-load N`` busy
processes start before the warm-up.

``replay`` drives the adaptive rule of a ``runtime.h`` (the packaged one unless
``--runtime`` names others; ``PATH:NAME=VALUE,...`` prepends ``#define``s, for variants)
with those times: call ``k`` of the replay takes block ``k // CHUNK``'s time of the option
the rule picked, a chunk's first (switch) time when the rule switched, a steady one
otherwise. Printed: the replay's total time over the better fixed option's (steady times)
from 8 starting blocks, mean [min, max], and the share of one-thread calls. This is the
rule's own cost (probes, switches, wrong choices) on the calls a machine really produced,
free of what limits ``threads_ab.py`` under load: there two libraries run in different
rounds, and two copies of one library read up to 1.2x apart in means.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.backends.c.executable import num_threads
from shapegrad.backends.c.render import RUNTIME_GLOBALS
from shapegrad.backends.c.toolchain import compiler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import threads_ab as A
import train_step as T

CHUNK = 4  # calls of one option in a row: the first switches, the others are steady
STARTS = 8  # replays per trace, from evenly spaced blocks

# entry points to the rule (its globals: render.RUNTIME_GLOBALS); a restart is a new
# two-thread adaptive setting, as sg_set_threads makes it
_HARNESS = r"""
int team_pick(void) { return sg_team_pick(); }
void team_record(int pick, double seconds) { sg_team_record(pick, seconds); }
void team_restart(void) { sg_threads = 2; sg_adaptive = 1; ++sg_team_epoch; }
"""
_CDEF = "int team_pick(void); void team_record(int, double); void team_restart(void);"


def record(row: str, out: str, blocks: int, load: int) -> None:
    busy = T.background_load(load)
    try:
        w = A.workload(row)
        step = T.sgd_step(w["loss"])
        x, y = w["xs"][0], w["ys"][0]
        graph = sg.compile(step, backend="numpy", donate_argnums=0).graph(w["params"], x, y)
        n = num_threads()
        exe = A.build(graph, A.this_render, f"replay_{row}", n, 0)
        bound = exe.bind([p.copy() for p in w["params"]])
        import cffi

        ffi = cffi.FFI()
        ffi.cdef("void sg_set_threads(int n, int adaptive);")
        lib: Any = ffi.dlopen(exe.source_path)  # the loaded library: the same handle

        def run_option(option: int, calls: int) -> list[float]:  # 1 full team, 0 one thread
            lib.sg_set_threads(n, 0 if option else 2)
            seconds = []
            for _ in range(calls):
                t0 = time.perf_counter()
                bound(x, y)
                seconds.append(time.perf_counter() - t0)
            return seconds

        for option in (0, 1) * 20:  # warm-up
            run_option(option, CHUNK)
        order = np.random.default_rng(1)
        times = np.zeros((blocks, 2, CHUNK))
        load_before = os.getloadavg()[0]
        for b in range(blocks):
            first = int(order.integers(2))
            for option in (first, 1 - first):
                times[b, option] = run_option(option, CHUNK)
        np.savez(out, times=times, row=row, load=load, threads=n)
        steady = times[:, :, 1:]
        print(
            f"{row}, {n} threads, {load} busy processes, load average {load_before:.2f} -> "
            f"{os.getloadavg()[0]:.2f}: {blocks} blocks of {CHUNK} calls per option\n"
            f"  one thread: mean {steady[:, 0].mean() * 1e3:.3f} ms, median "
            f"{np.median(steady[:, 0]) * 1e3:.3f}, after a switch {times[:, 0, 0].mean() * 1e3:.3f}\n"
            f"  full team:  mean {steady[:, 1].mean() * 1e3:.3f} ms, median "
            f"{np.median(steady[:, 1]) * 1e3:.3f}, after a switch {times[:, 1, 0].mean() * 1e3:.3f}"
        )
    finally:
        for p in busy:
            p.kill()


def load_rule(spec: str | None, workdir: Path, index: int) -> Any:
    """The adaptive rule of ``spec`` (``PATH[:NAME=VALUE,...]``; None: the packaged
    ``runtime.h``) compiled with the harness into a library of its own."""
    import cffi

    if spec is None:
        text = resources.files("shapegrad.backends.c").joinpath("runtime.h").read_text("utf-8")
    else:
        path, _, defines = spec.partition(":")
        head = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in defines.split(",") if d)
        text = head + Path(path).read_text("utf-8")
    source = workdir / f"rule{index}.c"
    source.write_text(text + RUNTIME_GLOBALS + _HARNESS)
    library = workdir / f"librule{index}.so"
    cmd = [compiler(), "-O2", "-fPIC", "-shared", "-o", str(library), str(source)]
    subprocess.run(cmd, check=True, capture_output=True)
    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    return ffi.dlopen(str(library))


def replay_once(rule: Any, times: np.ndarray, start: int) -> tuple[float, float]:
    """(time over the better fixed option's, share of one-thread calls) of one replay."""
    rule.team_restart()
    blocks = times.shape[0]
    total, previous, solo = 0.0, 1, 0
    calls = blocks * CHUNK
    for k in range(calls):
        b, p = (start + k // CHUNK) % blocks, k % CHUNK
        pick = int(rule.team_pick())
        seconds = float(
            times[b, pick, 0] if pick != previous else times[b, pick, 1 + p % (CHUNK - 1)]
        )
        rule.team_record(pick, seconds)
        total += seconds
        previous, solo = pick, solo + (pick == 0)
    best = float(times[:, :, 1:].mean(axis=(0, 2)).min()) * calls
    return total / best, solo / calls


def replay(traces: list[str], runtimes: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        specs: list[str | None] = list(runtimes) or [None]
        rules = [load_rule(spec, Path(tmp), i) for i, spec in enumerate(specs)]
        for trace in traces:
            data = np.load(trace)
            times = data["times"]
            steady = times[:, :, 1:].mean(axis=(0, 2))
            print(
                f"{trace}: {data['row']}, {int(data['load'])} busy processes, {times.shape[0]} "
                f"blocks; steady means one thread {steady[0] * 1e3:.3f} ms, full team "
                f"{steady[1] * 1e3:.3f} ms"
            )
            starts = range(0, times.shape[0], max(1, times.shape[0] // STARTS))
            for spec, rule in zip(specs, rules, strict=True):
                runs = np.array([replay_once(rule, times, s) for s in starts])
                name = spec or "runtime.h (packaged)"
                print(
                    f"  {name[-48:]:48s} time / better fixed option {runs[:, 0].mean():.3f} "
                    f"[{runs[:, 0].min():.3f}, {runs[:, 0].max():.3f}], one thread in "
                    f"{runs[:, 1].mean():.1%} of the calls"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("row", choices=["moons10", "mlp", "w1024", "cnn", "gpt"])
    rec.add_argument("out")
    rec.add_argument("--blocks", type=int, default=500)
    rec.add_argument("--background-load", type=int, default=0, metavar="N")
    rep = sub.add_parser("replay")
    rep.add_argument("traces", nargs="+")
    rep.add_argument("--runtime", action="append", default=[], metavar="PATH[:DEFS]")
    args = parser.parse_args()
    if args.command == "record":
        record(args.row, args.out, args.blocks, args.background_load)
    else:
        replay(args.traces, args.runtime)


if __name__ == "__main__":
    main()
