"""What the passes to ONNX's standard Attention (opset 23) share: the soft cap they decline, the
mask they pass as attn_mask, and its clamp (standard-attention and standard-cached-attention)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli import targets
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.attention_proofs import mask_fits, softcap_of

# s + MASK_FLOOR rounds to MASK_FLOOR in float32 for every |s| < 3e22, as s + float32's lowest rounds to
# the lowest: a row masked throughout stays uniform, while onnxruntime 1.31/1.32's CPU Attention
# writes zeros for a row whose mask is -inf or exactly float32's lowest (one-node probe).
MASK_FLOOR = -1e30
# A float16 mask goes in as float32: onnxruntime's CPU provider has no float16 Add or Softmax kernel,
# so it runs a float16 graph's masked softmax in float32 (Casts only at its edges, even at
# ORT_DISABLE_ALL), where s + -65504 keeps s and a row masked throughout is softmax(s); the
# Attention kernel adds a float32 attn_mask to float16 Q/K/V scores in float32 too (one-node probes),
# and a float16 one in float16, where s + -65504 rounds to -65504 and the same row is uniform.
WIDENED_MASKS = (np.dtype(np.float16),)


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
    not broadcast it over the queries) and float32, or float16 that clamped_mask widens (WIDENED_MASKS)."""
    mask = m.tensor("mask")
    if mask is None:
        return None
    if not mask_fits(m, g, h, length):
        shape = g.shape(mask)
        return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                       f"[batch or 1, 1 or {h}, sequence, key length] of the query's dtype (onnxruntime's "
                       f"Attention does not broadcast attn_mask over the queries: targets.STANDARD)")
    if g.dtype(mask) != np.float32 and g.dtype(mask) not in WIDENED_MASKS:
        return Decline(f"the mask {mask.name!r} is {g.dtype(mask)}: onnxruntime's Attention zeroes rows masked with "
                       f"the dtype's lowest value, which the graph averages, and only a float32 or float16 mask "
                       f"is clamped")
    return None


def clamped_mask(m: Match, g: GraphEditor, nodes: list[gs.Node]) -> gs.Tensor | None:
    """Max(mask, MASK_FLOOR), its nodes appended to `nodes`: onnxruntime zeroes rows masked with
    exactly float32's lowest; -1e30 averages them as the graph does. A float16 mask is first Cast
    to float32 (WIDENED_MASKS: its masked softmax runs in float32 on the CPU). None without a mask."""
    mask = m.tensor("mask")
    if mask is None:
        return None
    if g.dtype(mask) in WIDENED_MASKS:
        widened = g.variable(f"{mask.name}_float")
        widened.dtype = np.float32
        nodes.append(g.node("Cast", [mask], {"to": onnx.TensorProto.FLOAT}, name=f"{mask.name}_widen",
                            outputs=[widened]))
        mask = widened
    clamped = g.variable(f"{mask.name}_clamped", like=mask)
    nodes.append(g.node("Max", [mask, g.constant("mask_floor", np.array(MASK_FLOOR, np.float32))],
                        name=f"{mask.name}_clamp", outputs=[clamped]))
    return clamped
