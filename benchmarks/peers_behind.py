"""Where fuse is behind a peer or the original, from one `benchmarks/run.py` JSON: a markdown table.

    .venv/bin/python benchmarks/peers_behind.py RUN.json [--fuse fuse-onnx] [--peers onnxslim,onnxsim]

One row per model: nodes, CPU time over the original at onnxruntime's two levels, the noise floor
(the original's second session over its first), measured peak, and what is behind. fuse is behind
a peer where it has more nodes; where its CPU ratio is above the peer's by more than the model's
noise (max(2%, |noise - 1|) at that level); where its measured peak is above the peer's by more
than 2% and 256 KiB (the allocator's rounding on small models); and behind the original where its
CPU ratio is above 1 by more than the noise. The reasons for the rows it flags are written by hand
beside the table (peers_exceptions.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LEVELS = ("disabled", "all")
MIN_NOISE = 0.02
PEAK_SLACK, PEAK_SLACK_BYTES = 0.02, 256 << 10


def behind(model: dict, fuse: str, peers: list[str]) -> tuple[list[str], dict]:
    """What fuse is behind on this model, and the figures of its row."""
    results = {r["tool"]: r for r in model["results"]}
    ours, noise = results.get(fuse), results.get("noise-floor")
    if ours is None or ours.get("error"):
        return [f"{fuse}: {ours.get('error') if ours else 'no result'}"], results
    flags = []
    for level in LEVELS:
        key = f"cpu_ratio_{level}"
        margin = max(MIN_NOISE, abs((noise or {}).get(key, 1.0) - 1.0))
        mine = ours.get(key)
        if mine is None:
            continue
        if mine > 1 + margin:
            flags.append(f"{level} {mine:.3f} vs the original")
        for peer in peers:
            theirs = (results.get(peer) or {}).get(key)
            if theirs is not None and mine > theirs + margin:
                flags.append(f"{level} {mine:.3f} vs {peer} {theirs:.3f}")
    for peer in peers:
        other = results.get(peer) or {}
        if other.get("nodes") is not None and ours["nodes"] > other["nodes"]:
            flags.append(f"nodes {ours['nodes']} vs {peer} {other['nodes']}")
        mine, theirs = ours.get("peak_bytes"), other.get("peak_bytes")
        if mine and theirs and mine > theirs * (1 + PEAK_SLACK) and mine - theirs > PEAK_SLACK_BYTES:
            flags.append(f"peak {mine / 2**20:.1f} vs {peer} {theirs / 2**20:.1f} MiB")
    return flags, results


def table(run: dict, fuse: str, peers: list[str]) -> tuple[str, int]:
    tools = [fuse, *peers]
    short = {"onnxslim": "slim", "onnxsim": "sim"}
    names = " / ".join(short.get(t, "fuse" if t == fuse else t) for t in tools)
    lines = [f"| model | nodes orig / {names} | CPU disabled {names} | CPU all {names} | noise dis / all "
             f"| peak MiB orig / {names} | behind |", "|---|---|---|---|---|---|---|"]
    flagged = 0

    def cell(results: dict, tool: str, key: str, scale: float = 1.0, digits: int = 3) -> str:
        value = (results.get(tool) or {}).get(key)
        return "-" if value is None else f"{value / scale:.{digits}f}"

    for model in run["models"]:
        if model.get("error"):
            lines.append(f"| {model['name']} | {model['error']} | | | | | |")
            continue
        flags, results = behind(model, fuse, peers)
        flagged += bool(flags)
        nodes = " / ".join(str((results.get(t) or {}).get("nodes", "-")) for t in tools)
        cpu = [" / ".join(cell(results, t, f"cpu_ratio_{level}") for t in tools) for level in LEVELS]
        noise = " / ".join(cell(results, "noise-floor", f"cpu_ratio_{level}") for level in LEVELS)
        peak = " / ".join([f"{model['peak_bytes'] / 2**20:.1f}" if model.get("peak_bytes") else "-",
                           *(cell(results, t, "peak_bytes", 2**20, 1) for t in tools)])
        lines.append(f"| {model['name']} | {model['nodes']} / {nodes} | {cpu[0]} | {cpu[1]} | {noise} | {peak} "
                     f"| {'; '.join(flags) or '-'} |")
    return "\n".join(lines), flagged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--fuse", default="fuse-onnx")
    parser.add_argument("--peers", default="onnxslim,onnxsim")
    args = parser.parse_args(argv)
    run = json.loads(args.run.read_text(encoding="utf-8"))
    text, flagged = table(run, args.fuse, args.peers.split(","))
    print(text)
    print(f"\n{flagged} of {len(run['models'])} models with something behind.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
