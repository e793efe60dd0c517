"""A BatchNormalization left after all folding, as Mul + Add: measured slower, so declined."""

from __future__ import annotations


from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.toolkit.conv_weights import batchnorm_affine, batchnorm_reason, bn_params_reason
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import qdq_unit_reason

MEASURED = ("BatchNormalization runs faster than Mul+Add in onnxruntime (measured on CPU, 1 thread, fp32: "
            "Mul+Add takes 1.9-2.7x the time of BatchNormalization, e.g. 35.6 vs 18.8 us on [1,64,56,56]), "
            "so it is kept")
# A BatchNormalization a quantizer wrapped in Q/DQ pairs (benchmarks/results/quantized.md: the
# qdq-bn models) folds into its Conv only before quantization, where it is exact.
BEFORE_QUANTIZING = ("folding it would move a quantization step; fold BatchNormalization before quantizing: run "
                     "fuse on the float model (conv-bn), or onnxruntime.quantization's quant_pre_process, "
                     "which folds it")


@register
class BatchNormToAffine(PatternPass):
    """A standalone inference BatchNormalization as a per-channel affine map:

        x ── BatchNormalization(gamma, beta, mean, var, eps) ── y
          =>  x ── Mul(scale) ── Add(shift) ── y
        scale = gamma / sqrt(var + eps), shift = beta - mean * scale, both shaped [C, 1, ..., 1]
        so they broadcast on axis 1 of the rank-r input.

    Measured, not assumed (benchmarks/bn_affine_choice.py, onnxruntime 1.31.1 CPU on an AMD EPYC, 1 intra-op
    thread, fp32, median of 300 runs alternating both forms; graph optimizations disabled / enabled):

        shape              BN us (dis/en)   Mul+Add us (dis/en)   Mul+Add / BN
        [1, 64, 56, 56]     18.8 / 18.3       35.6 / 35.4            1.9
        [8, 256, 14, 14]    37.7 / 38.3       91.0 / 92.3            2.4
        [1, 512, 7, 7]       6.1 /  6.1       13.8 / 13.6            2.2
        [32, 64, 28, 28]   142.6 / 144.3     327.4 / 325.3           2.3

    A second run (BN / Mul+Add us, optimizations disabled): 20.1 / 38.2, 37.4 / 96.5, 6.6 / 14.4,
    160.8 / 433.1, i.e. 1.9-2.7x. fp16 was not measured.
    BatchNormalization is one fused pass over the tensor; Mul + Add are two broadcasting passes,
    and onnxruntime's optimizer does not fuse them back. So by default the check declines every
    match with that measured reason (a near-miss, to say why a BN remains); `exact_reason` holds
    the exactness conditions and `rewrite` the transformation, for a runtime where the data differ.

    A BatchNormalization inside a QDQ node unit (DequantizeLinear in, QuantizeLinear out, gamma and
    beta DequantizeLinear of int8: what quantize_static writes when quant_pre_process's optimizer
    is skipped) is kept on every target with a reason of its own: folding it into its Conv would
    move a quantization step. Folded before quantization it is exact, and there it pays
    (benchmarks/results/quantized.md, ORT_ENABLE_EXTENDED: quantized with BatchNormalization kept,
    cnn_bn_relu takes 1.41x and resnet50 1.12x the time of the copy quantized after the fold).
    """

    name = "bn-affine"
    description = "BatchNormalization -> Mul + Add (declined by default: BatchNormalization measured faster)"
    label = "BatchNormalization -> Mul + Add"
    # gamma and beta are not `const=True` here: a quantizer writes them as DequantizeLinear of int8
    # weights, and the QDQ unit, not "computed at run time", is the reason such a BN stays
    pattern = Op("BatchNormalization", Var("x"), Var("scale"), Var("beta"),
                 Var("mean", const=True), Var("variance", const=True), name="bn")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return self.exact_reason(m, g) or Decline(f"{m.node('bn').name}: {MEASURED}")

    def exact_reason(self, m: Match, g: GraphEditor) -> Decline | None:
        bn = m.node("bn")
        reason = batchnorm_reason(bn, g) or qdq_unit_reason(bn, g, why=BEFORE_QUANTIZING)
        if reason:
            return reason
        for role in ("scale", "beta"):
            reason = g.not_constant_reason(m.tensor(role), role, bn)
            if reason:
                return Decline(reason)
        shape = g.shape(m.tensor("x"))
        if shape is None or shape.rank < 2:
            return Decline(f"the rank of {bn.name}'s input is unknown or below 2")
        channels = shape.static(1) or constant_value(m.tensor("scale")).size
        return bn_params_reason(m, bn, channels, f"one per channel of {bn.name}'s input")

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, x = m.node("bn"), m.tensor("x")
        s, t = batchnorm_affine(m, bn)
        dtype = g.dtype(x) or constant_value(m.tensor("scale")).dtype
        per_channel = (-1,) + (1,) * (g.shape(x).rank - 2)
        scaled = g.variable(f"{bn.name}_scaled", like=x)
        mul = g.node("Mul", [x, g.constant(f"{bn.name}_scale", s.reshape(per_channel).astype(dtype))],
                     name=f"{bn.name}_mul", outputs=[scaled])
        add = g.node("Add", [scaled, g.constant(f"{bn.name}_shift", t.reshape(per_channel).astype(dtype))],
                     name=f"{bn.name}_add", outputs=[bn.outputs[0]])
        return Replacement(nodes=[mul, add])
