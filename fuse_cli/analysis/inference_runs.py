"""The copies of a model that shape inference runs on, and the runs.

onnx's inference reads a light copy (`inference_copy`): big payloads left out (the caller's model
is never touched, and models over protobuf's 2 GB limit still go through), nodes in execution
order, and the operators onnx has no inference for replaced by their records' stand-ins
(fuse_cli/ops/); the user's bindings are written into it (`bind`), and a run never raises
(`run_inference`): what fails is left unknown. onnxruntime's symbolic inference runs on a
weightless bound copy of its own (`runtime_symbolic_inference`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.inference_limits import unbounded_value
from fuse_cli.core.order import execution_order, model_fingerprint
from fuse_cli.core.tensors import payload_bytes
from fuse_cli.input_domain import input_dim_keys, is_placeholder
from fuse_cli.ops import DEFAULT_DOMAIN_STAND_INS, stand_ins

_NO_BINDINGS: Mapping = MappingProxyType({})

# Tensors above this size lose their payload in the inference copy. Inference reads values only
# for small shape-like constants (Reshape's shape, Slice's starts, ...); 1 KiB is 128 int64s.
_KEEP_PAYLOAD_BYTES = 1024
_STRIPPED_LOCATION = "<payload left out by fuse for shape inference>"


# Initializers above this many elements reach onnxruntime's symbolic inference as typed inputs:
# it needs their shapes, not their values (Reshape shapes and the like are small).
_SYMBOLIC_VALUE_LIMIT = 4096


def runtime_symbolic_inference(model: onnx.ModelProto, bindings: Mapping[str, int],
                                input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto | None:
    """onnxruntime's SymbolicShapeInference on a weightless, bound copy, or None when it cannot run."""
    graph = onnx.GraphProto(name=model.graph.name)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    listed = {vi.name for vi in graph.input}
    for tensor in model.graph.initializer:
        if math.prod(tensor.dims) <= _SYMBOLIC_VALUE_LIMIT and tensor.data_location != onnx.TensorProto.EXTERNAL:
            graph.initializer.append(tensor)
        elif tensor.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    stored = list(model.graph.node)
    graph.node.extend(stored[i] for i in _inference_order(model.graph))
    copy = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=max(model.ir_version, 4))
    copy.functions.extend(model.functions)
    add_missing_opset_imports(copy)
    bind(copy.graph, bindings, input_shapes, input_dim_keys(model))
    if unbounded_value(run_inference(copy, False)[0]) is not None:
        return None  # it computes values with numpy, without a cap (inference_limits.py)
    # When its inference is incomplete it saves the model as "sym_shape_infer_temp.onnx" with
    # external data files into the working directory before raising: run it in a scratch folder,
    # never in the user's.
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="fuse-shapes-") as scratch:
        os.chdir(scratch)
        inference = _symbolic_inference()
        try:
            # auto_merge: without it, any dim the exporter computed stops inference ("Incomplete").
            inferred = _onnxruntime_symbolic_infer(inference, copy)
        except Exception:  # noqa: BLE001 - it raises bare Exceptions, asserts, KeyErrors; onnx's path stands
            return None
        finally:
            os.chdir(cwd)
    return inferred


def _symbolic_inference():
    """onnxruntime's SymbolicShapeInference, auto_merge on: without it, any dim the exporter
    computed stops inference ("Incomplete")."""
    # sympy is a dependency of fuse for this import: onnxruntime uses it but does not declare it
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # Its "Unable to determine if ... treat as equal" warnings go to stderr through logging's
    # last-resort handler: noise for a user.
    logging.getLogger("onnxruntime.tools.symbolic_shape_infer").setLevel(logging.ERROR)
    return SymbolicShapeInference(2**31 - 1, True, False, 0)


def _onnxruntime_symbolic_infer(inference, model: onnx.ModelProto) -> onnx.ModelProto | None:
    """SymbolicShapeInference.infer_shapes' loop on our own instance; None when incomplete."""
    inference._preprocess(model)
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    return inference.out_mp_ if complete else None


# The light copies of the last models inferred: the audit infers one model at its bindings and
# unbound in a row. Recognised by id and fingerprint (an in-place edit makes a new copy).
_LIGHT_COPIES: list[tuple[int, bytes, onnx.ModelProto]] = []
_LIGHT_COPIES_KEPT = 2


def static_shapes_as_constants(copy: onnx.ModelProto, inferred: onnx.ModelProto) -> bool:
    """onnxruntime's own graph inference reads no computed values but one: a Shape of a tensor
    whose dims are all known, which its direct readers (Reshape, Expand, ConstantOfShape) see as
    that constant; a Concat, Gather or Slice of it is unknown to them again (one-node probes of
    onnxruntime 1.31's inferred output types). Such Shape nodes of `copy` become Constants holding
    their values, so that inference without data propagation knows what onnxruntime knows.
    Returns whether any did."""
    known: dict[str, list[int]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor_type = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tensor_type.HasField("shape") and all(
                d.HasField("dim_value") for d in tensor_type.shape.dim):
            known[vi.name] = [d.dim_value for d in tensor_type.shape.dim]
    changed = False
    for k, node in enumerate(copy.graph.node):
        if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or node.input[0] not in known:
            continue
        dims = known[node.input[0]]
        attrs = {a.name: a.i for a in node.attribute}
        values = dims[attrs.get("start", 0):attrs.get("end")]
        constant = helper.make_node("Constant", [], list(node.output), name=node.name,
                                    value=numpy_helper.from_array(np.array(values, np.int64)))
        copy.graph.node[k].CopyFrom(constant)
        changed = True
    return changed


def inference_copy(model: onnx.ModelProto, *, outputs_declared: bool = True) -> onnx.ModelProto:
    """A fresh light copy of `model` (see _light_copy), built once per model, its declared shapes
    (value_info) as the model has them now: unhold-buffers tries declarations on one model, and
    each would otherwise cost a copy of every node."""
    fingerprint = model_fingerprint(model, declared=False)
    # By id and fingerprint, not holding the model (its weights): an id reused by a model of the
    # same structure gets the same light copy, which is right for it too.
    light = next((c for i, f, c in _LIGHT_COPIES if i == id(model) and f == fingerprint), None)
    if light is None:
        light = _light_copy(model)
        _LIGHT_COPIES.insert(0, (id(model), fingerprint, light))
        del _LIGHT_COPIES[_LIGHT_COPIES_KEPT:]
    copy = onnx.ModelProto()
    copy.CopyFrom(light)  # bindings are written into it: the cached one stays unbound
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(model.graph.value_info)
    if not outputs_declared:
        outputs_inferred(copy.graph)
    return copy


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with what shape inference needs and no big payloads.

    Always light, not only above 2 GB: it halves peak memory on big models, and small and huge
    models then go through the same code path.
    """
    # IR < 4 requires every initializer to be listed as a graph input; fuse's in-memory model
    # has them set aside (they are constants there), so infer under IR 4 rules.
    copy = onnx.ModelProto(ir_version=max(model.ir_version, 4))
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    copy.graph.CopyFrom(_light_graph(model.graph, opset))
    add_missing_opset_imports(copy)
    return copy


def outputs_inferred(graph: onnx.GraphProto) -> None:
    """Graph outputs declared with a dim name no input carries lose their declared shape (not
    their type): inference sizes them from the inputs. For the sizes of the memory estimate only
    (the proofs and the planner keep a declared name: a decode step's present output names
    `past_sequence + sequence`, which the mask's proofs need). An exporter's guess is no size:
    ddddocr's CRNN declares its output [1, seqlen], rank 2, where it computes [T, 1, 8210], and the
    declaration hid the tail's size from the estimate (0.78-0.85 of the allocator after fusion)."""
    carried = {d.dim_param for value in graph.input for d in value.type.tensor_type.shape.dim if d.dim_param}
    names = {n for param in carried for n in _NAME.findall(param)}
    for output in graph.output:
        shape = output.type.tensor_type.shape if output.type.HasField("tensor_type") else None
        if shape is not None and any(d.dim_param and d.dim_param not in carried
                                     and not set(_NAME.findall(d.dim_param)) <= names | _FUNCTIONS
                                     for d in shape.dim):
            output.type.tensor_type.ClearField("shape")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_FUNCTIONS = {"floor", "ceil", "ceiling", "min", "max", "Min", "Max"}  # torch's and sympy's arithmetic


def _light_graph(graph: onnx.GraphProto, opset: int) -> onnx.GraphProto:
    # Recursion here follows subgraph nesting (If inside Loop...), a handful of levels, never
    # the node count.
    light = onnx.GraphProto(name=graph.name)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    light.sparse_initializer.extend(graph.sparse_initializer)
    light.initializer.extend(_light_tensor(t) for t in graph.initializer)
    stored = list(graph.node)
    nodes: list[onnx.NodeProto] = []
    for i in _inference_order(graph):
        node = stored[i]
        # onnx has no inference for onnxruntime's operators: their records' stand-ins (fuse_cli/ops/)
        if node.domain not in ("", "ai.onnx") or node.op_type in DEFAULT_DOMAIN_STAND_INS:
            replaced = stand_ins(node, opset)
            if replaced:
                nodes.extend(replaced)
                continue
        nodes.append(_light_node(node, opset) if node.attribute else node)
    light.node.extend(nodes)  # one extend: per-node extends cost a third of the copy at 12k nodes
    return light


def _inference_order(graph: onnx.GraphProto) -> Sequence[int]:
    """onnx infers nodes in stored order and never revisits one whose input was not inferred
    yet, so an unsorted graph would lose every shape downstream of the first misplaced node."""
    try:
        return execution_order(graph)
    except ValueError:
        # A cycle: no order is right. The liveness walk reports it; here, infer what we can.
        return range(len(graph.node))


_HEAVY_ATTRIBUTES = (
    onnx.AttributeProto.TENSOR,
    onnx.AttributeProto.GRAPH,
    onnx.AttributeProto.GRAPHS,
)


def _light_node(node: onnx.NodeProto, opset: int) -> onnx.NodeProto:
    if not any(a.type in _HEAVY_ATTRIBUTES for a in node.attribute):
        return node
    light = onnx.NodeProto(name=node.name, op_type=node.op_type, domain=node.domain)
    light.input.extend(node.input)
    light.output.extend(node.output)
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            light.attribute.add(name=attr.name, type=attr.type).t.CopyFrom(_light_tensor(attr.t))
        elif attr.type == onnx.AttributeProto.GRAPH:
            light.attribute.add(name=attr.name, type=attr.type).g.CopyFrom(_light_graph(attr.g, opset))
        elif attr.type == onnx.AttributeProto.GRAPHS:
            new = light.attribute.add(name=attr.name, type=attr.type)
            new.graphs.extend(_light_graph(g, opset) for g in attr.graphs)
        else:
            light.attribute.append(attr)
    return light


def _light_tensor(tensor: TensorProto) -> TensorProto:
    """The tensor itself when small; otherwise its name, type and dims, marked external.

    Marked external rather than just emptied: an operator whose inference did read the values
    then fails cleanly ("cannot parse external data") and its output stays unknown, instead of
    being inferred from an empty payload.
    """
    if _payload_bytes(tensor) <= _KEEP_PAYLOAD_BYTES:
        return tensor
    light = TensorProto(name=tensor.name, data_type=tensor.data_type)
    light.dims.extend(tensor.dims)
    light.data_location = TensorProto.EXTERNAL
    light.external_data.add(key="location", value=_STRIPPED_LOCATION)
    return light


def _payload_bytes(tensor: TensorProto) -> int:
    size = payload_bytes(tensor)
    return tensor.ByteSize() if size is None else size


def add_missing_opset_imports(model: onnx.ModelProto) -> None:
    """onnx's inference aborts the WHOLE model (even with strict_mode=False) on one node whose
    custom domain has no opset import. Declaring the domain at version 1 turns that into one
    node with unknown outputs. The default domain cannot be guessed and is left alone."""
    imported = {op.domain for op in model.opset_import}
    graphs = [model.graph]
    used: set[str] = set()
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            used.add(node.domain)
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)
    for domain in sorted(used - imported - {"", "ai.onnx"}):
        model.opset_import.add(domain=domain, version=1)


def bind(
    graph: onnx.GraphProto, bindings: Mapping[str, int], input_shapes: Mapping[str, Sequence[int]],
    keys: Mapping[tuple[str, int], str] = _NO_BINDINGS,
) -> None:
    """Write the bindings into the (copied) graph's declared types, where inference starts: by
    name, then each input position bound by its position key."""
    by_position = {(name, index): bindings[key] for (name, index), key in keys.items() if key in bindings}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in bindings:
                d.dim_value = bindings[d.dim_param]
            elif by_position and d.HasField("dim_param") and is_placeholder(d.dim_param):
                # a '?' elsewhere names no size once its input positions took different ones
                d.ClearField("dim_param")
    for vi in graph.input:
        for index, d in enumerate(vi.type.tensor_type.shape.dim):
            if (vi.name, index) in by_position:
                d.dim_value = by_position[(vi.name, index)]
    for vi in graph.input:
        if vi.name in input_shapes and vi.type.HasField("tensor_type"):
            # Sets anonymous dims too, and gives a rank to inputs declared without a shape.
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for value in input_shapes[vi.name]:
                shape.dim.add(dim_value=value)


def run_inference(model: onnx.ModelProto, data_propagation: bool = True) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """Best effort, never raising: data propagation first (it resolves Shape->Gather->Reshape
    chains to concrete dims), then plain inference, then the declared types alone.

    strict_mode stays off: in strict mode the first failing node aborts everything, whereas
    non-strict mode just leaves that node's outputs unknown.
    """
    warnings: list[str] = []
    if data_propagation:
        # Values are computed only where none is too large to hold (inference_limits.py).
        plain, warnings = run_inference(model, False)
        reason = "the inference without it failed" if warnings else unbounded_value(plain)
        if reason is not None:
            return plain, (*warnings, f"onnx data propagation skipped: {reason}")
    for options in ({"data_prop": True}, {}) if data_propagation else ({},):
        try:
            return onnx.shape_inference.infer_shapes(model, **options), tuple(warnings)
        # onnx's C++ layer raises InferenceError, ValidationError, SchemaError, RuntimeError or
        # ValueError depending on what broke; any of them only means "less is known".
        except Exception as exc:  # noqa: BLE001
            what = "with data propagation" if options else "without data propagation"
            warnings.append(f"onnx shape inference failed {what}: {_first_line(exc)}")
    return model, tuple(warnings)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
