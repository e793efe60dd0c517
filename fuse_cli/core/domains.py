"""The default ONNX domain, spelled two ways ("" and "ai.onnx"), and the model's opset in it."""

from __future__ import annotations

import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")


def is_default_domain(domain: str | None) -> bool:
    return (domain or "") in DEFAULT_DOMAINS


def default_opset_or_none(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if is_default_domain(o.domain)), None)


def has_contrib_nodes(model: onnx.ModelProto) -> bool:
    """Any top-level node outside the default domain (com.microsoft, a custom domain)."""
    return any(not is_default_domain(node.domain) for node in model.graph.node)
