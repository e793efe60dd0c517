"""Does every attention and rotary embedding of the decoder corpus fuse? Issue 32's LLM table.

    .venv/bin/python benchmarks/decoder_fusions.py [--models DIR] [--only SUBSTRING,...]
                                                   [--out benchmarks/results/decoder_fusions.md]
    .venv/bin/python benchmarks/decoder_fusions.py --models FP16_DIR --baseline FP32_DIR
                                                   [--out benchmarks/results/decoder_fusions_fp16.md]
                                                   [--render decoder_fusions_fp16.json]

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

With `--baseline`, DIR holds the float16 copies (`decoders.py --dtype float16`) and the baseline
folder their float32 originals under the same file names: both are fused in the same run and the
table puts each graph's float32 and float16 results side by side (issue 32: fp16 copies fuse what
their fp32 copies fuse), with the norms and GELUs fused beside the attentions. A graph whose float16
export failed is a row with the exporter's error (a skip, counted).
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

import numpy as np  # noqa: E402

import fuse_cli  # noqa: E402
from fuse_cli import targets  # noqa: E402

TARGETS = {"ort-cpu": dict(target="ort-cpu"), "opset23": dict(target="onnx", upgrade_opset=23)}
FUSED_KINDS = ("RotaryEmbedding", "GroupQueryAttention", "MultiHeadAttention", "Attention")
# also counted beside the float32 baseline: a Cast-wrapped float16 norm or GELU left unfused shows
NORM_KINDS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
              "LayerNormalization", "SkipLayerNormalization", "Gelu", "FastGelu")
LEFT_KINDS = {"Softmax": "attention", "Neg": "rotary"}


def counts(model) -> Counter:
    """Operator kinds over the main graph (decoder steps have no subgraphs)."""
    return Counter(node.op_type for node in model.graph.node)


def fuse_one(path: Path, target: str, kinds: tuple[str, ...] = FUSED_KINDS) -> dict:
    started = time.perf_counter()
    row = {"graph": path.stem, "target": target}
    try:
        with fuse_cli.optimize(path, **TARGETS[target]) as result:
            after = counts(result.model)
            report = result.report
            row.update(
                nodes_before=report.nodes_before, nodes_after=report.nodes_after,
                fused={kind: after[kind] for kind in kinds if after[kind]},
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
    """fuse's own first reason for an attention or rotary it did not fuse: a rollback by
    verification, else its "Not fused" table."""
    rolled = [r for r in report.rolled_back if "attention" in r.pass_name or "rotary" in r.pass_name]
    if rolled:
        return (f"{rolled[0].pass_name}: rolled back by verification ({rolled[0].output!r} off by "
                f"{rolled[0].max_abs_diff:.3g})")
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


def render_side_by_side(pairs: list[tuple[dict, dict]], models: Path, baseline: Path, skipped: dict) -> str:
    """fp32 beside fp16 per (graph, target); `skipped`: file -> why its float16 export failed."""
    same = [fp16 for fp32, fp16 in pairs if _fuses_as_much(fp32, fp16)]
    gaps = [fp16 for fp32, fp16 in pairs if not _fuses_as_much(fp32, fp16) and _kernel_gaps(fp32, fp16)]
    lines = [
        "# Decoder corpus in float16: fp16 copies fuse what their fp32 copies fuse? (issue 32)", "",
        f"`benchmarks/decoder_fusions.py --models {models} --baseline {baseline}`, {time.strftime('%Y-%m-%d')}; "
        f"fuse {fuse_cli.__version__}, one run, default flags (verification and the peak guard on). ort-cpu: "
        "`--target ort-cpu`; opset23: `--target onnx --upgrade-opset 23`. fused: the fused operators in the "
        "written graph (attention, rotary, norms, GELU); left: Softmax (an attention) and Neg (a rotate_half) "
        "still there; as fp32: fp16 has at least fp32's count of every fused kind and no more left.", "",
        f"**{len(same)} of {len(pairs)} (graph, target) pairs: the fp16 copy fuses what its fp32 copy fuses; "
        f"{len(skipped)} float16 exports failed (skipped). {len(gaps)} more at ort-cpu, where what the fp16 copy "
        "lacks is an operator whose function body onnxruntime's CPU provider runs at float16, the nodes it would "
        "replace (fuse's operator table; the `as fp32` column names them).**", "",
        "Nothing left (no Softmax, no Neg) and verified `match`: " + ", ".join(
            f"{dtype} {sum(_complete(pair[i]) for pair in pairs)} of {len(pairs)}"
            for i, dtype in enumerate(("fp32", "fp16")))
        + ". Why something is left in the fp16 copies (fuse's own first reason, once per model and reason):", "",
        *[f"- skipped {file}: {why}" for file, why in sorted(skipped.items())], *([""] if skipped else []),
        *_reasons([fp16 for fp32, fp16 in pairs]),
        "| graph | target | fused fp32 | fused fp16 | left fp32 | left fp16 | verification fp32 / fp16 | "
        "fp16 left out (peak guard; rolled back) | as fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fp32, fp16 in pairs:
        cells = [_cells(fp32), _cells(fp16)]
        dropped = ", ".join(fp16.get("peak_guard", [])) or "-"
        rolled = ", ".join(fp16.get("rolled_back", [])) or "-"
        verdict = ("yes" if _fuses_as_much(fp32, fp16) else
                   f"float16 body on the CPU: {', '.join(gaps)}" if (gaps := _kernel_gaps(fp32, fp16)) else "**no**")
        lines.append(f"| {fp16['graph']} | {fp16['target']} | {cells[0][0]} | {cells[1][0]} | {cells[0][1]} | "
                     f"{cells[1][1]} | {cells[0][2]} / {cells[1][2]} | {dropped}; {rolled} | {verdict} |")
    return "\n".join(lines) + "\n"


def _complete(row: dict) -> bool:
    return "error" not in row and not row["left"] and row["verification"] == "match"


def _cells(row: dict) -> tuple[str, str, str]:
    if "error" in row:
        return "-", "-", row["error"]
    return (", ".join(f"{k} {v}" for k, v in row["fused"].items()) or "-",
            ", ".join(f"{k} {v}" for k, v in row["left"].items()) or "-", row["verification"])


def _fuses_as_much(fp32: dict, fp16: dict) -> bool:
    if "error" in fp16 or "error" in fp32:
        return "error" in fp32
    return (all(fp16["fused"].get(kind, 0) >= count for kind, count in fp32["fused"].items())
            and all(fp16["left"].get(what, 0) <= fp32["left"].get(what, 0) for what in fp16["left"])
            and (fp16["verification"] == "match" or fp32["verification"] != "match"))


def _kernel_gaps(fp32: dict, fp16: dict) -> list[str]:
    """At ort-cpu, the fused kinds the fp16 copy has fewer of, where each is an onnxruntime operator
    the CPU provider cannot run at float16 even where the nodes it replaces ran in float32 (its
    function body runs instead: Gelu, FastGelu, QuickGelu); an empty list where any other kind is short."""
    if fp16["target"] != "ort-cpu" or "error" in fp16 or "error" in fp32:
        return []
    short = [kind for kind, count in fp32["fused"].items() if fp16["fused"].get(kind, 0) < count]
    gaps = [kind for kind in short if "no float16 kernel" in (
        targets.emit_reason("ort-cpu", kind, np.float16, replaced_in_float32=True) or "")]
    return gaps if gaps == short else []


def compare_dtypes(names: list[str], models: Path, baseline: Path, manifest: dict) -> tuple[list, dict]:
    """Each graph's fp32 and fp16 rows at each target; float16 exports that failed, with their error."""
    pairs, skipped = [], {}
    kinds = FUSED_KINDS + NORM_KINDS
    for name in names:
        record = manifest["files"][name]
        if record.get("status") != "exported":
            skipped[name] = record.get("error", record.get("status", "not exported")).splitlines()[0][:300]
            continue
        for target in TARGETS:
            pair = (fuse_one(baseline / name, target, kinds), fuse_one(models / name, target, kinds))
            pairs.append(pair)
            print(f"{name} {target}: " + " | ".join(
                str(r.get("error") or (r["fused"], r["left"], r["verification"], r["peak_guard"], r["rolled_back"]))
                for r in pair), flush=True)
    return pairs, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=REPO / "benchmarks/corpus/decoder-models")
    parser.add_argument("--only", default="", help="comma-separated substrings of file names")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="the float32 corpus whose graphs --models holds in float16 (same file names): "
                             "one table, fp32 beside fp16")
    parser.add_argument("--out", type=Path, default=None,
                        help="default benchmarks/results/decoder_fusions.md (with --baseline: decoder_fusions_fp16.md)")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="with --baseline: write the table from the JSON a run wrote, without fusing again")
    args = parser.parse_args()
    args.out = args.out or REPO / "benchmarks/results" / (
        "decoder_fusions_fp16.md" if args.baseline else "decoder_fusions.md")
    if args.render and not args.baseline:
        parser.error("--render renders the side-by-side table: give --baseline too")
    if args.render:
        run = json.loads(args.render.read_text())
        args.out.write_text(render_side_by_side(run["pairs"], args.models, args.baseline, run["skipped"]))
        print(f"wrote {args.out}")
        return
    manifest = args.models / "manifest.json"
    if not manifest.exists():
        print(f"decoder_fusions: no corpus at {args.models} (make bench-corpus builds it)")
        return
    records = json.loads(manifest.read_text())
    names = sorted(records["files"])
    wanted = [w for w in args.only.split(",") if w]
    names = [n for n in names if not wanted or any(w in n for w in wanted)]
    if args.baseline:
        pairs, skipped = compare_dtypes(names, args.models, args.baseline, records)
        args.out.write_text(render_side_by_side(pairs, args.models, args.baseline, skipped))
        args.out.with_suffix(".json").write_text(json.dumps({"pairs": pairs, "skipped": skipped}, indent=1))
        print(f"wrote {args.out}")
        return
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
