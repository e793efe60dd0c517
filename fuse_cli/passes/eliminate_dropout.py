"""Remove Dropout in inference mode: it computes nothing at inference time."""


from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class EliminateDropout(PatternPass):
    """x ── Dropout (inference mode) ── y   =>   readers of y read x.

    Inference mode: opset >= 12 the training_mode input is absent or a constant false; opset 7-11
    Dropout is a no-op at inference by definition; opset < 7 needs is_test=1. The mask output
    must be unused (it would be all ones, but we do not synthesize it).
    """

    name = "eliminate-dropout"
    description = "Remove inference-mode Dropout nodes"
    label = "Dropout (inference)"
    pattern = Op("Dropout", Var("x"), Var("ratio", optional=True), Var("training_mode", optional=True), name="dropout")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        dropout = m.node("dropout")
        training = m.tensor("training_mode")
        if training is not None:
            value = constant_value(training)
            if value is None:
                return Decline(f"{dropout.name}'s training_mode is not a constant")
            if bool(value.reshape(-1)[0]):
                return Decline(f"{dropout.name} is in training mode (training_mode=true)")
        if g.opset < 7 and dropout.attrs.get("is_test", 0) != 1:
            return Decline(f"{dropout.name} has is_test=0 (training mode)")
        mask = dropout.outputs[1] if len(dropout.outputs) > 1 else None
        if mask is not None and (mask.outputs or g.is_graph_output(mask)):
            return Decline(f"{dropout.name}'s mask output {mask.name!r} is used")
        return Decline.unless(g.reroute_reason(dropout.outputs[0], m.tensor("x")))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("dropout").outputs[0], m.tensor("x"))])
