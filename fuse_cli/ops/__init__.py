"""The operator catalogue: one record per operator (ops/record.py), one module per operator or
family, listed here in the order the target table shows them.

targets.py (support), kernel_contracts.py (probes and contracts), analysis/shapes.py (shape
stand-ins) and the memory model (views, in-place, workspace) read these records; none of them
keeps a per-operator rule of its own. Adding an operator is adding a module here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import onnx

from fuse_cli.ops import (conv, dropout, dynamic_quantize_matmul, embed_layer_norm, function_bodies, fused_conv,
                          fused_gemm, fused_matmul, gelu, group_query_attention, gru, in_place, layer_norm, lrn, lstm,
                          multi_head_attention, packed_attention, qgemm, qlinear, qlinear_binary, qlinear_unary,
                          rotary_embedding, simplified_layer_norm, skip_layer_norm, standard_attention, unemitted,
                          variadic, views, where)
from fuse_cli.ops.record import Operator, Shapes

OPERATORS: tuple[Operator, ...] = (
    # onnxruntime's fused operators, then the standard ones newer than them (the target table's order)
    *fused_conv.RECORDS,
    *fused_gemm.RECORDS,
    *fused_matmul.RECORDS,
    *dynamic_quantize_matmul.RECORDS,
    *qgemm.RECORDS,
    *qlinear_binary.RECORDS,
    *qlinear_unary.RECORDS,
    *skip_layer_norm.RECORDS,
    *simplified_layer_norm.RECORDS,
    *gelu.RECORDS,
    *packed_attention.RECORDS,
    *embed_layer_norm.RECORDS,
    *multi_head_attention.RECORDS,
    *group_query_attention.RECORDS,
    *rotary_embedding.RECORDS,
    *unemitted.RECORDS,
    *standard_attention.RECORDS,
    *qlinear.RECORDS,
    # standard operators whose shapes or memory need a rule of their own
    *layer_norm.RECORDS,
    *conv.RECORDS,
    *where.RECORDS,
    *variadic.RECORDS,
    *lrn.RECORDS,
    *lstm.RECORDS,
    *gru.RECORDS,
    *dropout.RECORDS,
    *function_bodies.RECORDS,
    *views.RECORDS,
    *in_place.RECORDS,
)

_DEFAULT_DOMAINS = ("", "ai.onnx")
BY_KEY: Mapping[tuple[str, str], Operator] = MappingProxyType({record.key: record for record in OPERATORS})

# (domain, op_type) -> the rule, for the memory model's per-node lookups
VIEW_OPSETS: Mapping[tuple[str, str], tuple[int, int]] = MappingProxyType(
    {r.key: r.view_opsets for r in OPERATORS if r.view_opsets})
IN_PLACE: Mapping[tuple[str, str], tuple[int, frozenset[int] | None]] = MappingProxyType(
    {r.key: r.in_place for r in OPERATORS if r.in_place})
SCRATCH_OPS = frozenset(r.key for r in OPERATORS if r.workspace)
FUNCTION_BODY_OPS = frozenset(r.key for r in OPERATORS if r.function_body)
# The default-domain operators with a stand-in: the rest of the default domain onnx infers itself.
DEFAULT_DOMAIN_STAND_INS = frozenset(r.op for r in OPERATORS if r.stand_in and not r.domain)


def domain_of(node: onnx.NodeProto) -> str:
    """The node's domain, "" for the default domain however it is spelled."""
    return "" if node.domain in _DEFAULT_DOMAINS else node.domain


def stand_ins(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """Standard nodes writing `node`'s first output with its shape and type; [] when none.

    For operators onnx has no inference for (onnxruntime's com.microsoft kernels, and its
    internal default-domain ones) but whose output 0 has the shape standard operators compute,
    so everything downstream of a fused node keeps its shape. Each mirrors the operator's schema
    inference in onnxruntime (contrib_ops/*_defs.cc)."""
    record = BY_KEY.get((domain_of(node), node.op_type))
    if record is None or record.stand_in is None:
        return []
    if not node.output or not node.output[0] or not node.input or not node.input[0]:
        return []
    return record.stand_in(node, opset)


def workspace_bytes(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The kernel's scratch while it runs, in bytes; 0 when none or unknown."""
    record = BY_KEY.get((domain_of(node), node.op_type))
    return record.workspace(node, shapes, opset) if record is not None and record.workspace else 0


def held_workspace_bytes(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int | None:
    """The kernel's scratch where the planner writes its output into a buffer held before, for
    the operators where that differs from `workspace_bytes`; None for the rest."""
    record = BY_KEY.get((domain_of(node), node.op_type))
    return record.held_workspace(node, shapes, opset) if record is not None and record.held_workspace else None
