"""QDQ node units: a node a quantizer wrapped in DequantizeLinear -> node -> QuantizeLinear.

onnxruntime's optimizer turns each unit into one quantized kernel (QLinearConv, QLinearMatMul, ...)
at ORT_ENABLE_EXTENDED where it has one, and runs the node in float between the pairs where it
has none. Fusing the node into a com.microsoft operator hides the unit from it (a QDQ Conv + Relu
fused to FusedConv runs in float: benchmarks/results/quantized.md), and folding a node into a
neighbour across a pair moves a quantization step (not exact). So the float passes leave a unit
alone; qlinear-conv and qlinear-matmul form the standard quantized operators from whole units
(the pattern pieces and checks below), with onnxruntime's own preconditions.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, kept
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline

DEQUANTIZE = "DequantizeLinear"
QUANTIZE = "QuantizeLinear"


# why a pass that would turn a quantized node into a float com.microsoft operator leaves it
TO_ONNXRUNTIME = ("onnxruntime turns the unit into its quantized kernel itself (at ORT_ENABLE_EXTENDED); "
                  "fused here, it would run in float")


def _producer(tensor: gs.Tensor | None) -> gs.Node | None:
    return tensor.inputs[0] if tensor is not None and tensor.inputs else None


def qdq_unit_reason(node: gs.Node, g: GraphEditor, *, why: str) -> Decline | None:
    """Why `node` stays as the quantizer wrote it, or None where no input of it comes from a
    DequantizeLinear and no output goes to a QuantizeLinear. `why`: what a rewrite would break,
    and what the user can do."""
    dequantized = [t for t in node.inputs if getattr(_producer(t), "op", None) == DEQUANTIZE]
    quantized = [out for out in node.outputs if any(reader.op == QUANTIZE for reader in out.outputs)]
    if not dequantized and not quantized:
        return None
    parts = []
    if dequantized:
        parts.append("reads " + ", ".join(f"{t.name!r}" for t in dequantized[:3]) + " from DequantizeLinear"
                     + (f" (and {len(dequantized) - 3} more)" if len(dequantized) > 3 else ""))
    if quantized:
        parts.append(f"its output {quantized[0].name!r} goes to QuantizeLinear")
    return Decline(f"{node.name} is inside a QDQ node unit ({'; '.join(parts)}): {why}")


# ---- forming the standard quantized operators from a whole unit (passes/qlinear_*.py) ----

# (activation, weight, output) element types onnxruntime's CPU provider has QLinearConv and
# QLinearMatMul kernels for (probed with one-node sessions, onnxruntime 1.31: u8/s8 activations with
# s8 weights need the output in the activation's type; s8 activations need s8 weights)
KERNEL_TYPES = frozenset({("uint8", "uint8", "uint8"), ("uint8", "int8", "uint8"), ("int8", "int8", "int8")})
# a bias DequantizeLinear's scale against x_scale * w_scale: the same float32 product, whichever
# order a quantizer multiplied in
BIAS_SCALE_RTOL = 1e-6


def dequantized(name: str, *, const: bool = False) -> Op:
    """DequantizeLinear(name_q, name_scale, name_zero?) captured as name_dq; `const`: the quantized
    values must be a constant (a weight)."""
    return Op(DEQUANTIZE, Var(f"{name}_q", const=const), Var(f"{name}_scale", const=True),
              Var(f"{name}_zero", const=True, optional=True), name=f"{name}_dq")


def quantized(inner: Op) -> Op:
    """QuantizeLinear(inner, y_scale, y_zero?) named q, with a Relu between captured as relu: the
    Relu is exact to drop where the quantization's own clamp at the zero point does its work."""
    return Op(QUANTIZE, Alt(Op("Relu", inner, name="relu"), inner), Var("y_scale", const=True),
              Var("y_zero", const=True, optional=True), name="q")


def zero_point(m: Match, g: GraphEditor, name: str) -> gs.Tensor:
    """The captured zero point, or the zeros DequantizeLinear / QuantizeLinear assume without one
    (the QLinear operators take it as a required input)."""
    if m.tensor(f"{name}_zero") is not None:
        return m.tensor(f"{name}_zero")
    dtype = g.dtype(m.tensor(f"{name}_q")) if name != "y" else np.dtype(np.uint8)
    return g.constant(f"{m.node('q').name}_{name}_zero_point", np.zeros((), dtype))


def _dtype_name(m: Match, g: GraphEditor, name: str) -> str:
    if name == "y":
        zero = m.tensor("y_zero")
        return "uint8" if zero is None else str(g.dtype(zero))
    return str(g.dtype(m.tensor(f"{name}_q")))


def qlinear_unit_reason(m: Match, g: GraphEditor, node: gs.Node, activation: str, weight: str | None, *,
                        kernel_types: frozenset = KERNEL_TYPES, per_tensor: tuple[str, ...] = ()) -> Decline | None:
    """Why the unit DQ(activation), DQ(weight) -> node [-> Relu] -> Q cannot be one QLinear node on
    onnxruntime's CPU kernels, or None. Scales and zero points are constants (the pattern's).
    `kernel_types`: the (activation, weight, output) element types the kernel takes, or
    (activation, output) for a unit of one input (`weight` None); the activation, the output and
    `per_tensor` are quantized per tensor. The weight's own per-axis form is otherwise the pass's
    to check."""
    operands = tuple(n for n in (activation, weight) if n)
    types = tuple(_dtype_name(m, g, n) for n in (*operands, "y"))
    if types not in kernel_types:
        read = ", ".join(f"{n} {t}" for n, t in zip(operands, types))
        return Decline(f"{node.name}: onnxruntime's CPU provider has no quantized kernel for {read}, "
                       f"output {types[-1]}")
    for name in operands:
        dq = m.node(f"{name}_dq")
        if dq.attrs.get("block_size", 0):
            return Decline(f"{dq.name} is blockwise (block_size {dq.attrs['block_size']}): "
                           "no QLinear operator takes it")
    for name in (*operands, "y"):
        if constant_value(m.tensor(f"{name}_scale")).dtype != np.float32:
            return Decline(f"{node.name}: the {name} scale is not float32, which the QLinear operators need")
    for name in dict.fromkeys((activation, "y", *per_tensor)):
        for part in ("scale", "zero"):
            value = constant_value(m.tensor(f"{name}_{part}"))
            if value is not None and value.size != 1:
                return Decline(f"{node.name}: the {name} {part} has {value.size} values (per-axis); "
                               "the QLinear operators quantize an activation per tensor")
    if "relu" in m.nodes:
        zero = constant_value(m.tensor("y_zero"))
        floor = np.iinfo(np.dtype(types[-1])).min
        if (0 if zero is None else int(zero.reshape(-1)[0])) != floor:
            return Decline(f"{m.node('relu').name} clamps at 0 but {m.node('q').name}'s zero point is not "
                           f"{floor}: the quantization does not make the Relu redundant")
    return None


def bias_reason(m: Match, g: GraphEditor, node: gs.Node) -> Decline | None:
    """A quantized bias must be int32 at scale x_scale * w_scale with zero point 0 (the ONNX spec
    of QLinearConv's B); anything else is another computation."""
    if m.tensor("b_q") is None:
        return None
    scale, zero = constant_value(m.tensor("b_scale")), constant_value(m.tensor("b_zero"))
    if _dtype_name(m, g, "b") != "int32":
        return Decline(f"{node.name}'s bias is {_dtype_name(m, g, 'b')}, not int32")
    if zero is not None and np.any(zero != 0):
        return Decline(f"{node.name}'s bias has a zero point other than 0")
    expected = (constant_value(m.tensor("x_scale")).astype(np.float64)
                * constant_value(m.tensor("w_scale")).astype(np.float64)).reshape(-1)
    scale = scale.reshape(-1)
    if expected.size == 1:  # a per-tensor weight: one scale, or one repeated per channel
        expected = np.broadcast_to(expected, scale.shape)
    if scale.size not in (1, expected.size) or not np.allclose(scale, expected, rtol=BIAS_SCALE_RTOL, atol=0):
        return Decline(f"{node.name}'s bias scale is not x_scale * w_scale, the one a quantized bias has")
    return None


def shared_dequantizers(m: Match, g: GraphEditor) -> list[gs.Node]:
    """The unit's DequantizeLinear nodes another node reads too: kept for it (onnxruntime likewise
    gives each unit its own copy of a shared DequantizeLinear, EnsureUniqueDQForNodeUnit)."""
    return [kept(dq) for name, dq in m.nodes.items()
            if name.endswith("_dq") and (g.outside_readers(dq.outputs[0], m) or g.is_graph_output(dq.outputs[0]))]
