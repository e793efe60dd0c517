"""Fold a zero Pad of the spatial axes into the Conv that reads it."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class FoldPadIntoConv(PatternPass):
    """A constant-zero Pad of the spatial axes before a Conv becomes the Conv's own padding:

        x ── Pad(pads, mode="constant", value=0) ── Conv(W, b, pads=p) ── y
          =>  x ── Conv(W, b, pads=p + spatial part of Pad's pads) ── y

    Conv pads its input with zeros exactly as Pad does, so the sums agree under any strides,
    dilations and groups. Pad's pads are [x0_begin, x1_begin, ..., x0_end, x1_end, ...] over
    all axes (or over `axes`, opset >= 18), an attribute before opset 11 and an input from 11;
    Conv's pads cover the spatial axes only. Exact only when the batch and channel axes are not
    padded, every pad is non-negative (negative pads crop) and the pad value is 0; the Conv must
    use explicit pads (auto_pad NOTSET, or VALID, which means no padding).
    """

    name = "pad-conv"
    description = "Fold a zero constant Pad of the spatial axes into the following Conv's pads"
    label = "Pad + Conv"
    pattern = Op("Conv", Op("Pad", Var("x"), Var("pads", const=True, optional=True),
                            Var("value", const=True, optional=True), Var("axes", const=True, optional=True),
                            name="pad"),
                 Var("weight"), Var("bias", optional=True), name="conv")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        pad, conv = m.node("pad"), m.node("conv")
        if pad.attrs.get("mode", "constant") != "constant":
            return Decline(f"{pad.name} pads in {pad.attrs['mode']!r} mode; Conv pads with zeros only")
        value = constant_value(m.tensor("value")) if m.tensor("value") is not None else pad.attrs.get("value", 0.0)
        if np.any(np.asarray(value) != 0):
            return Decline(f"{pad.name} pads with the value {np.asarray(value).reshape(-1)[0]}; Conv pads with zeros")
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID"):
            return Decline(f"{conv.name} has auto_pad={auto_pad}; "
                           "only explicit pads (NOTSET) or VALID can absorb a Pad")
        per_axis = _pads_per_axis(m, g)
        if per_axis is None:
            return Decline(f"the rank of {pad.name}'s input is unknown, so its axes cannot be resolved")
        if (per_axis < 0).any():
            return Decline(f"{pad.name} has negative pads {per_axis.T.reshape(-1).tolist()} (it crops)")
        if per_axis[:2].any():
            return (Decline(f"{pad.name} pads the batch or channel axis (pads per axis {per_axis.tolist()}); "
                    "Conv pads spatial axes only"))
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        conv = m.node("conv")
        spatial = _pads_per_axis(m, g)[2:]
        old = conv.attrs.get("pads", [0] * (2 * len(spatial)))
        if conv.attrs.get("auto_pad", "NOTSET") == "VALID":
            old = [0] * (2 * len(spatial))
        attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
        attrs["pads"] = [int(p) for p in (np.asarray(old).reshape(2, -1) + spatial.T).reshape(-1)]
        inputs = [m.tensor("x"), m.tensor("weight")] + ([m.tensor("bias")] if m.tensor("bias") is not None else [])
        return Replacement(nodes=[rebuilt(conv, inputs=inputs, attrs=attrs)])


def _pads_per_axis(m: Match, g: GraphEditor) -> np.ndarray | None:
    """Pad's pads as a [rank, 2] array of (begin, end) per axis of its input, or None if the rank
    is needed (an `axes` input) and unknown."""
    pad = m.node("pad")
    raw = m.tensor("pads")
    pads = np.asarray(constant_value(raw) if raw is not None else pad.attrs.get("pads", pad.attrs.get("paddings")),
                      dtype=np.int64).reshape(2, -1)
    if m.tensor("axes") is None:
        return pads.T
    shape = g.shape(m.tensor("x"))
    weight = g.shape(m.tensor("weight"))
    rank = shape.rank if shape is not None else weight.rank if weight is not None else None
    if rank is None:
        return None
    per_axis = np.zeros((rank, 2), dtype=np.int64)
    for axis, begin, end in zip(constant_value(m.tensor("axes")).reshape(-1), pads[0], pads[1]):
        per_axis[int(axis) % rank] = (begin, end)
    return per_axis
