"""The big-model benchmark's models at small sizes: a deep stack optimizes correctly, and weights
kept in external data (loaded lazily) are carried to the output without being read. Timing and
peak memory live in benchmarks/big_models.py, not here (machines are noisy)."""

from __future__ import annotations


import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.graph import io
from tests.conftest import assert_equivalent, benchmark_script
from tests.graphs import op_counts

pytestmark = pytest.mark.slow


big_models = benchmark_script("big_models")


def test_a_deep_stack_fuses_every_block(tmp_path):
    blocks = 41  # 2,009 nodes
    model = big_models.build_deep_stack(blocks)
    assert len(model.graph.node) == blocks * big_models.NODES_PER_BLOCK
    onnx.save(model, tmp_path / "deep.onnx")

    result = api.optimize(tmp_path / "deep.onnx", FuseConfig(), tmp_path / "deep.fused.onnx")

    assert result.report.verification is not None and result.report.verification.passed
    counts = op_counts(onnx.load(tmp_path / "deep.fused.onnx"))
    assert counts["LayerNormalization"] == 2 * blocks
    assert counts.get("ReduceMean", 0) == 0  # GELU needs opset 20: its Erf form stays
    assert_equivalent(model, onnx.load(tmp_path / "deep.fused.onnx"), dims={"batch": 2, "sequence": 3})


def _reads(monkeypatch) -> list[str]:
    """Names of the lazily loaded weights whose bytes were read into memory (not mapped)."""
    read: list[str] = []
    original = onnx.numpy_helper.to_array

    def spy(tensor, base_dir=""):
        if tensor.data_location == TensorProto.EXTERNAL:
            read.append(tensor.name)
        return original(tensor, base_dir)

    monkeypatch.setattr(onnx.numpy_helper, "to_array", spy)
    return read


@pytest.mark.parametrize("external_data", [True, None, False])
def test_weights_in_external_data_reach_the_output_unread(tmp_path, monkeypatch, external_data):
    """None (the default) keeps the weights where the user had them: in external data."""
    source = tmp_path / "big.onnx"
    big_models.write_big_model(source, weights=3, dim=256)  # 256 KiB weights
    reads = _reads(monkeypatch)

    out = tmp_path / "big.fused.onnx"
    result = api.optimize(source, FuseConfig(external_data=external_data), out)

    assert reads == []
    assert result.report.verification is not None and result.report.verification.passed
    assert big_models.uses_external_data(out) == (external_data is not False)
    if external_data is not False:
        assert result.report.written_files == (str(out), str(out) + ".data")
    fused = onnx.load(out)
    assert op_counts(fused)["LayerNormalization"] == 2
    original = onnx.load(source)
    assert_equivalent(original, fused)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in original.graph.initializer if t.name.startswith("w")}
    for tensor in fused.graph.initializer:
        if tensor.name in weights:
            np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), weights[tensor.name])


def test_a_lazily_loaded_weight_that_a_pass_reads_is_mapped_not_copied(tmp_path):
    source = tmp_path / "big.onnx"
    big_models.write_big_model(source, weights=1, dim=256)
    loaded = io.load_model(source)
    graph = io.load_graph(loaded)
    weight = graph.tensors()["w0"]
    assert isinstance(weight, gs.Constant)

    values = weight.values
    assert isinstance(values, np.memmap) and values.shape == (256, 256)
    io.unload_unchanged_weights(graph)
    exported = gs.export_onnx(graph, do_type_check=False)
    [tensor] = [t for t in exported.graph.initializer if t.name == "w0"]
    assert tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data


def test_a_short_external_data_file_is_refused_at_load_even_when_lazy(tmp_path):
    source = tmp_path / "big.onnx"
    big_models.write_big_model(source, weights=1, dim=256)
    data = tmp_path / "big.onnx.data"
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(io.ModelLoadError, match="cannot read external data"):
        io.load_model(source)


def test_the_benchmark_runs_at_small_sizes(tmp_path, capsys):
    code = big_models.main(["--blocks", "4", "--layers", "1", "--hidden", "64", "--ffn", "128", "--vocab", "256",
                            "--heads", "4", "--fp32", "--conv-layers", "2", "--channels", "8", "--no-peers",
                            "--keep", str(tmp_path)])
    out = capsys.readouterr().out
    assert "deep stack: 196 nodes" in out and "peak RSS" in out
    assert "decoder 1 x 64 fp16, external data" in out and "decoder 1 x 64 fp32, external data" in out
    assert code in (0, 1)  # whether small sizes meet the targets is not the point here
