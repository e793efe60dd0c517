"""Shapes as onnxruntime's allocation planner compares them (`planner_shapes`).

The shapes the planner compares (planner.py) are onnxruntime's own graph inference, which differs
from onnx's (`infer_shapes`) in ways that decide whether buffers are shared:
- onnx names each dim it cannot infer with a placeholder of its own (unk__N) and then carries that
  placeholder where onnxruntime, which makes none, takes another input's name: Concat's merge of
  an unknown dim with `batch` is `batch` in onnxruntime, unk__N in onnx, and so is everything
  downstream. fuse redoes Concat's and broadcasting's merges on the placeholder dims and passes
  the result through (`ShapeTable.placeholders` says which unknown dim onnx copied from which);
- onnx's data propagation reads the values of shape tensors computed at run time (Shape ->
  Gather -> Concat -> Reshape) and names the result's dims; onnxruntime's graph inference reads
  no such values: a runtime-shaped Reshape is [?, ?, ?] there, and so is whatever is inferred
  from it. Where a model has such a node, onnx's inference runs once more without data
  propagation and its unknown dims are marked as placeholders to redo;
- a shape the model declares (value_info, graph outputs) is where onnxruntime's inference merges
  into (NodeArg::UpdateTypeAndShape, onnx's mergeInShapeInfo: an inferred value fills or wins,
  a declared name stands where the inference knows nothing): declared dims are never redone.
  Exporters that write value_info (torch's dynamo exporter) thus keep `batch` through attention
  blocks whose inference alone would lose it.
Evidence (onnxruntime 1.31.1 CPU, DISABLE_ALL): each node output made a graph output (with no
shape but what value_info declares) and read back from the session: equal to `planner_shapes` for every tensor whose
planner key is known on timm deit-tiny opset 13 fused for onnx and ort-cpu (503 tensors); for
every float tensor of 64 KiB or more at batch 1 on the held-out hf-vit-tiny, bert-small,
gpt2-small, llama-gqa (opset 14 and dynamo), qwen2-small dynamo, t5-encoder opset 14 and
whisper-encoder dynamo exports, before fusion and fused for onnx and ort-cpu, but one tensor
of gpt2-small opset 14 (onnxruntime does fold shape values that are wholly static, such as
Shape of a [4] tensor: not modelled). Dynamo exports of hf-vit-tiny, gpt2-small, qwen2-small
and llama-gqa went from 0.75-0.89x (0.35-0.5x fused) to 1.00x at their large settings.
deit-tiny's fused form at batch 1 measured 4.8 MiB, which
the old table put at 2.45 (it found no buffer to share) and this one at 4.92.

Operators onnx cannot infer (com.microsoft FusedMatMul, FusedConv, FusedGemm, Gelu and its
kin, SkipLayerNormalization, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding;
onnxruntime's internal SimplifiedLayerNormalization and LayerNormalization before opset 17) are
inferred through standard stand-ins (shapes.py, from each operator's record in ops/), as
onnxruntime's own schemas infer them. The
planner depends on it: MultiHeadAttention's output is [query[0], query[1], value[2]], or
value[1] * value[3] for a [B, N, L, H] value; a stand-in that made it 4-D lost every shape after
attention, so the estimate shared no buffer there, while onnxruntime gave the MLP of the next
layer the dead MLP buffers of the one before, held across the attention in between. The opset 17
Llama and Qwen2 decode exports fused for ort-cpu at batch 16, 128 new and 128 cached positions
estimated 25.05 MiB and measured 33.06 and 33.3 (three [16, 128, 344] buffers held); now 33.11
and 33.30 (tests/test_analysis_measure.py, test_attention_output_shape_lets_buffers_be_held_across_it).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import onnx

from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, element_size_bits, infer_shapes
from fuse_cli.core.order import execution_order
from fuse_cli.ops import domain_of

# Operators whose inference broadcasts its inputs' dims (onnx's multidirectional broadcasting).
_BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater",
    "GreaterOrEqual", "Less", "LessOrEqual", "Where", "Max", "Min", "Sum", "Mean", "PRelu",
    "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})


def planner_shapes(model: onnx.ModelProto, symbolic: ShapeTable | None = None) -> dict[str, TensorInfo]:
    """Every top-level tensor's shape as onnxruntime's allocation planner compares it (see the
    module docstring); `symbolic`: infer_shapes(model) when the caller has it."""
    stored = list(model.graph.node)
    nodes = [stored[i] for i in execution_order(model.graph)]
    return planner_shapes_in_order(model, nodes, symbolic if symbolic is not None else infer_shapes(model))


def planner_shapes_in_order(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
                            symbolic: ShapeTable) -> dict[str, TensorInfo]:
    """planner_shapes of `model` whose nodes, in a topological order, are `nodes` (any such order
    propagates the same dims)."""
    return _planner_shapes(nodes, _without_data_propagation(model, nodes, symbolic), _declared_dims(model.graph))


def _declared_dims(graph: onnx.GraphProto) -> dict[str, tuple[bool, ...]]:
    """Per tensor the model declares a shape for (value_info, graph outputs): which dims it
    names or gives a value."""
    declared = {}
    for vi in (*graph.value_info, *graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            declared[vi.name] = tuple(d.HasField("dim_value") or bool(d.dim_param)
                                      for d in vi.type.tensor_type.shape.dim)
    return declared


def _planner_shapes(nodes: Sequence[onnx.NodeProto], symbolic: ShapeTable,
                    declared: Mapping[str, tuple[bool, ...]]) -> dict[str, TensorInfo]:
    """Shapes as onnxruntime's own graph inference leaves them (see "Shapes" in the module
    docstring): `symbolic`, less what onnx's placeholders added, redone downstream of every
    tensor that changed, except the dims the model declares."""
    shapes = dict(symbolic.tensors)
    raw = symbolic.placeholders
    changed: set[str] = set()
    for node in nodes:
        touched = bool(changed) and any(name in changed for name in node.input)
        for name in node.output:
            info = shapes.get(name)
            if info is None or info.shape is None or (name not in raw and not touched):
                continue
            kept = declared.get(name)
            if kept is not None and (len(kept) != len(info.shape) or all(kept)):
                continue
            if name in raw and raw[name] is None:
                dims = None
            else:
                placeholders = raw.get(name) or (None,) * len(info.shape)
                dims = _runtime_dims(node, placeholders, info.shape, shapes, raw, touched)
                if kept is not None:
                    dims = tuple(d if keep else new for d, new, keep in zip(info.shape, dims, kept))
            if dims != info.shape:
                changed.add(name)
                shapes[name] = TensorInfo(name, info.elem_type, dims)
    return shapes


# Operators whose output shape is read from the values of an input (its index): where that
# input is computed at run time, onnx's data propagation names the output's dims and
# onnxruntime's inference does not.
SHAPE_VALUE_INPUT: Mapping[str, int] = MappingProxyType({
    "Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Slice": 2, "Range": 1, "Resize": 3,
})


def _without_data_propagation(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
                              symbolic: ShapeTable) -> ShapeTable:
    """`symbolic` with the dims onnx's data propagation named, and onnxruntime's inference does
    not, marked as placeholders (so `_planner_shapes` redoes them): onnx inferred once more without
    data propagation, only when some shape is read from a value computed at run time."""
    shape_inputs = {node.input[index] for node in nodes
                    if (index := SHAPE_VALUE_INPUT.get(node.op_type)) is not None and len(node.input) > index
                    and domain_of(node) == ""}
    if shape_inputs:  # computed: written by a node, not a Constant
        shape_inputs &= set(itertools.chain.from_iterable(node.output for node in nodes))
        shape_inputs -= {name for node in nodes if node.op_type == "Constant" and domain_of(node) == ""
                         for name in node.output}
    if not shape_inputs:
        return symbolic
    plain = infer_shapes(model, data_propagation=False)
    placeholders = dict(symbolic.placeholders)
    for name, raw in plain.placeholders.items():
        info = symbolic.get(name)
        # The run's own unk__N names, kept apart from those of the table's inference.
        placeholders[name] = None if raw is None else tuple(None if r is None else f"~{r}" for r in raw)
        if info is not None and info.shape is not None and raw is not None and len(raw) != len(info.shape):
            placeholders[name] = None
    return dataclasses.replace(symbolic, placeholders=MappingProxyType(placeholders))


def _runtime_dims(node: onnx.NodeProto, raw: tuple, known: tuple, shapes: Mapping[str, TensorInfo],
                  raw_of: Mapping[str, tuple], touched: bool) -> tuple:
    """One output's dims as onnxruntime infers them: where onnx wrote a placeholder (or, when an
    input changed, a name), what the operator's inference makes of its inputs' dims as
    onnxruntime sees them."""
    inputs = None   # (shape info, placeholders) of each input, read on first need
    passed = None   # each input placeholder's dim as onnxruntime sees it, the first input's first
    rank = len(known)
    dims = list(known)
    op = node.op_type if domain_of(node) == "" else ""
    for index, (dim, placeholder) in enumerate(zip(known, raw)):
        if placeholder is None and (not touched or not isinstance(dim, str)):
            continue
        if inputs is None:
            inputs = [(shapes.get(i), raw_of.get(i)) for i in node.input if i]
        if placeholder is None:
            if op not in _BROADCAST_OPS and op != "Concat" and not (op == "MatMul" and index < rank - 2):
                # A name survives only where an input still carries it.
                carried = any(info is not None and info.shape is not None and dim in info.shape for info, _ in inputs)
                dims[index] = dim if carried else None
                continue
        if op in _BROADCAST_OPS or op == "MatMul" and index < rank - 2:
            aligned = [info.shape[len(info.shape) - rank + index] for info, _ in inputs
                       if info is not None and info.shape is not None and len(info.shape) >= rank - index
                       and (op != "MatMul" or len(info.shape) - rank + index < len(info.shape) - 2)]
            dims[index] = _broadcast_dim(aligned)
        elif op == "Concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % max(rank, 1)
            ranked = [info.shape for info, _ in inputs if info is not None and info.shape is not None
                      and len(info.shape) == rank]
            dims[index] = None if index == axis else _first_known(shape[index] for shape in ranked)
        else:  # a dim passed through: the input dim onnx copied it from
            if passed is None:
                passed = {}
                for info, source in inputs:
                    if info is not None and source is not None and info.shape is not None \
                            and len(info.shape) == len(source):
                        for d, value in zip(source, info.shape):
                            passed.setdefault(d, value)
            dims[index] = passed.get(placeholder)
    return tuple(dims)


def _broadcast_dim(dims: Sequence) -> int | str | None:
    """onnx's multidirectional broadcasting of one axis, with None for a dim nothing names."""
    value, names = 1, set()
    for d in dims:
        if isinstance(d, int):
            value = d if d != 1 else value
        else:
            names.add(d)
    if value != 1 or not names:
        return value
    return names.pop() if len(names) == 1 else None


def _first_known(dims: Iterable) -> int | str | None:
    """onnx's mergeInDimensionInfo over several inputs: a value wins, else the first name."""
    name = None
    for d in dims:
        if isinstance(d, int):
            return d
        if name is None and d is not None:
            name = d
    return name


def _planner_key(info: TensorInfo | None) -> tuple | None:
    """What the planner's SameSize compares: element size and shape, no dim bound. None when it
    matches nothing: unknown rank or type, a string, a dim shape inference could not name."""
    if info is None or info.shape is None or any(d is None for d in info.shape):
        return None
    bits = element_size_bits(info.elem_type)  # None for strings, which are never reused
    return None if bits is None else (bits, info.shape)


def planner_keys(names: Iterable[str], planner: Mapping[str, TensorInfo]) -> dict[str, tuple | None]:
    """_planner_key of each name, computed once per distinct (type, shape): a few hundred at 12k nodes."""
    by_shape: dict[tuple, tuple | None] = {}
    keys: dict[str, tuple | None] = {}
    for name in names:
        info = planner.get(name)
        if info is None:
            keys[name] = None
            continue
        shape = (info.elem_type, info.shape)
        if shape not in by_shape:
            by_shape[shape] = _planner_key(info)
        keys[name] = by_shape[shape]
    return keys

