"""Run one benchmark in two checkouts of workbench, interleaved, and compare medians.

A refactor proves "no regression" by running the same benchmark on the code before
and after it, alternating which goes first in each round, so load from other
processes hits both alike. Each checkout runs with its own ``.venv``::

    git worktree add /tmp/before <commit>        # plus: make -C /tmp/before .venv/.installed
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/ab.py \\
        --before /tmp/before --after . --rounds 5 -- bench/mlp.py --rounds 1

The benchmark prints Markdown tables; every numeric cell of every table row is
collected per round, and the report gives, for each row and column, the median over
rounds for both checkouts and their ratio (after / before).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict

NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?")


def table_cells(output: str) -> dict[tuple[str, str, str], float]:
    """Numeric cells of the Markdown tables in ``output``, keyed by (table header, row label, column)."""
    cells: dict[tuple[str, str, str], float] = {}
    header: list[str] | None = None
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            header = None
            continue
        parts = [p.strip() for p in line.strip("|").split("|")]
        if header is None:
            header = parts
            continue
        if all(set(p) <= set("-: ") for p in parts):
            continue
        label = parts[0]
        for column, text in zip(header[1:], parts[1:]):
            match = NUMBER.match(text.replace("x", "").replace("%", ""))
            if match:
                cells[(header[0], label, column)] = float(match.group().replace(",", ""))
    return cells


def run_once(checkout: str, command: list[str]) -> str:
    python = os.path.join(checkout, ".venv", "bin", "python")
    done = subprocess.run([python, *command], cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{checkout}: {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="checkout of the older code (with .venv)")
    parser.add_argument("--after", default=".", help="checkout of the newer code (with .venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="benchmark script and its arguments, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark command after --")
    seen: dict[str, dict[tuple, list[float]]] = {"before": defaultdict(list), "after": defaultdict(list)}
    for round_ in range(args.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for side in order:
            for key, value in table_cells(run_once(getattr(args, side), command)).items():
                seen[side][key].append(value)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"Medians of {args.rounds} interleaved rounds of `{' '.join(command)}`\n")
    print("| table | row | column | before | after | after/before |")
    print("|---|---|---|---:|---:|---:|")
    for key in seen["before"]:
        if key not in seen["after"]:
            continue
        before, after = statistics.median(seen["before"][key]), statistics.median(seen["after"][key])
        ratio = f"{after / before:.3f}" if before else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {before:.4g} | {after:.4g} | {ratio} |")


if __name__ == "__main__":
    main()
