"""A Flatten in front of Gemm that flattens nothing: its input is already a matrix."""

from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Flattening a rank-4 feature map before the classifier is what Flatten is for: only a
    rank-2 input can make it a no-op, so anything else is not this pattern."""
    dims = g.shape(m.tensor("x"))
    return dims is not None and dims.rank == 2


@register
class EliminateFlattenBeforeGemm(PatternPass):
    """x[N, C] ── Flatten(axis=1) ── Gemm(B, C?) ── y   =>   x ── Gemm(B, C?) ── y

    Flatten(axis) gives [prod(dims[:axis]), prod(dims[axis:])]: for a rank-2 input and axis 1
    (or -1) that is the input's own shape, whatever N and C are; at axis 0 (or -2) only when
    N is statically 1, at axis 2 only when C is. Any other rank changes the shape (a
    [N, C, 1, 1] input becomes [N, C]), so the Flatten stays.
    """

    name = "eliminate-flatten"
    description = "Remove a Flatten(axis=1) of a rank-2 tensor that feeds Gemm"
    label = "Flatten (no-op) + Gemm"
    pattern = Op("Gemm", Op("Flatten", Var("x"), name="flatten"), Var("b"), Var("c", optional=True),
                 name="gemm")

    requires = (Requirement(
        "Flattening a rank-4 feature map before the classifier is what Flatten is for: only a rank-2 input "
        "can make it a no-op, so anything else is not this pattern.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        flatten = m.node("flatten")
        dims = g.shape(m.tensor("x"))
        axis = flatten.attrs.get("axis", 1)
        axis += dims.rank if axis < 0 else 0
        # [N, C] -> [1, N*C] at axis 0 and [N*C, 1] at axis 2: no-ops only when N (or C) is 1
        must_be_one = {0: 0, 2: 1}.get(axis)
        if must_be_one is not None and dims.static(must_be_one) != 1:
            return Decline(f"{flatten.name} with axis={axis} changes the shape {list(dims.dims)}")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        gemm, flattened = m.node("gemm"), m.node("flatten").outputs[0]
        inputs = [m.tensor("x") if t is flattened else t for t in gemm.inputs]
        fused = rebuilt(gemm, inputs=inputs)
        return Replacement(nodes=[fused])
