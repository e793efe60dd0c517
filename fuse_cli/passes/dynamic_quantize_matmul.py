"""A dynamically quantized MatMul, scaled back to float -> onnxruntime's DynamicQuantizeMatMul or
MatMulIntegerToFloat."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, any_value, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register

MS = "com.microsoft"
QUANTIZE = "DynamicQuantizeLinear"
INTEGER_PRODUCT = Op("MatMulInteger", Var("a_q"), Const(any_value, name="b"), Var("a_zp", optional=True),
                     Var("b_zp", const=True, optional=True), name="matmul")
PRODUCT = Op("Mul", Op("Cast", INTEGER_PRODUCT, to=onnx.TensorProto.FLOAT, name="cast"),
             Op("Mul", Var("a_scale"), Const(any_value, name="b_scale"), name="scales"), name="product")


@register
class DynamicQuantizeMatMul(PatternPass):
    """y = (MatMulInteger(a_q, B, a_zp, b_zp) as float) * (a_scale * b_scale) [+ bias], where
    a_q, a_scale, a_zp = DynamicQuantizeLinear(a): what onnxruntime.quantization.quantize_dynamic
    writes for a MatMul with a constant weight B (int8 or uint8, per tensor or per column).

        a ─ DynamicQuantizeLinear ─ a_q, a_zp ─ MatMulInteger(B, b_zp) ─ Cast(float) ─┐
                                   └ a_scale ─ Mul(b_scale) ─────────────────────────── Mul ─ [Add(bias)] ─ y
          =>  a ── com.microsoft::DynamicQuantizeMatMul(B, b_scale, b_zp, bias) ── y
              (a_q, a_scale, a_zp read by other MatMulIntegers too, as Q, K and V read one:
               com.microsoft::MatMulIntegerToFloat(a_q, B, a_scale, b_scale, a_zp, b_zp, bias),
               the one quantization of a kept for all of them)

    The same integer product and the same float scaling, in one kernel: the int32 product, its
    float copy and the scaled product never exist. onnxruntime makes the same operators at
    ORT_ENABLE_EXTENDED (DynamicQuantizeMatMulFusion, MatMulIntegerToFloatFusion); written here,
    a session at a lower level, or a runtime reading the file, runs them too. Dynamically quantized
    models only: a QDQ model's units stay as its quantizer wrote them (toolkit/quantized.py).
    """

    name = "dynamic-quantize-matmul"
    description = ("Fuse DynamicQuantizeLinear + MatMulInteger + Cast + scale Mul (+ bias Add) into com.microsoft "
                   "DynamicQuantizeMatMul / MatMulIntegerToFloat")
    label = "dynamically quantized MatMul -> DynamicQuantizeMatMul"
    emits = (f"{MS}::DynamicQuantizeMatMul", f"{MS}::MatMulIntegerToFloat")
    pattern = Alt(Op("Add", PRODUCT, Const(any_value, name="bias"), name="root"), PRODUCT)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return g.dtype(m.root.outputs[0]), m.nodes["matmul"]

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        matmul, quantize = m.nodes["matmul"], _quantizer(m)
        if quantize is None:
            return Decline(f"{matmul.name}'s operand, scale and zero point are not the three outputs of one "
                           f"{QUANTIZE} (a statically quantized operand: no dynamic quantization to fuse)")
        if m.tensor("a_zp") is None or m.tensor("b_zp") is None:
            return Decline(f"{matmul.name} has no zero point for one operand (onnxruntime.quantization always "
                           "writes both; this form was not probed against the kernel)")
        b, b_scale, b_zp = (constant_value(m.tensor(n)) for n in ("b", "b_scale", "b_zp"))
        columns = b.shape[-1] if b.ndim == 2 else None
        if columns is None or b.dtype not in (np.int8, np.uint8):
            return Decline(f"{matmul.name}'s weight is {b.dtype} of rank {b.ndim}: the kernels take a 2-D int8 or "
                           "uint8 weight")
        for name, value in (("scale", b_scale), ("zero point", b_zp)):
            if value.size not in (1, columns) or value.ndim > 1:
                return Decline(f"{matmul.name}'s weight {name} has shape {list(value.shape)}: the kernels take one "
                               f"per tensor or one per column ({columns})")
        if "bias" in m.tensors:
            bias = constant_value(m.tensor("bias"))
            if bias.shape != (columns,) or bias.dtype != np.float32:
                return Decline(f"{m.root.name} adds a {bias.dtype} constant of shape {list(bias.shape)}, not a bias "
                               f"of {columns} float32 values (one per column)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        matmul, quantize = m.nodes["matmul"], _quantizer(m)
        bias = [m.tensor("bias")] if "bias" in m.tensors else []
        if _only_this_unit_reads(quantize, m):
            inputs = [quantize.inputs[0], m.tensor("b"), m.tensor("b_scale"), m.tensor("b_zp"), *bias]
            op = "DynamicQuantizeMatMul"
        else:
            inputs = [m.tensor("a_q"), m.tensor("b"), m.tensor("a_scale"), m.tensor("b_scale"), m.tensor("a_zp"),
                      m.tensor("b_zp"), *bias]
            op = "MatMulIntegerToFloat"
        return Replacement(nodes=[g.node(op, inputs, {}, name=f"{matmul.name}_{op}", outputs=[m.root.outputs[0]],
                                         domain=MS)])


def _quantizer(m: Match) -> gs.Node | None:
    """The DynamicQuantizeLinear writing a_q, a_scale and a_zp as its outputs 0, 1 and 2, or None."""
    node = m.tensor("a_q").inputs[0] if m.tensor("a_q").inputs else None
    if node is None or node.op != QUANTIZE or len(node.outputs) != 3:
        return None
    wanted = (m.tensor("a_q"), m.tensor("a_scale"), m.tensor("a_zp"))
    return node if all(out is want for out, want in zip(node.outputs, wanted)) else None


def _only_this_unit_reads(quantize: gs.Node, m: Match) -> bool:
    """Every reader of the quantizer's outputs is this match's MatMulInteger or scale Mul: the
    quantization can move into the kernel (DynamicQuantizeMatMul quantizes its input itself)."""
    covered = {id(m.nodes["matmul"]), id(m.nodes["scales"])}
    return all(id(reader) in covered for out in quantize.outputs for reader in out.outputs)
