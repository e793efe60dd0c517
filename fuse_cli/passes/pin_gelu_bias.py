"""The bias Add before an Erf GELU keeps its bias as a [1, N] row, which onnxruntime's CPU
BiasGelu fusion does not take."""

from __future__ import annotations


from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value, match_root
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.targets import slower
from fuse_cli.toolkit.activations import ERF_GATE, X, decomposed_gelu

# x's readers: the Erf GELU written out, the standard Gelu, onnxruntime's Gelu (contrib-gelu's output)
ERF_GELU = Alt(decomposed_gelu(ERF_GATE), Op("Gelu", X, name="gelu"),
               Op("Gelu", X, name="gelu", domain="com.microsoft"))


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Only a bias whose sum an Erf GELU reads, where the CPU may run the model (--target onnx
    included): other Adds, and every Add on ort-cuda, are not this pattern (silent)."""
    if g.target != "onnx" and slower(g.target, "BiasGelu") is None:
        return False
    x = m.node("add").outputs[0]
    near = [reader for child in x.outputs for reader in (child, *(n for t in child.outputs for n in t.outputs))]
    return any(gelu.tensor("x") is x and _exact_gelu(gelu) for node in near for gelu in match_root(ERF_GELU, node))


@register
class PinGeluBias(PatternPass):
    """input ── Add(bias [N]) ── GELU(erf)   =>   input ── Add(bias as [1, N]) ── GELU(erf)

    onnxruntime's level-all optimizer (its default) fuses Add + Gelu into BiasGelu wherever one
    Add operand is 1-D and both last dims are known (BiasGeluFusion in bias_gelu_fusion.cc), and
    its CPU kernel is slower than the pair (targets.SLOWER). The original graph often escapes it
    because its shapes are unknown to onnxruntime (Reshape to a Shape-computed target); fuse's
    constant shapes make them known and so brought the slower kernel in: BiasGelu 0 -> 12 at
    level all on a timm Swin-T, 0 -> 4 on two dynamo BERT/ViT exports (--target ort-cpu), 0 -> 12
    on DeiT-tiny with --allow-peak-growth (0.4-1.4% of its run there, near the noise floor;
    benchmarks/results/level_all.md).

    A [1, N] bias adds the same value to every row: exact (the same bits) when input has rank >= 2,
    the sum keeping input's shape. Runs last among the graph passes, after matmul-add has taken
    the rank-2 MatMul + Add into Gemm. Not on --target ort-cuda, whose BiasGelu is faster (the
    bias-gelu pass emits it there).
    """

    name = "pin-gelu-bias"
    description = "Keep a GELU's bias Add as a [1, N] row, so onnxruntime does not make its slower CPU BiasGelu"
    label = "Add (bias [N]) before an Erf GELU -> bias [1, N]"
    pattern = Op("Add", Var("input"), Const(lambda value: value.ndim == 1 and value.size > 1, name="bias"), name="add")

    requires = (Requirement(
        "Only a bias whose sum an Erf GELU reads, where the CPU may run the model (--target onnx included): "
        "other Adds, and every Add on ort-cuda, are not this pattern (silent).",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        add, shape = m.node("add"), g.shape(m.tensor("input"))
        if shape is None:
            return Decline(f"{add.name}: the rank of {m.tensor('input').name!r} is unknown, and a [1, N] bias "
                           "would raise a rank-1 sum to rank 2")
        if shape.rank < 2:
            return Decline(f"{add.name}'s input has rank {shape.rank}: a [1, N] bias would raise the sum to rank 2")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        add, bias = m.node("add"), m.tensor("bias")
        row = g.constant(f"{bias.name}_row", constant_value(bias).reshape(1, -1))
        inputs = [row if t is bias else t for t in add.inputs]
        return Replacement(nodes=[g.node("Add", inputs, name=f"{add.name}_row_bias", outputs=[add.outputs[0]])])


def _exact_gelu(gelu: Match) -> bool:
    """A standard Gelu with approximate="tanh" becomes onnxruntime's FastGelu, not BiasGelu."""
    if "gelu" not in gelu.nodes:
        return True
    value = gelu.node("gelu").attrs.get("approximate", "none")
    return (value.decode() if isinstance(value, bytes) else value) == "none"
