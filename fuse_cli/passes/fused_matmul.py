"""MatMul with transposed operands and/or a scalar scale -> onnxruntime's FusedMatMul."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import TO_ONNXRUNTIME, qdq_unit_reason

MS = "com.microsoft"
A = Alt(Op("Transpose", Var("a"), name="transpose_a"), Var("a"))
B = Alt(Op("Transpose", Var("b"), name="transpose_b"), Var("b"))
SCALE = Const(lambda v: v.size == 1 and np.issubdtype(v.dtype, np.floating), name="scale")


@register
class FuseMatMulTransposeScale(PatternPass):
    """y = s * (A' @ B'), A' = A or A with its last two axes swapped (same for B')

        A ── [Transpose(perm [.., n-1, n-2])] ──┐
                                                MatMul ──[ Mul(scalar s) ]── y
        B ── [Transpose(perm [.., n-1, n-2])] ──┘
          =>  A, B ── com.microsoft::FusedMatMul(transA, transB, alpha = s) ── y

    transA/transB swap the last two axes of an operand (batch axes broadcast as in MatMul); only
    that exact Transpose is absorbed (transBatchA/B move the first axis, another permutation).
    transA is refused when B is a vector: onnxruntime 1.31's CPU kernel returns wrong values
    then (measured). The scale is a one-element constant on either side of the Mul whose rank
    does not widen the product; alpha is a float32 attribute, so a float64 model's scale must
    be exact in float32. The forms: Mul(MatMul(A', B'), s), or MatMul(A', B') with at least one
    Transpose (a plain MatMul is no FusedMatMul).
    """

    name = "fused-matmul"
    description = "Fuse Transpose of either MatMul input and a scalar Mul into com.microsoft FusedMatMul"
    label = "MatMul + Transpose / scalar Mul -> FusedMatMul"
    emits = (f"{MS}::FusedMatMul",)
    pattern = Alt(Op("Mul", Op("MatMul", A, B, name="matmul"), SCALE, name="root"),
                  Op("MatMul", Op("Transpose", Var("a"), name="transpose_a"), B, name="root"),
                  Op("MatMul", Var("a"), Op("Transpose", Var("b"), name="transpose_b"), name="root"))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        matmul = m.nodes.get("matmul", m.root)
        return g.dtype(matmul.outputs[0]) or g.dtype(m.tensor("a")), matmul

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        dtype, matmul = self.emitted_at(m, g)
        quantized = qdq_unit_reason(matmul, g, why=TO_ONNXRUNTIME)  # QLinearMatMul is onnxruntime's to make
        if quantized:
            return quantized
        for side in ("a", "b"):
            transpose = m.nodes.get(f"transpose_{side}")
            if transpose is None:
                continue
            if any(m.tensor(s) is transpose.outputs[0] for s in ("a", "b")):
                return (Decline(f"{matmul.name} reads {transpose.name}'s output on both sides: "
                        "a Transpose shared by both operands is not absorbed"))
            reason = _not_last_two_swap(transpose, g.shape(m.tensor(side)))
            if reason:
                return reason
        b_shape = g.shape(m.tensor("b"))
        if "transpose_a" in m.nodes and (b_shape is None or b_shape.rank < 2):
            # measured on onnxruntime 1.31 CPU: transA=1 with a vector B returns wrong values
            return (Decline(f"{matmul.name}'s second input {m.tensor('b').name!r} is a vector or of unknown rank: "
                    "onnxruntime's FusedMatMul computes transA wrongly then"))
        return _scale_reason(m, g, matmul, dtype) if "scale" in m.tensors else None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        matmul = m.nodes.get("matmul", m.root)
        attrs = {"transA": int("transpose_a" in m.nodes), "transB": int("transpose_b" in m.nodes)}
        if "scale" in m.tensors:
            attrs["alpha"] = float(constant_value(m.tensor("scale")).reshape(-1)[0])
        fused = g.node("FusedMatMul", [m.tensor("a"), m.tensor("b")], attrs, name=f"{matmul.name}_fused",
                       outputs=[m.root.outputs[0]], domain=MS)
        return Replacement(nodes=[fused])


def _not_last_two_swap(transpose: gs.Node, shape) -> Decline | None:
    perm = transpose.attrs.get("perm")
    rank = len(perm) if perm is not None else (shape.rank if shape is not None else None)
    if rank is None:
        return Decline(f"{transpose.name} has no perm and its input rank is unknown")
    perm = list(perm) if perm is not None else list(range(rank))[::-1]
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    if rank < 2 or perm != swap:
        return Decline(f"{transpose.name} has perm {perm}; FusedMatMul absorbs only a swap of the last two axes {swap}")
    return None


def _scale_reason(m: Match, g: GraphEditor, matmul: gs.Node, dtype: np.dtype) -> Decline | None:
    scale = constant_value(m.tensor("scale"))
    mul = m.root
    if scale.dtype != dtype:
        return Decline(f"{mul.name}'s scale has dtype {scale.dtype}, the product {dtype}")
    product = g.shape(matmul.outputs[0])
    if scale.ndim and (product is None or product.rank < scale.ndim):
        return (Decline(f"{mul.name}'s scale has rank {scale.ndim}, which may widen {matmul.name}'s product "
                f"(rank {product.rank if product else 'unknown'})"))
    value = float(scale.reshape(-1)[0])
    if float(np.float32(value)) != value:
        return (Decline(f"{mul.name} scales by {value!r}, which FusedMatMul's float32 alpha cannot hold exactly "
                f"({float(np.float32(value))!r})"))
    return None
