"""Catch rate of the mypy plugin on shape bugs planted in the realistic correct corpus.

Each corpus file (tests/mypy_fixtures/corpus, all correct and runnable) is mutated
one site at a time with edits people make by mistake: a dropped or spurious
``.T``, another reduction/softmax/concat axis, a lost ``keepdims``, a reshape
that drops or repeats a size, a shifted slice, a changed literal size, two
arguments swapped. A mutant is a *real bug* when running its ``run()`` raises;
it is *caught* when mypy with the plugin reports a ``shapegrad-shape`` error in
it, and *reported on its line* when that error is on the mutated line (for an
edited signature annotation: in that function), or on the line its run-time error names. The mutants are checked in one mypy run.

Usage: python benchmarks/mypy_mutants.py [--show-missed] [--limit N] [--plugin P --src DIR]
(``--plugin shapegrad.mypy_plugin --src OTHER/src`` measures another version of the plugin.)
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "mypy_fixtures" / "corpus"

# (name, pattern, replacement): each match of the pattern is one mutant.
OPERATORS: list[tuple[str, str, str]] = [
    ("drop .T", r"@ (\w+)\.T\b", r"@ \1"),
    ("add .T", r"@ (w\w*|W\w*|head|fc)\b(?!\.T|\[)", r"@ \1.T"),
    ("axis -1 -> 1", r"axis=-1\b", "axis=1"),
    ("axis 1 -> 0", r"axis=1\b", "axis=0"),
    ("axis 0 -> 1", r"axis=0\b", "axis=1"),
    ("drop keepdims", r", keepdims=True", ""),
    ("reshape drops a size", r"reshape\((\w+), (\w+), (\w+)\)", r"reshape(\1, \3)"),
    ("reshape repeats a size", r"reshape\((\w+ \* \w+), (\w+)\)", r"reshape(\1, \1)"),
    ("slice shift", r"\[:, 1:\]", "[:, :]"),
    ("slice shift", r"\[:, :-1\]", "[:, :]"),
    ("literal size", r'(Float\[Tensor, "[^"]*?)\b(16|32|10|8)\b', r"\g<1>12"),
    ("literal size", r"\b(5 \* 5|7 \* 7|4 \* 4)\b", "6 * 6"),
    ("swap args", r"\((\w+), (\w+), (w\w*)\)", r"(\2, \1, \3)"),
]


@dataclass
class Mutant:
    source: Path
    operator: str
    line: int
    text: str


def mutants() -> list[Mutant]:
    out: list[Mutant] = []
    for path in sorted(CORPUS.glob("*.py")):
        original = path.read_text()
        body_start = original.find("\ndef run(")  # mutate the model code, not the driver
        for name, pattern, repl in OPERATORS:
            for match in re.finditer(pattern, original):
                if body_start != -1 and match.start() > body_start:
                    continue
                new = original[: match.start()] + match.expand(repl) + original[match.end() :]
                if new != original:
                    line = original.count("\n", 0, match.start()) + 1
                    out.append(Mutant(path, name, line, new))
    return out


def own_lines(m: Mutant, annotation: bool) -> set[int]:
    """The lines a report of mutant ``m`` may name: its own; for an edit of a function's
    annotations (its signature), or a bug that fails that function's own annotation check
    at run time (``annotation``), the lines of the function holding the edit (mypy reports
    where the body or a ``return`` contradicts the annotation, as jaxtyping does)."""
    for node in ast.walk(ast.parse(m.text)):
        if not isinstance(node, ast.FunctionDef) or node.lineno > m.line:
            continue
        end = node.end_lineno or node.lineno
        in_signature = m.line < node.body[0].lineno
        innermost = not any(
            isinstance(c, ast.FunctionDef) and c.lineno <= m.line <= (c.end_lineno or c.lineno)
            for c in ast.walk(node) if c is not node
        )  # fmt: skip
        if m.line <= end and (in_signature or (annotation and innermost)):
            return set(range(node.lineno, end + 1))
    return {m.line}


def run_time_failure(path: Path) -> tuple[bool, int | None, bool]:
    """(does ``run()`` fail, the mutant's line the error names if it names one, whether
    the failure is an annotation check of ``sg.typechecked``)."""
    spec = importlib.util.spec_from_file_location(f"mutant_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(module)
            value = module.run()
        return not math.isfinite(float(value)), None, False
    except Exception as err:
        where = re.search(re.escape(path.name) + r":(\d+)", str(err))
        return True, int(where[1]) if where else None, type(err).__name__ == "ShapeTypeError"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show-missed", action="store_true")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--plugin", default="shapegrad_mypy", help="the plugins= entry")
    parser.add_argument("--src", default=str(ROOT / "src"), help="shapegrad sources to check with")
    args = parser.parse_args()
    found = mutants()
    if args.limit:
        found = found[: args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = []
        for k, m in enumerate(found):
            f = work / f"m{k:03d}_{m.source.stem}.py"
            f.write_text(m.text)
            files.append(f)
        config = work / "mypy.ini"
        config.write_text(f"[mypy]\npython_version = 3.11\nplugins = {args.plugin}\n")
        env = {**os.environ, "PYTHONPATH": args.src}
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
             str(work / "cache"), "--no-pretty", *map(str, files)],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        reported: dict[str, list[str]] = {}
        lines: dict[str, set[int]] = {}
        for line in done.stdout.splitlines():
            if line.endswith("[shapegrad-shape]"):
                name = Path(line.split(":")[0]).name
                reported.setdefault(name, []).append(line)
                lines.setdefault(name, set()).add(int(line.split(":")[1]))
        sys.path.insert(0, str(ROOT / "src"))
        real = caught = false_alarm = located = same_line = on_line = 0
        rows: dict[str, list[int]] = {}
        missed: list[str] = []
        for f, m in zip(files, found, strict=True):
            bug, where, annotation = run_time_failure(f)
            hit = f.name in reported
            if bug and hit and where is not None:
                located += 1
                same_line += where in lines[f.name]
            if bug and hit and (lines[f.name] & own_lines(m, annotation) or where in lines[f.name]):
                on_line += 1
            elif bug and hit:
                missed.append(f"ELSEWHERE: {m.source.name}:{m.line} {m.operator}: run time "
                              f"{where}, mypy {sorted(lines[f.name])}: "
                              f"{reported[f.name][0].split(': ', 2)[-1]}")  # fmt: skip
            stats = rows.setdefault(m.operator, [0, 0, 0])
            if bug:
                real += 1
                stats[0] += 1
                if hit:
                    caught += 1
                    stats[1] += 1
                else:
                    missed.append(f"{m.source.name}:{m.line} {m.operator}")
            elif hit:
                false_alarm += 1
                stats[2] += 1
                missed.append(f"REPORTED BUT RAN: {m.source.name}:{m.line} {m.operator}: "
                              f"{reported[f.name][0].split(': ', 2)[-1]}")  # fmt: skip
        print(f"{len(found)} mutants of {len(list(CORPUS.glob('*.py')))} corpus files; "
              f"{real} fail at run time (real bugs), {len(found) - real} still run")  # fmt: skip
        print("| mutation | real bugs | caught | reported but ran |")
        print("|---|---|---|---|")
        for name, (n, c, fa) in sorted(rows.items()):
            print(f"| {name} | {n} | {c} | {fa} |")
        print(f"| total | {real} | {caught} ({100 * caught / max(real, 1):.1f}%) | {false_alarm} |")
        print(f"real bugs reported on their line (the mutated line or the one the run-time "
              f"error names): {on_line} ({100 * on_line / max(real, 1):.1f}%)")  # fmt: skip
        print(f"caught bugs whose run-time error names a line: {located}; "
              f"mypy reports that same line for {same_line}")  # fmt: skip
        if args.show_missed:
            print("\n".join(missed))


if __name__ == "__main__":
    main()
