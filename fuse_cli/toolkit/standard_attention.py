"""What the passes to ONNX's standard Attention (opset 23) share: the soft cap they decline, the
mask they pass as attn_mask, and its clamp (standard-attention and standard-cached-attention)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli import targets
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.attention_proofs import mask_fits, softcap_of

# The floor each mask dtype is clamped to: onnxruntime 1.31/1.32's CPU Attention writes zeros for a
# row whose mask is -inf or exactly the dtype's lowest (one-node probes, float32 and float16), where
# the graph averages it. float32: s + -1e30 rounds to -1e30 for every |s| < 3e22, as s + float32's
# lowest rounds to the lowest, so a row masked throughout stays uniform. float16: the value one ulp
# above the lowest (-65472); s + it rounds to it for |s| < 16 (half the ulp, 32), as s + -65504
# rounds to -65504 in the graph's float16 Add, so a row masked throughout stays uniform there too;
# the kernel adds the mask in float16 (probed: -65472 rows come out uniform, as the graph's).
MASK_FLOOR = {np.dtype(np.float32): np.float32(-1e30),
              np.dtype(np.float16): np.nextafter(np.finfo(np.float16).min, np.float16(0))}


def softcap_decline(m: Match, g: GraphEditor) -> Decline | None:
    """A soft cap that is not one, or one the measured runtime runs slower: standard operators are
    for every runtime, and the one fuse measures (and verifies with) is onnxruntime's CPU provider,
    where a soft cap costs more than the fusion saves (targets.SLOWER)."""
    if isinstance(cap := softcap_of(m), Decline):
        return cap
    if cap is not None and (measured := targets.slower("ort-cpu", "Attention:softcap")) is not None:
        return Decline(measured.reason.format(target=g.target))
    return None


def attn_mask_decline(m: Match, g: GraphEditor, h: int, length) -> Decline | None:
    """The graph's mask as attn_mask: [B or 1, 1 or h, S, key length] (onnxruntime's Attention does
    not broadcast it over the queries) and of a dtype clamped_mask can clamp (MASK_FLOOR)."""
    mask = m.tensor("mask")
    if mask is None:
        return None
    if not mask_fits(m, g, h, length):
        shape = g.shape(mask)
        return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                       f"[batch or 1, 1 or {h}, sequence, key length] of the query's dtype (onnxruntime's "
                       f"Attention does not broadcast attn_mask over the queries: targets.STANDARD)")
    if g.dtype(mask) not in MASK_FLOOR:
        return Decline(f"the mask {mask.name!r} is {g.dtype(mask)}: onnxruntime's Attention zeroes rows masked with "
                       f"the dtype's lowest value, which the graph averages, and only a float32 or float16 mask "
                       f"is clamped")
    return None


def clamped_mask(m: Match, g: GraphEditor, nodes: list[gs.Node]) -> gs.Tensor | None:
    """Max(mask, MASK_FLOOR of its dtype), its node appended to `nodes`: onnxruntime zeroes rows
    masked with exactly the dtype's lowest; the floor averages them as the graph does. None without
    a mask."""
    mask = m.tensor("mask")
    if mask is None:
        return None
    clamped = g.variable(f"{mask.name}_clamped", like=mask)
    nodes.append(g.node("Max", [mask, g.constant("mask_floor", np.array(MASK_FLOOR[g.dtype(mask)]))],
                        name=f"{mask.name}_clamp", outputs=[clamped]))
    return clamped
