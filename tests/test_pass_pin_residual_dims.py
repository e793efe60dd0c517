"""pin-residual-dims: a residual Add's operand declared with fresh dims, so that onnxruntime's
level-2 optimizer does not make its slower CPU SkipLayerNormalization; nothing computed changes."""

from __future__ import annotations

import collections

import onnx

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.passes import pipeline_for
from fuse_cli.pipeline.base import never_higher
from tests.conftest import SAMPLES, assert_equivalent, saved_by_onnxruntime
from tests.graphs import GraphBuilder

PASS = "pin-residual-dims"


def _skip_norms(model: onnx.ModelProto, tmp_path) -> int:
    saved = saved_by_onnxruntime(model, tmp_path, "all")
    return collections.Counter(n.op_type for n in saved.graph.node)["SkipLayerNormalization"]


def _optimized(source, tmp_path, name: str, **config) -> tuple[onnx.ModelProto, api.OptimizeResult]:
    out = tmp_path / f"{name}.onnx"
    result = api.optimize(source, FuseConfig(verify=False, **config), out)
    return onnx.load(out), result


def test_onnxruntime_makes_no_skip_layer_norm_of_the_output(tmp_path):
    source = SAMPLES / "transformer_block_opset17.onnx"
    pinned, result = _optimized(source, tmp_path, "pinned", target="ort-cpu")
    unpinned, _ = _optimized(source, tmp_path, "unpinned", target="ort-cpu", disable=(PASS,))
    assert [f.pass_name for f in result.report.fusions].count(PASS) >= 1
    assert _skip_norms(unpinned, tmp_path) > 0 and _skip_norms(pinned, tmp_path) == 0
    # the same nodes; only declarations differ, each with fresh dims
    assert [(n.op_type, list(n.input), list(n.output)) for n in pinned.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in unpinned.graph.node]
    fresh = [v for v in pinned.graph.value_info if any(d.dim_param.startswith("unfused_")
                                                        for d in v.type.tensor_type.shape.dim)]
    assert fresh and all(v.name not in {i.name for i in pinned.graph.input} for v in fresh)
    original = onnx.load(source)
    assert_equivalent(original, pinned, dims={"batch": 2, "sequence": 7})
    assert_equivalent(original, pinned, dims={"batch": 5, "sequence": 3}, seeds=(3,))


def test_on_the_cpu_target_only(tmp_path):
    _, result = _optimized(SAMPLES / "transformer_block_opset17.onnx", tmp_path, "cuda", target="ort-cuda")
    assert PASS not in {f.pass_name for f in result.report.fusions}
    assert PASS not in pipeline_for("ort-cuda") and PASS not in pipeline_for("ort")
    assert PASS in pipeline_for("ort-cpu")


def _residual_block(shape, pre_norm: bool = False) -> onnx.ModelProto:
    """x + x @ W (perturbed) -> LayerNormalization; pre_norm: the sum read by the next residual too."""
    b = GraphBuilder(opset=17, seed=3)
    x = b.input("x", shape)
    s = b.op("Add", b.op("MatMul", x, b.const(b.rand(16, 16))), x)
    y = b.op("LayerNormalization", s, b.const(b.rand(16, low=0.5, high=1.5)), b.const(b.rand(16)), axis=-1)
    if pre_norm:
        y = b.op("Add", y, s)
    return b.build(y, output_names=["y"])


def test_a_symbolic_residual_is_pinned_and_a_static_one_cannot_be(tmp_path):
    """Dims with names are renamed; dims onnxruntime infers as values cannot be (it fuses them)."""
    for shape, pins in ((["batch", "sequence", 16], True), ([2, 8, 16], False)):
        model = _residual_block(shape)
        path = tmp_path / f"m{pins}.onnx"
        onnx.save(model, path)
        pinned, result = _optimized(path, tmp_path, f"m{pins}.out", target="ort-cpu")
        assert (PASS in {f.pass_name for f in result.report.fusions}) is pins
        assert (_skip_norms(pinned, tmp_path) == 0) is pins
        assert_equivalent(model, pinned, dims={"batch": 3, "sequence": 5} if pins else None)


def test_a_sum_read_twice_is_not_onnxruntimes_pattern(tmp_path):
    """A pre-norm residual's sum is read by the next residual too: onnxruntime's fusion takes an Add
    with one reader only, and nothing is declared."""
    model = _residual_block(["batch", "sequence", 16], pre_norm=True)
    path = tmp_path / "pre_norm.onnx"
    onnx.save(model, path)
    pinned, result = _optimized(path, tmp_path, "pre_norm.out", target="ort-cpu")
    assert PASS not in {f.pass_name for f in result.report.fusions}
    assert _skip_norms(pinned, tmp_path) == 0


def test_the_bar_is_never_higher_anywhere():
    before = {"onnxruntime": (100, 200), "stored": (100,)}
    assert never_higher(before, {"onnxruntime": (100, 200), "stored": (99,)})
    assert not never_higher(before, {"onnxruntime": (90, 201), "stored": (90,)})
    assert never_higher(before, before)


def _post_norm_layers(layers: int) -> onnx.ModelProto:
    """x -> (h + h @ W_l) -> LayerNormalization, `layers` times: each residual's other operand is the
    previous layer's output, which its branch reads too."""
    b = GraphBuilder(opset=17, seed=11)
    h = b.input("x", ["batch", "sequence", 16])
    for _ in range(layers):
        branch = b.op("Add", b.op("MatMul", h, b.const(b.rand(16, 16))), b.const(b.rand(16)))
        h = b.op("LayerNormalization", b.op("Add", branch, h), b.const(b.rand(16, low=0.5, high=1.5)),
                 b.const(b.rand(16)), axis=-1)
    return b.build(h, output_names=["y"])


def test_every_layer_of_a_post_norm_stack_is_told_apart(tmp_path):
    """Renaming the previous layer's output would rename the branch too (onnxruntime carries the
    name down it): the operands stay alike and the fusion stays. The branch is renamed, and the sum
    declared with its own dims, so that the names after it are as before."""
    from fuse_cli.toolkit.residual_norms import fused_by_onnxruntime

    model = _post_norm_layers(4)
    path = tmp_path / "stack.onnx"
    onnx.save(model, path)
    unpinned, _ = _optimized(path, tmp_path, "stack.unpinned", target="ort-cpu", disable=(PASS,))
    pinned, result = _optimized(path, tmp_path, "stack.pinned", target="ort-cpu")
    assert _skip_norms(unpinned, tmp_path) == len(fused_by_onnxruntime(unpinned)) == 4
    assert _skip_norms(pinned, tmp_path) == len(fused_by_onnxruntime(pinned)) == 0
    assert [f.pass_name for f in result.report.fusions].count(PASS) >= 1
    assert result.report.memory.after.peak_bytes <= _optimized(
        path, tmp_path, "stack.again", target="ort-cpu", disable=(PASS,))[1].report.memory.after.peak_bytes
    assert_equivalent(model, pinned, dims={"batch": 2, "sequence": 7})
    assert_equivalent(model, pinned, dims={"batch": 3, "sequence": 5}, seeds=(4,))


def test_a_constant_operand_is_onnxruntimes_pattern_too(tmp_path):
    """A static residual whose other operand is a weight: onnxruntime fuses it (nothing to rename
    there), and the report says to run the output at basic or disabled."""
    from fuse_cli.toolkit.residual_norms import fused_by_onnxruntime

    b = GraphBuilder(opset=17, seed=5)
    x = b.input("x", [1, 8, 16])
    s = b.op("Add", b.op("Relu", x), b.const(b.rand(1, 8, 16)))
    y = b.op("LayerNormalization", s, b.const(b.rand(16, low=0.5, high=1.5)), b.const(b.rand(16)), axis=-1)
    path = tmp_path / "const.onnx"
    onnx.save(b.build(y, output_names=["y"]), path)
    out, result = _optimized(path, tmp_path, "const.out", target="ort-cpu")
    assert _skip_norms(out, tmp_path) == len(fused_by_onnxruntime(out)) == 1
    assert any("basic or disabled" in note for note in result.report.notes)
