"""Remove Identity nodes: readers read the input directly."""

from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class EliminateIdentity(PatternPass):
    """x ── Identity ── y   =>   readers of y read x."""

    name = "eliminate-identity"
    description = "Remove Identity nodes"
    label = "Identity"
    pattern = Op("Identity", Var("x"), name="identity")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return Decline.unless(g.reroute_reason(m.node("identity").outputs[0], m.tensor("x")))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("identity").outputs[0], m.tensor("x"))])
