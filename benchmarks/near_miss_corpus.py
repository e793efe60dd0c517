"""Every near-miss fuse reports over the exported corpus, grouped, and any that says "these nodes
are not the pattern" (the check tests/test_near_miss_quality.py runs on the test graphs).

    .venv/bin/python benchmarks/near_miss_corpus.py [--out benchmarks/results/near_miss_corpus.md]
    FUSE_CORPUS_DIRS=dir1:dir2 ...   # the corpus folders (default: benchmarks/corpus/*models)

A near-miss is a match whose anchor structure fit and whose precondition failed. Per model and
target (`onnx`, `ort-cpu`), a dry run with default flags and no verification; reasons are grouped
with node and tensor names and numbers blanked, so one line stands for every node it covers.
Exits 1 when a reason matches the "not the pattern" list.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli import api  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from tests.test_near_miss_quality import NOT_THE_PATTERN  # noqa: E402

CORPUS_DIRS = [Path(p) for p in os.environ.get("FUSE_CORPUS_DIRS", "").split(":") if p] or sorted(
    (REPO / "benchmarks" / "corpus").glob("*models"))
TARGETS = ("onnx", "ort-cpu")


def general(reason: str, nodes: tuple[str, ...] = ()) -> str:
    """The reason with names and numbers blanked: one line per kind of near-miss."""
    for name in sorted(nodes, key=len, reverse=True):
        reason = reason.replace(name, "…")
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"(/[\w./-]+|\bnode_\w+|\bval_\w+)", "…", reason)
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "near_miss_corpus.md")
    args = parser.parse_args()
    started = time.perf_counter()
    models = sorted(p for folder in CORPUS_DIRS for p in folder.glob("*.onnx"))
    kinds: collections.Counter = collections.Counter()
    example: dict[tuple[str, str], str] = {}
    wrong: list[str] = []
    errors: list[str] = []
    for path in models:
        for target in TARGETS:
            try:
                report = api.optimize(path, FuseConfig(target=target, verify=False), dry_run=True).report
            except Exception as exc:  # noqa: BLE001 - one model's failure is a line, not the end of the run
                errors.append(f"{path.stem} {target}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            for miss in report.near_misses:
                key = (miss.pass_name, general(miss.reason, tuple(miss.nodes)))
                kinds[key] += 1
                example.setdefault(key, f"{path.stem} ({target}): {miss.reason}")
                if NOT_THE_PATTERN.search(miss.reason):
                    wrong.append(f"{path.stem} {target} {miss.pass_name}: {miss.reason}")
            print(f"{path.stem} {target}: {len(report.near_misses)} near-misses", file=sys.stderr, flush=True)
    lines = ["# Near-misses over the corpus", "",
             f"`benchmarks/near_miss_corpus.py`, {time.perf_counter() - started:.0f} s: {len(models)} models x "
             f"{len(TARGETS)} targets, default flags. **{len(wrong)} near-misses say the nodes are not the "
             f"pattern**; {sum(kinds.values())} near-misses of {len(kinds)} kinds.", "",
             "| count | pass | reason (names and numbers blanked) | first seen |", "|---:|---|---|---|"]
    for (pass_name, reason), count in kinds.most_common():
        lines.append(f"| {count} | {pass_name} | {reason[:220]} | {example[(pass_name, reason)].split(':')[0]} |")
    if wrong:
        lines += ["", "## Not the pattern (should be silent)", ""] + [f"- {w}" for w in wrong]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in errors]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:4]))
    return 1 if wrong or errors else 0


if __name__ == "__main__":
    sys.exit(main())
