"""Verification with default flags across corpora: how many models verify, how many are
unverifiable (and why), and whether any output was written unconfirmed because the *optimized*
model failed (that must be none: it is a mismatch, bisected and rolled back).

    .venv/bin/python benchmarks/verify_corpus.py [DIR ...] [--backend] [--targets onnx,ort-cpu]
        [--json benchmarks/results/verify_corpus.json]

DIR: folders of .onnx files (the benchmark corpus, the held-out corpus); --backend adds every
model of onnx's own backend test data. Each model goes through `fuse optimize` exactly as a new
user runs it: no --dim, no --int-range.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuse_cli import api  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.errors import FuseError  # noqa: E402

BACKEND = Path(onnx.__file__).parent / "backend" / "test" / "data"


def backend_models() -> list[Path]:
    return sorted(p for kind in ("pytorch-converted", "pytorch-operator", "simple")
                  for p in (BACKEND / kind).glob("*/model.onnx"))


def run_one(path: Path, target: str, scratch: Path) -> dict:
    started = time.perf_counter()
    name = path.parent.name if path.name == "model.onnx" else path.stem
    try:
        report = api.optimize(path, FuseConfig(target=target), scratch / f"{name}.{target}.onnx").report
    except FuseError as exc:
        return {"model": name, "target": target, "status": "error", "reason": str(exc)}
    result = report.verification
    return {
        "model": name, "target": target, "status": result.status, "reason": result.reason,
        "rolled_back": [r.pass_name for r in report.rolled_back],
        "rolled_back_because_optimized_failed": [r.pass_name for r in report.rolled_back if r.output is None],
        "settings": [dict(s) for s in result.settings], "exit_code": report.exit_code,
        "nodes": [report.nodes_before, report.nodes_after], "seconds": round(time.perf_counter() - started, 1),
    }


def summary(rows: list[dict], models: int) -> list[str]:
    counts = collections.Counter(r["status"] for r in rows)
    lines = [f"{len(rows)} runs ({models} models): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    reasons = collections.Counter(r["reason"].split(":")[0] + ": " + r["reason"].split(": ")[-1][:90]
                                  for r in rows if r["status"] == "unverifiable")
    lines += [f"  unverifiable x{n}: {reason}" for reason, n in reasons.most_common()]
    failed = [r for r in rows if r.get("rolled_back_because_optimized_failed")]
    lines.append(f"rolled back because the optimized model failed where the original ran: {len(failed)}")
    lines += [f"  {r['model']} {r['target']}: {r['status']} rolled back {r.get('rolled_back')} {r.get('reason') or ''}"
              for r in rows if r["status"] not in ("match", "unverifiable") or r.get("rolled_back")]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--backend", action="store_true")
    parser.add_argument("--targets", default="onnx,ort-cpu")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the summary as Markdown")
    args = parser.parse_args(argv)
    models = [p for folder in args.folders for p in sorted(folder.glob("*.onnx"))]
    models += backend_models() if args.backend else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="fuse-verify-corpus-") as scratch:
        for path in models:
            for target in args.targets.split(","):
                rows.append(run_one(path, target, Path(scratch)))
                print(json.dumps(rows[-1]), flush=True)
    lines = summary(rows, len(models))
    print("\n" + "\n".join(lines))
    if args.markdown:
        args.markdown.write_text("# Verification with default flags\n\n`benchmarks/verify_corpus.py "
                                 + " ".join(str(f) for f in args.folders) + (" --backend" if args.backend else "")
                                 + "`: `fuse optimize` as a new user runs it (no --dim, no --int-range).\n\n```\n"
                                 + "\n".join(lines) + "\n```\n")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
