"""What a graph tensor is, read without running anything: its constant value, its producer, whether it
is an omitted optional input. The matcher and the editor both ask; they live here, below both."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.core.domains import is_default_domain


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of a tensor known before run time: an initializer or a Constant node's output."""
    if isinstance(tensor, gs.Constant):
        return tensor.values
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        if producer.op == "Constant" and is_default_domain(producer.domain) and "value" in producer.attrs:
            value = producer.attrs["value"]
            return value.values if isinstance(value, gs.Constant) else np.asarray(value)
    return None


def producer_of(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def is_missing(tensor: gs.Tensor | None) -> bool:
    """An omitted optional input: graphsurgeon's nameless, producerless placeholder (or None)."""
    return tensor is None or (isinstance(tensor, gs.Variable) and tensor.name == "" and not tensor.inputs)
