"""Weight arithmetic shared by the passes that fold per-channel affine maps into Conv, Gemm and
MatMul weights. Everything computes in float64; callers round once to the weight dtype."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, rebuilt
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import Decline

FOLDABLE_DTYPES = (np.float16, np.float32, np.float64)
BN_PARAMS = ("scale", "beta", "mean", "variance")


def output_channels(conv: gs.Node, w: np.ndarray) -> int:
    """Conv weights are [C_out, C_in/group, k...]; ConvTranspose's [C_in, C_out/group, k...]."""
    if conv.op == "ConvTranspose":
        return w.shape[1] * int(conv.attrs.get("group", 1))
    return w.shape[0]


def scale_output_channels(conv: gs.Node, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """w scaled per output channel: axis 0 for Conv; for ConvTranspose axis 1 within each group."""
    spatial = (1,) * (w.ndim - 2)
    if conv.op != "ConvTranspose":
        return w * scale.reshape(-1, 1, *spatial)
    groups = int(conv.attrs.get("group", 1))
    c_in, c_out_per_group = w.shape[0], w.shape[1]
    grouped = w.reshape(groups, c_in // groups, c_out_per_group, *w.shape[2:])
    grouped = grouped * scale.reshape(groups, 1, c_out_per_group, *spatial)
    return grouped.reshape(w.shape)


def refolded_conv(conv: gs.Node, inputs: list[gs.Tensor], output: gs.Tensor) -> gs.Node:
    """The same Conv/ConvTranspose (name, attributes, domain) over new weights, writing `output`."""
    return rebuilt(conv, inputs=inputs, outputs=[output])


def conv_bias_reason(m: Match, conv: gs.Node, channels: int) -> Decline | None:
    bias = m.tensor("bias")
    if bias is not None and constant_value(bias).size != channels:
        return Decline(f"{conv.name}'s bias has {constant_value(bias).size} values for {channels} output channels")
    return None


__all__ = ["FOLDABLE_DTYPES", "BN_PARAMS", "output_channels", "scale_output_channels", "refolded_conv",
           "conv_bias_reason", "batchnorm_reason", "batchnorm_affine", "channel_vector", "finite_fold",
           "fold_input_affine"]


def batchnorm_reason(bn: gs.Node, g: GraphEditor) -> Decline | None:
    """Why this BatchNormalization is not a fixed per-channel affine map, or None."""
    if bn.attrs.get("training_mode", 0) == 1:
        return Decline(f"{bn.name} is in training mode (training_mode=1): its statistics change per batch")
    if g.opset < 7 and bn.attrs.get("is_test", 0) != 1:
        return Decline(f"{bn.name} has is_test=0 (training mode before opset 7)")
    if any(out.outputs or g.is_graph_output(out) for out in bn.outputs[1:]):
        return Decline(f"{bn.name} exposes running statistics (training-mode outputs are read)")
    if bn.attrs.get("spatial", 1) == 0:
        return Decline(f"{bn.name} has spatial=0 (per-activation statistics), which does not fold per channel")
    return None


def bn_params_reason(m: Match, bn: gs.Node, channels: int, what: str) -> Decline | None:
    """The four BN parameters must hold one value per channel (`what` names the channels)."""
    for role in BN_PARAMS:
        value = constant_value(m.tensor(role))
        if value.ndim != 1 or value.size != channels:
            return Decline(f"{bn.name}'s {role} has shape {list(value.shape)}, expected [{channels}] ({what})")
    return None


def batchnorm_affine(m: Match, bn: gs.Node) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization as y = x * s + t per channel, in float64 (eps kept)."""
    gamma, beta, mean, var = (constant_value(m.tensor(k)).astype(np.float64) for k in BN_PARAMS)
    s = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return s, beta - mean * s


def finite_fold(c: np.ndarray, fold, dtype: np.dtype) -> bool:
    """Are the constant and the values `fold()` returns (float64; None entries skipped) finite in
    `dtype`?
    A fold multiplies a weight, not the activation: in range per element, gamma * c or W * c may
    not be (float16), and c = inf makes NaN of a zero weight (inf * 0) where the unfused graph
    gives +-inf."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return bool(np.all(np.isfinite(c))) and all(bool(np.all(np.isfinite(v.astype(dtype))))
                                                     for v in fold() if v is not None)


def channel_vector(value: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """A constant that, broadcast against a [N, C, ...] tensor of `rank`, varies only over the
    channel axis (1) and leaves the result shape unchanged: its values per channel (float64, length
    C). None if it varies over another axis or would grow the result."""
    if value.ndim > rank:
        return None
    dims = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(dims) if i != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,)).copy()


def fold_input_affine(conv: gs.Node, w: np.ndarray, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Conv(x * s + t) = Conv'(x) for an unpadded Conv, per group: returns (W', bias shift) with
    W'[o,i,k] = W[o,i,k] * s[c(o,i)] and shift[o] = sum over i,k of W[o,i,k] * t[c(o,i)], where
    c(o,i) = group(o) * C_in/group + i is the input channel that weight slice reads."""
    groups = int(conv.attrs.get("group", 1))
    c_out, c_in_per_group = w.shape[0], w.shape[1]
    spatial = (1,) * (w.ndim - 2)

    def per_output(v: np.ndarray) -> np.ndarray:  # [C_in] -> [C_out, C_in/group, 1...]: what W[o, i] reads
        return np.repeat(v.reshape(groups, c_in_per_group), c_out // groups, axis=0).reshape(w.shape[:2] + spatial)

    return w * per_output(s), (w * per_output(t)).reshape(c_out, -1).sum(axis=1)
