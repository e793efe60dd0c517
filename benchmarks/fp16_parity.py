"""fp16 copies fuse what their float32 copies fuse (issue 32): fusion counts per pass, side by side.

    .venv/bin/python benchmarks/fp16_parity.py [--models DIR] [--out FILE] [--dims batch=1,sequence=64]

For every NAME-FORM-fp16.onnx in DIR (benchmarks/corpus/fp16.py writes them, `model.half()`
exports) and its float32 copy NAME-FORM.onnx: `fuse optimize` with default flags at `--target
onnx --upgrade-opset 20`, `--target ort-cpu` and `--target ort-cuda`; nodes after, fusions per
pass, verification status, and the passes whose counts differ, with the float16 copy's near-miss
reason for each (a kernel the target lacks at float16 is a reason, not a gap). Each run is a child
process: a crash is a cell saying so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = (("onnx", ("--upgrade-opset", "20")), ("ort-cpu", ()), ("ort-cuda", ()))
# Passes whose counts follow the graph's form, not a fusion the copy lacks: a float16 export has
# other Casts, other equal weights and other shape arithmetic than its float32 copy.
HOUSEKEEPING = ("fold-", "merge-", "eliminate-", "static-", "fuse-casts", "fuse-reshapes", "fuse-transposes",
                "fuse-squeeze", "flatten-", "unhold-", "schedule", "pin-gelu-bias")


def run_fuse(model: Path, target: str, extra: tuple[str, ...], dims: list[str], work: Path) -> dict:
    report = work / f"{model.stem}-{target}.json"
    command = [sys.executable, "-m", "fuse_cli", "optimize", str(model),
               "-o", str(work / f"{model.stem}-{target}.onnx"), "--target", target, *extra, "--json", str(report),
               *(a for d in dims for a in ("--dim", d))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if not report.exists():
        return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"}
    data = json.loads(report.read_text())
    return {"nodes": data["nodes"]["after"], "exit": data["exit_code"], "status": data["verification"]["status"]
            if data.get("verification") else "off",
            "fusions": Counter({f["pass"]: f["count"] for f in data["fusions"]}),
            "misses": {m["pass"]: m["reason"] for m in data["near_misses"]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=REPO / "benchmarks" / "corpus" / "models")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fp16_parity.md")
    parser.add_argument("--dims", default="batch=1,sequence=64")
    args = parser.parse_args(argv)
    dims = [d for d in args.dims.split(",") if d]
    pairs = [(p.with_name(p.name.replace("-fp16.onnx", ".onnx")), p) for p in sorted(args.models.glob("*-fp16.onnx"))]
    pairs = [(a, b) for a, b in pairs if a.exists()]
    lines = [f"# fp16 copies against float32 copies ({datetime.date.today()})", "",
             f"`fuse optimize` with default flags and `--dim {' --dim '.join(dims)}`; float16 copies are "
             "`model.half()` TorchScript exports (benchmarks/corpus/fp16.py). Regenerate: "
             "`.venv/bin/python benchmarks/fp16_parity.py --models DIR`.", "",
             "| model | target | nodes fp32 -> fp16 | verified fp32 / fp16 | fusions fp32 / fp16 | passes that differ "
             "(fp16's reason) |",
             "|---|---|---|---|---|---|"]
    gaps = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fp32, fp16 in pairs:
            for target, extra in TARGETS:
                a, b = (run_fuse(m, target, extra, dims, Path(tmp)) for m in (fp32, fp16))
                if "error" in a or "error" in b:
                    lines.append(f"| {fp16.stem} | {target} | {a.get('error', '')} {b.get('error', '')} | | | |")
                    gaps += 1
                    continue
                differ = sorted(p for p in set(a["fusions"]) | set(b["fusions"]) if a["fusions"][p] != b["fusions"][p])
                said = "; ".join(f"{p} {a['fusions'][p]} / {b['fusions'][p]}"
                                 + (f" ({b['misses'][p][:160]})" if p in b["misses"] else "") for p in differ)
                gaps += any(b["fusions"][p] < a["fusions"][p] and p not in b["misses"]
                            and not p.startswith(HOUSEKEEPING) for p in differ)
                lines.append(f"| {fp32.stem} | {target} | {a['nodes']} -> {b['nodes']} | {a['status']} / {b['status']} "
                             f"| {sum(a['fusions'].values())} / {sum(b['fusions'].values())} | {said or 'none'} |")
                print(lines[-1], flush=True)
    lines += ["", f"{gaps} cells where the float16 copy fuses less with no reason given (or a run failed); "
              "housekeeping passes (" + ", ".join(HOUSEKEEPING) + ") count the graph's form, not a fusion."]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}; {gaps} unexplained gaps")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
