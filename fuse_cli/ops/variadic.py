"""Sum, Mean, Max and Min (standard): the temporaries of their variadic kernel.

Over n > 2 inputs the kernel (UntypedBroadcastVariadic, element_wise_ops.cc) combines them
pairwise into temporaries, two alive at once while n > 3, and asks for its output only for the
last pair: a fresh output takes the place of the first temporary, one the planner handed a held
buffer does not, so the scratch depends on the plan (held_workspace; randwire networks, found by
memray's exact count: one 0.38 MiB temporary missing at the peak).
"""

from __future__ import annotations

import math

import onnx

from fuse_cli.core.tensors import element_size_bits
from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import broadcast_static


def _is_variadic(node: onnx.NodeProto) -> bool:
    return len([i for i in node.input if i]) > 2


def _temporaries(node: onnx.NodeProto, shapes: Shapes, *, output_held: bool) -> int:
    """The temporaries over n > 2 inputs, in bytes; 0 when unknown. Partial results p0 = in0 (+)
    in1, p1 = p0 (+) in2, ...; while p[i] is computed p[i-1] is alive, and the last partial is
    alive beside the output, which the kernel asks for last: the most of p[-1] and p[i-1] + p[i],
    less the output where the plan allocates it fresh (it is counted beside the scratch and takes
    p[0]'s place), in full where it is a buffer held before (output_held)."""
    if not _is_variadic(node):
        return 0
    infos = [shapes.get(name) for name in node.input if name]
    out = shapes.get(node.output[0])
    if out is None or out.shape is None or any(i is None or i.shape is None
                                               or not all(isinstance(d, int) for d in i.shape)
                                                for i in infos):
        return 0
    bits = element_size_bits(out.elem_type)
    if bits is None or bits % 8 or not all(isinstance(d, int) for d in out.shape):
        return 0
    partials, shape = [], infos[0].shape
    for info in infos[1:-1]:
        shape = broadcast_static(shape, info.shape)
        partials.append(math.prod(shape))
    output = 0 if output_held else math.prod(out.shape)
    held = [partials[-1]] + [a + b - output for a, b in zip(partials, partials[1:])]
    return bits // 8 * max(0, *held)


def _fresh_output(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    return _temporaries(node, shapes, output_held=False)


def _held_output(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    return _temporaries(node, shapes, output_held=True)


RECORDS = tuple(Operator(op, workspace=_fresh_output, held_workspace=_held_output)
                for op in ("Sum", "Mean", "Max", "Min"))
