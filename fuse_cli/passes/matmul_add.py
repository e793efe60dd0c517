"""MatMul followed by the Add of a constant bias becomes one Gemm (rank-2 activations)."""

from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.constness import computed_at_run_time
from fuse_cli.toolkit.gemm import gemm_operands_reason


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """An activation as the weight (attention's q @ k^T) or as the bias (a residual Add) is
    not a Linear layer: silent, not a near-miss. Nor is a rank >= 3 result that only a
    Reshape reads: matmul-add-into-view's pattern, which says why where it declines."""
    if computed_at_run_time(m.tensor("weight")) or computed_at_run_time(m.tensor("bias")):
        return False
    x, readers = g.shape(m.tensor("x")), m.node("add").outputs[0].outputs
    return not (x is not None and x.rank >= 3 and len(readers) == 1 and readers[0].op == "Reshape")


@register
class FuseMatMulAddIntoGemm(PatternPass):
    """x[M,K] ── MatMul(W[K,N]) ── Add(bias) ── y   =>   x ── Gemm(W, bias) ── y

    Rank >= 3 activations (transformer Linear layers) stay MatMul + Add: the standard-ONNX
    alternative, Reshape -> Gemm -> Reshape, measured 0-6% slower in onnxruntime CPU (it already
    runs [B,S,K] x [K,N] as one GEMM), so it is reported as a near-miss, not emitted.

    Exact when x and W are rank 2 and the bias broadcasts over the last dimension only
    (shape [], [1], [N], [1,1] or [1,N]): then Gemm's C broadcasting gives the same [M,N]
    result. Add operands in either order (torch writes Add(bias, MatMul) for Linear layers).
    """

    name = "matmul-add"
    description = "Fuse MatMul + constant bias Add into Gemm (rank-2 activations)"
    label = "MatMul + Add (bias) -> Gemm"
    min_opset = 7  # Gemm's C broadcasts unidirectionally from opset 7
    pattern = Op("Add", Op("MatMul", Var("x"), Var("weight", const=True), name="matmul"), Var("bias", const=True),
                 name="add")

    requires = (Requirement(
        "An activation as the weight (attention's q @ k^T) or as the bias (a residual Add) is not a Linear "
        "layer: silent, not a near-miss. Nor is a rank >= 3 result that only a Reshape reads: "
        "matmul-add-into-view's pattern, which says why where it declines.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        matmul = m.node("matmul")
        x_shape = g.shape(m.tensor("x"))
        w = constant_value(m.tensor("weight"))
        bias = constant_value(m.tensor("bias"))
        if x_shape is None:
            return Decline(f"{matmul.name}'s input rank is unknown (Gemm needs a rank-2 activation)")
        if x_shape.rank != 2:
            return (Decline(f"{matmul.name}'s activation has rank {x_shape.rank}; Gemm takes rank 2, "
                    "and Reshape -> Gemm -> Reshape measured no faster than MatMul + Add in onnxruntime "
                    "(benchmarks/matmul_add_rank3.py)"))
        return gemm_operands_reason(matmul, w, bias)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        matmul, add = m.node("matmul"), m.node("add")
        bias = m.tensor("bias")
        gemm = g.node("Gemm", [m.tensor("x"), m.tensor("weight"), bias], {}, name=f"{matmul.name}_gemm",
                      outputs=[add.outputs[0]])
        return Replacement(nodes=[gemm])
