"""Interleaved A/B of ``train_step.py`` cells between two source trees (e.g. before/after).

Run:
    git worktree add --detach /tmp/before <commit>
    python benchmarks/compare_revisions.py /tmp/before . --rows moons10,mlp,cnn \\
        --columns "C 1-step,C K-step,cold cpu" --rounds 3

``--threads 2`` sets ``SHAPEGRAD_NUM_THREADS`` for both sides, ``--threads 1,2`` per side
(the same tree twice then compares one thread with two); ``--background-load N`` keeps N
busy processes running during the whole comparison.

Every cell runs in a fresh process with ``PYTHONPATH=<tree>/src`` and that tree's own
``benchmarks/train_step.py``; the two trees alternate (A B, then B A, ...) so slow
phases of a busy machine hit both alike. Prints the median of each side and B/A.
The 1-minute load average before and after the run is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def cell(tree: str, column: str, row: str, threads: str | None = None) -> float | None:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
    if threads:
        env["SHAPEGRAD_NUM_THREADS"] = threads
    script = os.path.join(os.path.abspath(tree), "benchmarks", "train_step.py")
    proc = subprocess.run(
        [sys.executable, script, "--cell", column, row], capture_output=True, text=True, env=env
    )
    last = proc.stdout.strip().splitlines()[-1:] or ["none"]
    return None if proc.returncode or last[0] == "none" else float(last[0])


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("a", help="source tree A (the baseline)")
    parser.add_argument("b", help="source tree B")
    parser.add_argument("--rows", default="moons10,moons256,mlp,cnn")
    parser.add_argument("--columns", default="C 1-step,C K-step,cold cpu,warm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", help="N (both sides) or A,B (per side)")
    parser.add_argument("--background-load", type=int, default=0, metavar="N")
    args = parser.parse_args()
    threads = (args.threads or "").split(",")
    threads_of = {"a": threads[0] or None, "b": threads[-1] or None}
    code = "while True:\n    pass"
    busy = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(args.background_load)]
    try:
        compare(args, threads_of)
    finally:
        for proc in busy:
            proc.kill()


def compare(args: argparse.Namespace, threads_of: dict[str, str | None]) -> None:
    print(
        f"threads A/B: {threads_of['a']}/{threads_of['b']}; busy processes: {args.background_load}"
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'workload':10s} {'column':10s} {'A':>12s} {'B':>12s} {'B/A':>7s}")
    for row in args.rows.split(","):
        for column in args.columns.split(","):
            results: dict[str, list[float]] = {"a": [], "b": []}
            for r in range(args.rounds):
                order = ("a", "b") if r % 2 == 0 else ("b", "a")
                for side in order:
                    value = cell(getattr(args, side), column, row, threads_of[side])
                    if value is not None:
                        results[side].append(value)
            a = statistics.median(results["a"]) if results["a"] else None
            b = statistics.median(results["b"]) if results["b"] else None
            ratio = f"{b / a:.2f}" if a and b else "-"
            print(f"{row:10s} {column:10s} {fmt(a):>12s} {fmt(b):>12s} {ratio:>7s}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
