"""Does every attention and rotary embedding of the decoder corpus fuse? Issue 32's LLM table.

    .venv/bin/python benchmarks/decoder_fusions.py [--models DIR] [--only SUBSTRING,...]
                                                   [--out benchmarks/results/decoder_fusions.md]

Every graph of DIR's manifest.json (benchmarks/corpus/decoders.py: prefill and decode step, with
and without a position_ids input, TorchScript opset 17 and dynamo opset 18) is fused the way a user
runs fuse, default flags (verification and the peak guard on), at two targets:

  ort-cpu   `fuse optimize M --target ort-cpu`
  opset23   `fuse optimize M --target onnx --upgrade-opset 23`

What counts as left unfused is read off the written graph, not off fuse's own report: a Softmax
left is an attention not fused (each eager or sdpa attention has exactly one), a Neg left is a
rotate_half not fused (rotary's only Neg; RMSNorm, GELU and the masks have none). The table gives
the fused operators by kind, what is left, verification, and the passes the peak guard left out.
A graph fuse fails on is a row saying so, never a skip.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fuse_cli  # noqa: E402

TARGETS = {"ort-cpu": dict(target="ort-cpu"), "opset23": dict(target="onnx", upgrade_opset=23)}
FUSED_KINDS = ("RotaryEmbedding", "GroupQueryAttention", "MultiHeadAttention", "Attention")
LEFT_KINDS = {"Softmax": "attention", "Neg": "rotary"}


def counts(model) -> Counter:
    """Operator kinds over the main graph (decoder steps have no subgraphs)."""
    return Counter(node.op_type for node in model.graph.node)


def fuse_one(path: Path, target: str) -> dict:
    started = time.perf_counter()
    row = {"graph": path.stem, "target": target}
    try:
        with fuse_cli.optimize(path, **TARGETS[target]) as result:
            after = counts(result.model)
            report = result.report
            row.update(
                nodes_before=report.nodes_before, nodes_after=report.nodes_after,
                fused={kind: after[kind] for kind in FUSED_KINDS if after[kind]},
                left={what: after[op] for op, what in LEFT_KINDS.items() if after[op]},
                verification=result.verification.status if result.verification else "off",
                peak_guard=[decline.pass_name for decline in report.peak_guard],
                rolled_back=[r.pass_name for r in report.rolled_back], exit_code=result.exit_code,
                why_left=_why_left(report) if any(after[op] for op in LEFT_KINDS) else "")
    except fuse_cli.FuseError as error:  # a failure is a row of the table
        row.update(error=f"{type(error).__name__}: {error}")
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _why_left(report) -> str:
    """fuse's own first reason for an attention or rotary it did not fuse (its "Not fused" table)."""
    reasons = [n for n in report.near_misses if "attention" in n.pass_name or "rotary" in n.pass_name]
    return f"{reasons[0].pass_name}: {reasons[0].reason}" if reasons else "no reason given"


def render(rows: list[dict], models: Path) -> str:
    complete = [r for r in rows if "error" not in r and not r["left"] and r["verification"] == "match"]
    lines = [
        "# Decoder corpus: every attention and rotary fused? (issue 32)", "",
        f"`benchmarks/decoder_fusions.py --models {models}`, {time.strftime('%Y-%m-%d')}; fuse {fuse_cli.__version__}, "
        "default flags (verification and the peak guard on). ort-cpu: `--target ort-cpu`; opset23: "
        "`--target onnx --upgrade-opset 23`. Left: Softmax (an attention) and Neg (a rotate_half) still in the "
        "written graph.", "",
        f"**{len(complete)} of {len(rows)} (graph, target) pairs: nothing left, verified `match`.**", "",
        *_reasons(rows),
        "| graph | target | nodes | fused | left | verification | peak guard left out | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['graph']} | {r['target']} | | | | {r['error']} | | {r['seconds']} |")
            continue
        fused = ", ".join(f"{k} {v}" for k, v in r["fused"].items()) or "-"
        left = ", ".join(f"{k} {v}" for k, v in r["left"].items()) or "-"
        lines.append(f"| {r['graph']} | {r['target']} | {r['nodes_before']} -> {r['nodes_after']} | {fused} | "
                     f"{left} | {r['verification']} | {', '.join(r['peak_guard']) or '-'} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def _reasons(rows: list[dict]) -> list[str]:
    """Why something is left, once per model and reason (the graph's family: its name up to the step)."""
    seen: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.get("why_left"):
            family = r["graph"].split("-prefill")[0].split("-decode")[0]
            seen[family, r["why_left"]] = seen.get((family, r["why_left"]), 0) + 1
    return [f"- {family} ({count} pairs): {why}" for (family, why), count in seen.items()] + ([""] if seen else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=REPO / "benchmarks/corpus/decoder-models")
    parser.add_argument("--only", default="", help="comma-separated substrings of file names")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/decoder_fusions.md")
    args = parser.parse_args()
    manifest = args.models / "manifest.json"
    if not manifest.exists():
        print(f"decoder_fusions: no corpus at {args.models} (make bench-corpus builds it)")
        return
    names = sorted(json.loads(manifest.read_text())["files"])
    wanted = [w for w in args.only.split(",") if w]
    names = [n for n in names if not wanted or any(w in n for w in wanted)]
    rows = []
    for name in names:
        for target in TARGETS:
            rows.append(fuse_one(args.models / name, target))
            r = rows[-1]
            print(f"{name} {target}: {r.get('error') or (r['fused'], r['left'], r['verification'], r['peak_guard'])}",
                  flush=True)
    args.out.write_text(render(rows, args.models))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
