"""Weights held by reference (graph/weights.py): the same output whether the input's weights were
embedded or external, written atomically and where the input had them, the input untouched, and
an embedded model optimized without a second copy of its weights in memory."""

from __future__ import annotations

import hashlib
import tracemalloc

import numpy as np
import onnx
import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.graph import weights
from fuse_cli.graph.io import read_original
from tests.conftest import assert_equivalent, benchmark_script


memory_models = benchmark_script("memory_models")
# 96 channels: each conv weight is 332 KiB, over weights.BIG_WEIGHT_BYTES, so it is held by reference
CHANNELS = 96


@pytest.fixture
def conv_models(tmp_path):
    """The same Conv+BN stack twice: weights embedded, and in external data."""
    embedded = tmp_path / "embedded" / "stack.onnx"
    external = tmp_path / "external" / "stack.onnx"
    embedded.parent.mkdir()
    external.parent.mkdir()
    memory_models.write_conv_bn_stack(embedded, layers=3, channels=CHANNELS)
    memory_models.to_external_data(embedded, external)
    return embedded, external


def _files(path):
    return [path, path.with_name(path.name + ".data")]


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _initializers(path):
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_the_output_is_the_same_whether_the_weights_were_embedded_or_external(conv_models):
    embedded, external = conv_models
    outputs = []
    for source in (embedded, external):
        out = source.with_name("out.onnx")
        report = api.optimize(source, FuseConfig(), out).report
        assert report.verification.passed and report.fusions
        outputs.append(out)
    a, b = (onnx.load(str(p), load_external_data=False) for p in outputs)
    assert [(n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in b.graph.node]
    folded_a, folded_b = _initializers(outputs[0]), _initializers(outputs[1])
    assert folded_a.keys() == folded_b.keys()
    for name, values in folded_a.items():
        np.testing.assert_array_equal(values, folded_b[name])
    # embedded in, embedded out; external in, external out
    assert not memory_models.uses_external_data(outputs[0]) and not _files(outputs[0])[1].exists()
    assert memory_models.uses_external_data(outputs[1])
    assert_equivalent(onnx.load(str(embedded)), onnx.load(str(outputs[0])), dims={"batch": 2})


def test_external_data_is_written_beside_the_output_atomically_and_the_input_is_untouched(conv_models, tmp_path):
    _, source = conv_models
    before = _digests(source.parent)
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    out = out_folder / "fused.onnx"

    result = api.optimize(source, FuseConfig(), out)

    assert result.report.written_files == (str(out), str(out) + ".data")
    assert sorted(p.name for p in out_folder.iterdir()) == ["fused.onnx", "fused.onnx.data"]  # no temp files left
    locations = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {"fused.onnx.data"}
    assert _digests(source.parent) == before
    onnx.checker.check_model(str(out))


def test_an_embedded_input_is_read_in_place_and_left_untouched(conv_models):
    embedded, _ = conv_models
    before = hashlib.sha256(embedded.read_bytes()).hexdigest()
    model = read_original(embedded)  # weights.read_model, references made absolute
    held = [t for t in model.graph.initializer if weights.reference(t) is not None]
    assert {t.name for t in held} == {f"block{i}.conv.weight" for i in range(3)}
    whole = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(embedded)).graph.initializer}
    weights.read_in(model)
    for tensor in model.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), whole[tensor.name])

    result = api.optimize(embedded, FuseConfig(), embedded.with_name("out.onnx"))

    assert result.report.verification.passed
    assert hashlib.sha256(embedded.read_bytes()).hexdigest() == before


def test_the_returned_model_is_whole_and_its_weights_are_the_written_ones(conv_models):
    embedded, _ = conv_models
    out = embedded.with_name("out.onnx")
    result = api.optimize(embedded, FuseConfig(), out)
    held = [weights.reference(t) for t in result.model_by_reference.graph.initializer]
    # the folded weights, made in the run's scratch folder, now read from the output
    assert {file for file, _, _ in filter(None, held)} == {out.resolve()}
    model = result.model
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    written = _initializers(out)
    for tensor in model.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), written[tensor.name])


def test_an_embedded_model_is_optimized_without_a_second_copy_of_its_weights(tmp_path):
    """Every conv weight is rewritten (the BN fold) and the input's are embedded: before weights
    were held by reference, the whole model and its folded weights were in memory at once. Now a
    pass's new weight goes to the parking lot as it is made, so the largest allocation alive at
    any time is a few weights. tracemalloc sees numpy and Python, not onnxruntime's own memory."""
    path = tmp_path / "stack.onnx"
    memory_models.write_conv_bn_stack(path, layers=24, channels=256)  # 2.4 MB a weight, 57 MB in all
    weight_bytes = sum(t.ByteSize() for t in onnx.load(str(path)).graph.initializer)
    tracemalloc.start()
    try:
        report = api.optimize(path, FuseConfig(), tmp_path / "out.onnx").report
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.verification.passed and len(report.fusions) == 24
    # measured 0.19x (a weight and its float64 fold at a time); holding every folded weight is 1x
    assert peak < 0.5 * weight_bytes, f"peak traced {peak / 1e6:.1f} MB for {weight_bytes / 1e6:.1f} MB of weights"


def test_a_model_fuse_wrote_inline_is_read_back_by_reference(conv_models, tmp_path):
    """graph/io.py's streamed writer stores the graph in several records (one per weight): read_model
    cuts each, so optimizing fuse's own output does not parse every weight into memory."""
    embedded, _ = conv_models
    out = tmp_path / "out.onnx"
    api.optimize(embedded, FuseConfig(verify=False), out)
    model = weights.read_model(out)
    held = [t for t in model.graph.initializer if weights.reference(t) is not None]
    assert held and all(weights.reference(t)[0].name == out.name for t in held)
    assert_equivalent(onnx.load(str(out)), read_original(out), dims={"batch": 2})
