"""An If whose condition is known before run time becomes the branch it always takes."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class InlineConstantIf(PatternPass):
    """cond (constant) ── If(then_branch, else_branch) ── y1..yn   =>   the taken branch's nodes,
    each branch output ── Identity ── y_i

    Exact: an If runs exactly one branch, chosen by its single boolean; a constant condition
    chooses the same one every time. The branch's nodes read the enclosing graph's tensors by
    name, which they still see once they stand in it, in the If's place (what they read is
    produced before the If). Its own weights come along. An Identity gives each If output its
    name back; eliminate-identity drops it where a name may move. A condition computed at run time
    (an optimum merged decoder's `use_cache_branch` input) keeps its If. (graphsurgeon's folder
    can inline such an If too, but rewires only its first output: a second reader was left
    reading a tensor nothing makes, so fold-constants leaves If nodes to this pass.)
    """

    name = "inline-constant-if"
    description = "Replace an If whose condition is a constant by the branch it takes"
    label = "If (constant condition)"
    pattern = Op("If", Var("cond"), name="if")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        node = m.node("if")
        value = constant_value(m.tensor("cond"))
        if value is None:
            return Decline(f"{node.name}'s condition {m.tensor('cond').name!r} is computed at run time")
        if value.size != 1:
            return Decline(f"{node.name}'s condition holds {value.size} values, not one")
        branch = _taken(node, value)
        if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
            return Decline(f"{node.name}'s branch does not produce its {len(node.outputs)} outputs")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        node = m.node("if")
        branch = _taken(node, constant_value(m.tensor("cond")))
        renames = [g.node("Identity", [inner], name=f"{node.name or 'If'}_out", outputs=[outer])
                   for inner, outer in zip(branch.outputs, list(node.outputs))]
        return Replacement(nodes=[*branch.nodes, *renames])


def _taken(node: gs.Node, condition) -> gs.Graph | None:
    return node.attrs.get("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch")
