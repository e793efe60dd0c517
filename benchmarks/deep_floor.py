"""What no tool built like fuse can go under on the deep stack, beside onnx-simplifier in one run.

    .venv/bin/python benchmarks/deep_floor.py [--blocks 245] [--rounds 3]

Issue 18 asked `fuse optimize --no-verify` to beat onnx-simplifier on big_models.py's 12k-node
transformer stack. Each round times, in turn:
- onnx-simplifier (load, simplify, save);
- graphsurgeon's bare round trip (load, import, cleanup, toposort, export, save), which fuse
  keeps as its rewriting engine (the design card's);
- one sweep of every pattern pass's matcher over the graph, nothing checked or rewritten;
- the four shape inferences the peak guard cannot do without: the original unbound, at the
  bound dims and at the larger setting, and the candidate unbound.
The sum of the medians of the last three is a floor for fuse's time with those parts, before it
loads, checks, rewrites, estimates memory or writes anything.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_models import REPO, build_deep_stack  # noqa: E402

from fuse_cli.analysis.shapes import infer_shapes  # noqa: E402
from fuse_cli.graph.edit import toposort  # noqa: E402
from fuse_cli.graph.io import load_graph, load_model  # noqa: E402
from fuse_cli.match import match_root, root_op_types  # noqa: E402
from fuse_cli.passes import resolve  # noqa: E402
from fuse_cli.pipeline.base import PatternPass  # noqa: E402


def one_round(path: Path, candidate: Path, scratch: Path) -> dict[str, float]:
    import onnxsim

    times = {}
    start = time.perf_counter()
    onnx.save(onnxsim.simplify(onnx.load(str(path)))[0], str(scratch / "simplified.onnx"))
    times["onnx-simplifier"] = time.perf_counter() - start

    start = time.perf_counter()
    graph = gs.import_onnx(onnx.load(str(path)))
    graph.cleanup().toposort()
    onnx.save(gs.export_onnx(graph), str(scratch / "round_trip.onnx"))
    times["graphsurgeon round trip"] = time.perf_counter() - start

    loaded = load_model(path)
    graph = load_graph(loaded)
    toposort(graph)
    patterns = [p.pattern for p in resolve("onnx", None, ()) if isinstance(p, PatternPass)]
    start = time.perf_counter()
    for pattern in patterns:
        roots = root_op_types(pattern)
        for node in reversed(list(graph.nodes)):
            if node.op in roots:
                next(match_root(pattern, node), None)
    times["one matcher sweep"] = time.perf_counter() - start

    fused = onnx.load(str(candidate), load_external_data=False)
    start = time.perf_counter()
    infer_shapes(loaded.model)
    infer_shapes(loaded.model, {"batch": 1, "sequence": 1})
    infer_shapes(loaded.model, {"batch": 64, "sequence": 64})
    infer_shapes(fused)
    times["four shape inferences"] = time.perf_counter() - start
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=245)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuse-floor-") as folder:
        scratch = Path(folder)
        path, candidate = scratch / "deep_stack.onnx", scratch / "deep_stack.fused.onnx"
        onnx.save(build_deep_stack(args.blocks), str(path))
        subprocess.run([sys.executable, "-m", "fuse_cli", "optimize", str(path), "-o", str(candidate), "--no-verify"],
                       cwd=REPO, check=True, capture_output=True)
        rounds = [one_round(path, candidate, scratch) for _ in range(args.rounds)]
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    for name, seconds in medians.items():
        print(f"  {name:<26} {seconds:6.3f} s")
    floor = sum(seconds for name, seconds in medians.items() if name != "onnx-simplifier")
    print(f"  floor (the last three)     {floor:6.3f} s = {floor / medians['onnx-simplifier']:.2f}x onnx-simplifier "
          f"(medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
