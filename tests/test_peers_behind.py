"""benchmarks/peers_behind.py: what counts as behind a peer or the original."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import peers_behind  # noqa: E402

MIB = 1 << 20


def model(fuse: dict, sim: dict, noise=(1.0, 1.0)) -> dict:
    base = {"nodes": 10, "cpu_ratio_disabled": 1.0, "cpu_ratio_all": 1.0, "peak_bytes": 10 * MIB}
    return {"name": "m", "nodes": 20, "peak_bytes": 20 * MIB, "error": None, "results": [
        {"tool": "noise-floor", "cpu_ratio_disabled": noise[0], "cpu_ratio_all": noise[1]},
        {"tool": "fuse-onnx", **base, **fuse},
        {"tool": "onnxsim", **base, **sim},
    ]}


def flags(m: dict) -> list[str]:
    return peers_behind.behind(m, "fuse-onnx", ["onnxsim"])[0]


def test_equal_is_not_behind():
    assert flags(model({}, {})) == []


def test_latency_counts_only_beyond_the_models_noise():
    assert flags(model({"cpu_ratio_all": 1.015}, {})) == []  # inside the 2% floor
    assert flags(model({"cpu_ratio_all": 1.03}, {})) == ["all 1.030 vs the original", "all 1.030 vs onnxsim 1.000"]
    # a noisy model (its second session 5% off) widens the band
    assert flags(model({"cpu_ratio_all": 1.03}, {}, noise=(1.0, 0.95))) == []


def test_nodes_and_peak():
    assert flags(model({"nodes": 11}, {})) == ["nodes 11 vs onnxsim 10"]
    # 2% and 256 KiB above the peer's: both needed
    assert flags(model({"peak_bytes": 10 * MIB + 300 * 1024}, {})) == ["peak 10.3 vs onnxsim 10.0 MiB"]
    assert flags(model({"peak_bytes": 10 * MIB + 200 * 1024}, {})) == []
    assert flags(model({"peak_bytes": 1 * MIB + 200 * 1024}, {"peak_bytes": 1 * MIB})) == []


def test_table_counts_flagged_models():
    run = {"models": [model({}, {}), model({"nodes": 12}, {})]}
    text, flagged = peers_behind.table(run, "fuse-onnx", ["onnxsim"])
    assert flagged == 1 and text.count("\n") == 3 and "nodes 12 vs onnxsim 10" in text
