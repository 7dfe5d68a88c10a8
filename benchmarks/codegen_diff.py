"""Generated C of the benchmark steps on two source trees, and the differences between them.

Run:
    git archive 27479ab | tar -x -C /tmp/base     # or: git worktree add --detach /tmp/base 27479ab
    python benchmarks/codegen_diff.py /tmp/base . [--out /tmp/codegen] [--only mlp,cnn]

Each tree renders (in a fresh process, ``PYTHONPATH=<tree>/src``, no C compiler run) the
SGD steps of ``benchmarks/train_step.py`` (moons10, mlp, w1024, cnn) and a 2-block
char-level GPT step (d_model 128, 4 heads, context 64, batch 32; unrolled and as a
``sg.scan`` layer loop), plus variants with ``flush_denormals`` and ``profile``, as one
unit (``generate``), as the translation units the backend compiles (``render_c_units``)
and as CUDA source (``backends.cuda.generate``; no GPU needed). Prints
per case whether the sources are identical, else the changed-line counts, and writes the
sources and unified diffs under ``--out``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from typing import Any

CASES = ["moons10", "mlp", "w1024", "cnn", "gpt", "gpt_scan", "mlp_ftz", "cnn_profile"]


def _gpt_step(loop: bool) -> tuple[Any, tuple[Any, ...]]:
    import numpy as np
    from charlm_model import charlm_loss, charlm_params

    import shapegrad as sg

    vocab, d, blocks, heads, t, bsz = 94, 128, 2, 4, 64, 32
    rng = np.random.default_rng(2)
    ids = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)
    targets = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)
    params = charlm_params(rng, vocab, d, t, blocks)
    loss = charlm_loss(blocks, heads, vocab, loop)

    from shapegrad.tree import tree_map

    def step(p: dict[str, Any], ids: Any, targets: Any) -> Any:
        value, grads = sg.value_and_grad(loss)(p, ids, targets)
        new = {k: tree_map(lambda a, g: a - 0.01 * g, p[k], grads[k]) for k in p}
        return new, value

    return step, (params, ids, targets)


def render_case(case: str) -> dict[str, str]:
    """Sources of one case in the current interpreter's tree: {label: text}."""
    import shapegrad as sg
    from shapegrad.backends import c as cback
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c.render import render_c_units

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import train_step as ts

    extra: tuple[tuple[str, Any], ...] = (("vector_math", True),)
    if case.startswith("gpt"):
        step, args = _gpt_step(loop=case == "gpt_scan")
    else:
        row = case.split("_")[0]
        name, batch, _k = ts.ROWS[row]
        w = ts.workload(name, batch, 1)
        step, args = ts.sgd_step(w["loss"]), (w["params"], w["xs"][0], w["ys"][0])
    if case.endswith("_ftz"):
        extra += (("flush_denormals", True),)
    if case.endswith("_profile"):
        extra += (("profile", True),)
    graph = sg.compile(step, backend="numpy").graph(*args)
    settings = dict(extra)
    if "backend_options" in CompileOptions.__dataclass_fields__:  # typed options (#23)
        from shapegrad.backends.c import COptions

        denormals = "flush" if settings.get("flush_denormals") else "keep"
        typed = COptions(vector_math=True, denormals=denormals, profile="profile" in settings)
        options = CompileOptions(name=case, backend_options=typed)
    else:  # a tree from before the typed options: the untyped bag
        options = CompileOptions(name=case, extra=extra)  # type: ignore[call-arg]
    program, source = cback.generate(graph, options)
    out = {"one unit": source}
    units = render_c_units(program, bool(settings.get("profile", False)), True)
    if len(units) > 1:  # what the backend compiles (see render_c_units)
        for unit in units:
            out[f"unit {unit.name}"] = unit.source
    if not case.endswith(("_ftz", "_profile", "_scan")):  # the CUDA renderer shares cstyle.py
        from shapegrad.backends import cuda

        out["cuda"] = cuda.generate(graph, CompileOptions(name=case))[1]
    return out


def sources(tree: str, cases: list[str]) -> dict[str, dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import codegen_diff as cd; "
        "print(json.dumps({c: cd.render_case(c) for c in sys.argv[2].split(',')}))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", code, here, ",".join(cases)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"rendering in {tree} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, dict[str, str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("a", help="source tree A (the baseline)")
    parser.add_argument("b", help="source tree B")
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--out", default="/tmp/codegen_diff")
    args = parser.parse_args()
    cases = args.only.split(",")
    a, b = sources(args.a, cases), sources(args.b, cases)
    os.makedirs(args.out, exist_ok=True)
    for case in cases:
        for label in sorted(set(a[case]) | set(b[case])):
            old = a[case].get(label, "").splitlines(keepends=True)
            new = b[case].get(label, "").splitlines(keepends=True)
            stem = os.path.join(args.out, f"{case}.{label.replace(' ', '_')}")
            for side, text in (("a", old), ("b", new)):
                with open(f"{stem}.{side}.c", "w", encoding="utf-8") as handle:
                    handle.writelines(text)
            if old == new:
                print(f"{case:12s} {label:16s} identical ({len(new)} lines)")
                continue
            diff = list(difflib.unified_diff(old, new, f"a/{case}", f"b/{case}", n=2))
            with open(f"{stem}.diff", "w", encoding="utf-8") as handle:
                handle.writelines(diff)
            minus = sum(1 for x in diff if x.startswith("-") and not x.startswith("---"))
            plus = sum(1 for x in diff if x.startswith("+") and not x.startswith("+++"))
            print(f"{case:12s} {label:16s} -{minus} +{plus} lines ({len(new)} lines): {stem}.diff")


if __name__ == "__main__":
    main()
