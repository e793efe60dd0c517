"""CPU time of candidate models against the original at onnxruntime's default level (ORT_ENABLE_ALL),
or with its graph optimizations off (`--level disabled`), or both.

    .venv/bin/python benchmarks/level_all_ab.py ORIGINAL.onnx CANDIDATE.onnx [...] [--repeats 3]
                                                [--rounds 40] [--dim batch=1] [--level all|disabled|both]

One intra-op thread, CPU provider, the calling thread's CPU time; sessions alternate round by round
(bench.time_sessions). A second session of the original is timed as a candidate too: its ratio is
the noise floor of that repeat. Each repeat builds fresh sessions. Prints one line per repeat:
candidate ratios (median CPU time over the original's) and the noise floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli.bench import Timing, feeds_for, make_session, random_inputs_for, time_sessions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("original", type=Path)
    parser.add_argument("candidates", type=Path, nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--dim", action="append", default=[], help="NAME=VALUE for a symbolic input dim")
    parser.add_argument("--level", choices=("all", "disabled", "both"), default="all")
    args = parser.parse_args()
    for level in ("disabled", "all") if args.level == "both" else (args.level,):
        if args.level == "both":
            print(f"level {level}:", flush=True)
        _repeats(args, level)


def _repeats(args: argparse.Namespace, level: str) -> None:
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    timing = Timing(min_samples=args.rounds, max_samples=args.rounds, min_seconds=0.0, sample_seconds=0.01)
    for repeat in range(args.repeats):
        paths = {"original": args.original, "noise": args.original} | {str(p): p for p in args.candidates}
        sessions = {name: make_session(str(path), level=level) for name, path in paths.items()}
        feeds = random_inputs_for(sessions["original"], dims=dims, seed=0)
        latencies = time_sessions(sessions, {n: feeds_for(s, feeds, dims=dims) for n, s in sessions.items()}, timing)
        base = latencies["original"].cpu_median_ms
        ratios = "  ".join(f"{Path(n).name} {latencies[n].cpu_median_ms / base:.3f}" for n in paths if n != "original")
        print(f"repeat {repeat + 1}: original {base:.2f} ms  {ratios}", flush=True)


if __name__ == "__main__":
    main()
