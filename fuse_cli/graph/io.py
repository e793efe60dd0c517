"""Reading model files without losing anything a user relies on (writing them: graph/save.py).

What must survive a round trip: graph input/output names, dtypes and shapes, the IR version (onnx
1.23 helpers stamp IR 14 while onnxruntime 1.31 accepts <= 13), opset imports, metadata, doc
strings and model-local functions. The approach: passes edit only the graph, and `assemble_model`
puts the original ModelProto's shell around the exported, optimized graph.

Big weights (graph/weights.BIG_WEIGHT_BYTES and up, initializers of the main graph) are never
read at load: embedded ones are left in the model file and referenced there (weights.read_model),
external ones have their extent checked. Every such reference is made absolute, so a model in
memory says where each weight is wherever it goes. graphsurgeon maps a weight only when a pass
reads its values, the new weights of a candidate are parked in a scratch file (weights.ParkingLot),
onnxruntime maps the files itself (core/sessions.py), and graph/save.py copies the bytes from file
to file: a weight no pass touches is never held in memory.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import DecodeError
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor

from fuse_cli import __version__
from fuse_cli.core.order import execution_order
from fuse_cli.core.tensors import payload_bytes
from fuse_cli.core.domains import default_opset_or_none, is_default_domain
from fuse_cli.errors import ModelLoadError
from fuse_cli.graph import weights
from fuse_cli.graph.checks import check_model, check_tensor_size, dense_from_sparse
from fuse_cli.graph.walk import all_graphs
from fuse_cli.graph.edit import every_tensor
from fuse_cli.graph.weights import LoadedValues, MappedValues

# protobuf refuses to serialize a message of 2 GiB or more; leave headroom for the graph itself
# (graph/save.py writes above it as external data; a sparse weight densified past it is refused).
INLINE_SAVE_LIMIT_BYTES = 1_800_000_000


@dataclass
class LoadedModel:
    """A parsed model plus what was set aside so the passes see only true constants.

    `input_defaults` holds initializers that are also graph inputs (IR >= 4): a caller may feed
    them, so they are defaults, not constants. They are kept out of the graph the passes see and
    put back on save.
    """

    path: Path
    model: onnx.ModelProto
    input_defaults: dict[str, onnx.TensorProto] = field(default_factory=dict)
    file_bytes: int = 0
    external_files: tuple[Path, ...] = ()  # the side files its weights are read from (not the model file)

    @property
    def external(self) -> bool:
        """Did the user keep the weights in external data? The output then does too."""
        return bool(self.external_files)


def load_model(path: str | os.PathLike, *, freeze_inputs: bool = False) -> LoadedModel:
    """Parse and sanity-check a model file; every failure is a one-line ModelLoadError."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX file")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"{path}: file is empty")
    try:
        model = _read(path)
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise ModelLoadError(f"{path}: not a readable ONNX model ({first_line(exc)})") from exc
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{path}: not an ONNX model (no graph found)")
    _check_text_fields(model, path)
    _check_opsets(model, path)
    external_files = _check_external_data_locations(model, path)
    try:
        _load_external_data(model, path.parent)
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ModelLoadError(f"{path}: cannot read external data ({first_line(exc)})") from exc
    _anchor_references(model, path.parent)
    _check_graph_wiring(model.graph, path)
    check_model(model, path)  # impossible sizes, self-reads; densifies a Constant's sparse_value
    _densify_sparse_initializers(model, path)
    try:
        execution_order(model.graph)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: invalid graph: {first_line(exc)}") from exc
    _check_tensor_payloads(model, path)
    _check_attribute_types(model, path)
    loaded = LoadedModel(path=path, model=model, file_bytes=size, external_files=external_files)
    _separate_initializer_inputs(loaded, freeze_inputs)
    return loaded


def _densify_sparse_initializers(model: onnx.ModelProto, path: Path) -> None:
    """Sparse initializers (of every graph) become dense ones of the same name and dtype.
    graphsurgeon reads a sparse initializer's raw_data values as zeros and exports it as a dense
    float64 tensor (onnxruntime then refuses Add(float, double)); dense, every pass can read it.
    Their values are in memory by now (_load_external_data read any external ones, from the
    model's folder only). A Constant's sparse_value is graph/checks.py's."""
    for graph in all_graphs(model.graph):
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            check_tensor_size(name, list(sparse.dims), path)
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(sparse.values.data_type).itemsize
            if math.prod(sparse.dims) * itemsize > INLINE_SAVE_LIMIT_BYTES:
                raise ModelLoadError(f"{path}: sparse initializer {name!r} is "
                                     f"{math.prod(sparse.dims) * itemsize / 2**30:.1f} "
                                     f"GB dense; fuse writes sparse initializers dense and holds at most 1.8 GB of one")
            try:
                dense = dense_from_sparse(sparse)
            except (ValueError, IndexError, TypeError) as exc:
                raise ModelLoadError(f"{path}: sparse initializer {name!r} is malformed ({first_line(exc)})") from exc
            graph.initializer.append(onnx.numpy_helper.from_array(dense, name))
        del graph.sparse_initializer[:]


def load_graph(loaded: LoadedModel) -> gs.Graph:
    """The model's graph in graphsurgeon; weights left in external data load on first use."""
    graph = gs.import_onnx(loaded.model)
    # every scope's: a weight of the main graph read only inside a branch is found there alone
    for tensor in every_tensor(graph):
        if isinstance(tensor, gs.Constant) and type(tensor._values) is gs.ir.tensor.LazyValues:
            proto = tensor._values.tensor
            if is_external(proto):
                tensor._values = MappedValues(_copied(proto))  # a reference: no payload to copy
                # graphsurgeon would stamp EXTERNAL on the inline tensor it exports for loaded values
                tensor.data_location = None
            else:
                tensor._values = LoadedValues(proto)
    return graph


def read_original(path: str | os.PathLike) -> onnx.ModelProto:
    """The model as its file has it, big weights by reference (see load_model): what verification
    runs the original from, without a copy of its weights. For a file load_model accepted."""
    path = Path(path)
    model = _read(path)
    _load_external_data(model, path.parent)
    _anchor_references(model, path.parent)
    return model


def _read(path: Path) -> onnx.ModelProto:
    try:
        return weights.read_model(path)
    except ValueError:
        # not the protobuf the reader expects: onnx's own parser says what is wrong with it
        return onnx.load_model(str(path), load_external_data=False)


def _anchor_references(model: onnx.ModelProto, folder: Path) -> None:
    """Locations of the weights left in files, made absolute (load_model refused any that leave
    the model's folder before this)."""
    base = folder.resolve()
    for tensor in model.graph.initializer:
        if is_external(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = str(base / entry.value)


def unload_unchanged_weights(graph: gs.Graph) -> None:
    """Before export: a weight whose values a pass only looked at (still the file mapping) goes
    back to its external-data reference, so the export does not copy it into memory."""
    for tensor in every_tensor(graph):
        if isinstance(tensor, gs.Constant):
            source = getattr(tensor._values, "fuse_lazy_source", None)
            if source is not None:
                tensor._values = source


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _load_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Read external data into the model, except big weights of the main graph, whose extent in
    their file is checked instead (they load lazily, see `load_graph`)."""
    for tensor in model.graph.initializer:
        if is_external(tensor):
            if threshold_bytes(tensor) >= weights.BIG_WEIGHT_BYTES:
                _check_external_extent(tensor, folder)
            else:
                load_external_data_for_tensor(tensor, str(folder))
    for tensor in all_tensors(model, main_initializers=False):
        if is_external(tensor):
            load_external_data_for_tensor(tensor, str(folder))
            # now held in memory: as onnx.load_external_data_for_model leaves a tensor it read
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


def _check_external_extent(tensor: onnx.TensorProto, folder: Path) -> None:
    """What reading the tensor would check, without reading it: the file holds its bytes."""
    info = ExternalDataInfo(tensor)
    needed = threshold_bytes(tensor)
    if info.length is not None and info.length != needed:
        raise ValueError(f"tensor {tensor.name!r} has {info.length} bytes of external data, its shape "
                         f"{list(tensor.dims)} needs {needed}")
    size = (folder / info.location).stat().st_size
    if (info.offset or 0) + needed > size:
        raise ValueError(f"external data of {tensor.name!r} runs past the end of {info.location}")


def threshold_bytes(tensor: onnx.TensorProto) -> int:
    """Strings count a byte an element: a size for thresholds, never for external data offsets."""
    size = payload_bytes(tensor)
    return math.prod(tensor.dims) if size is None else size


def _check_text_fields(model: onnx.ModelProto, path: Path) -> None:
    """protobuf parses string fields without checking UTF-8 and raises on first access instead,
    which could be anywhere later: read every string once, here, and fail with one clear line."""
    try:
        _read_strings(model)
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path}: not a valid ONNX model (a text field is not UTF-8: {exc.reason})") from exc


def _read_strings(message) -> None:
    for descriptor, value in message.ListFields():
        items = value if descriptor.is_repeated else (value,)
        if descriptor.type == descriptor.TYPE_MESSAGE:
            for item in items:
                _read_strings(item)
        elif descriptor.type == descriptor.TYPE_STRING:
            for item in items:
                # protobuf hands back bytes for a string field that is not valid UTF-8
                if isinstance(item, bytes):
                    item.decode("utf-8")


_TYPED_FIELD = {
    onnx.TensorProto.FLOAT: ("float_data", 1), onnx.TensorProto.DOUBLE: ("double_data", 1),
    onnx.TensorProto.INT64: ("int64_data", 1), onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1), onnx.TensorProto.STRING: ("string_data", 1),
    onnx.TensorProto.COMPLEX64: ("float_data", 2), onnx.TensorProto.COMPLEX128: ("double_data", 2),
}


def _check_tensor_payloads(model: onnx.ModelProto, path: Path) -> None:
    """Every weight must hold exactly as many values as its dims say: a mismatch would surface
    much later as a reshape error deep inside a pass."""
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        try:
            bits = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * 8
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} has unknown data type {tensor.data_type}") from None
        if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4,
                                getattr(onnx.TensorProto, "FLOAT4E2M1", -1)):
            bits = 4
        count = 1
        for dim in tensor.dims:
            if dim < 0:
                raise ModelLoadError(f"{path}: tensor {tensor.name!r} has a negative dimension {list(tensor.dims)}")
            count *= dim
        if tensor.HasField("raw_data"):
            # strings cannot be stored raw (onnx.proto): only string_data holds them
            ok = tensor.data_type != onnx.TensorProto.STRING and len(tensor.raw_data) == (count * bits + 7) // 8
        else:
            field_name, per_value = _TYPED_FIELD.get(tensor.data_type, ("int32_data", 1))
            stored = len(getattr(tensor, field_name))
            ok = stored == count * per_value or (bits == 4 and stored == (count + 1) // 2)
        if not ok:
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} holds a different number of values than its "
                                 f"shape {list(tensor.dims)} needs")


def _check_attribute_types(model: onnx.ModelProto, path: Path) -> None:
    """A standard operator's input count and attribute types must fit its schema (passes read them
    as such). Operators without a schema here (custom domains, onnxruntime's own) are left alone."""
    opset = default_opset_or_none(model)
    if opset is None:
        return
    for node in model.graph.node:
        if not is_default_domain(node.domain):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        inputs = len(node.input)
        while inputs and not node.input[inputs - 1]:
            inputs -= 1  # trailing optional inputs left empty
        if not schema.min_input <= inputs <= schema.max_input:
            raise ModelLoadError(
                f"{path}: invalid graph: node {node.name or node.op_type!r} ({node.op_type}-{schema.since_version}) "
                f"has {inputs} inputs, its schema takes {schema.min_input} to {schema.max_input}")
        for attr in node.attribute:
            declared = schema.attributes.get(attr.name)
            if declared is not None and attr.type != declared.type.value:
                raise ModelLoadError(
                    f"{path}: invalid graph: node {node.name or node.op_type!r} has attribute {attr.name!r} of type "
                    f"{onnx.AttributeProto.AttributeType.Name(attr.type)}, its schema says "
                    f"{onnx.AttributeProto.AttributeType.Name(declared.type.value)}")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def _check_external_data_locations(model: onnx.ModelProto, path: Path) -> tuple[Path, ...]:
    """The one place that decides where an external byte may come from: the model's own folder,
    symlinks resolved. Refuses paths that leave it (`../../etc/passwd`, absolute paths, symlinks
    pointing elsewhere). Every tensor that may name external data is checked (all_tensors: dense
    and sparse initializers, attribute tensors, in every subgraph and function), and every read
    that follows (_load_external_data, weights.MappedValues) resolves against that folder, never
    the working directory."""
    base = path.parent.resolve()
    files: dict[Path, None] = {}
    for tensor in all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location == path.name:
            continue  # an embedded weight left in the model file (weights.read_model)
        if not location or os.path.isabs(location):
            raise ModelLoadError(f"{path}: external data of {tensor.name!r} has an absolute or empty location: refused")
        try:
            target = (base / location).resolve()
        except (OSError, ValueError):  # a NUL byte, a symlink loop
            target = None
        if target is None or (base != target and base not in target.parents):
            raise ModelLoadError(f"{path}: external data of {tensor.name!r} points outside the model's folder "
                                 f"({location}): refused")
        files[target] = None
    return tuple(files)


def all_initializers(model: onnx.ModelProto):
    """Initializers of the main graph and of every subgraph (If/Loop/Scan bodies)."""
    return (t for graph in all_graphs(model.graph) for t in graph.initializer)


def all_tensors(model: onnx.ModelProto, *, main_initializers: bool = True):
    """Every tensor that may hold external data, in all graphs and model-local functions: dense
    and sparse initializers (a sparse one's values and indices are tensors of their own) and node
    attribute tensors, dense and sparse (a superset of what onnx.load_external_data_for_model
    reads)."""
    graphs = all_graphs(model.graph)
    main = next(graphs)
    if main_initializers:
        yield from main.initializer
    yield from _sparse_parts(main.sparse_initializer)
    for graph in graphs:
        yield from graph.initializer
        yield from _sparse_parts(graph.sparse_initializer)
    for body in all_graphs(model.graph, *model.functions):
        for node in body.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield from _sparse_parts([attr.sparse_tensor])
                yield from _sparse_parts(attr.sparse_tensors)


def _sparse_parts(sparse_tensors):
    for sparse in sparse_tensors:
        yield sparse.values
        yield sparse.indices


def node_count(graph: onnx.GraphProto) -> int:
    """Nodes of `graph` and of every If/Loop/Scan body in it (a model may be one If around all)."""
    return sum(len(body.node) for body in all_graphs(graph))


def _check_opsets(model: onnx.ModelProto, path: Path) -> None:
    known = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if is_default_domain(opset.domain) and opset.version > known:
            raise ModelLoadError(
                f"{path}: model uses ONNX opset {opset.version}, newer than the installed onnx "
                f"{onnx.__version__} knows (up to {known}); upgrade onnx"
            )
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"{path}: IR version {model.ir_version} is newer than the installed onnx supports ({onnx.IR_VERSION})"
        )


def _check_graph_wiring(graph: onnx.GraphProto, path: Path) -> None:
    """Every tensor a top-level node reads must be produced somewhere, and produced once."""
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    produced |= {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        for out in node.output:
            if not out:
                continue
            if out in produced:
                raise ModelLoadError(f"{path}: invalid graph: tensor {out!r} is produced twice")
            produced.add(out)
    for node in graph.node:
        for name in node.input:
            if name and name not in produced:
                label = node.name or node.op_type
                raise ModelLoadError(f"{path}: invalid graph: node {label!r} reads {name!r}, which nothing produces")
    for out in graph.output:
        if out.name not in produced:
            raise ModelLoadError(f"{path}: invalid graph: graph output {out.name!r} is never produced")


def _separate_initializer_inputs(loaded: LoadedModel, freeze_inputs: bool) -> None:
    """Apply the ONNX IR rules for initializers that are also listed as graph inputs.

    IR >= 4: they are defaults a caller may override, so not constants; set them aside (the
    passes then see plain graph inputs) unless the user froze them, which removes them from the
    inputs. IR < 4: the format lists every initializer as an input, and they are constants; drop
    them from the inputs here and list them again on save.
    """
    graph = loaded.model.graph
    initializer_names = {t.name for t in graph.initializer}
    listed = [i for i in graph.input if i.name in initializer_names]
    if not listed:
        return
    if loaded.model.ir_version >= 4 and not freeze_inputs:
        keep = {i.name for i in listed}
        loaded.input_defaults = {t.name: t for t in graph.initializer if t.name in keep}
        remaining = [t for t in graph.initializer if t.name not in keep]
        del graph.initializer[:]
        graph.initializer.extend(remaining)
        return
    inputs = [i for i in graph.input if i.name not in initializer_names]
    del graph.input[:]
    graph.input.extend(inputs)


def assemble_model(original: LoadedModel, exported: onnx.ModelProto, provenance: str) -> onnx.ModelProto:
    """The original model's shell (IR version, opsets, metadata, functions) around the exported
    graph. `exported` (graphsurgeon's ModelProto) becomes the result: its graph is not copied,
    which would copy every weight."""
    model = exported
    for descriptor, _ in model.ListFields():
        if descriptor.name != "graph":
            model.ClearField(descriptor.name)
    _copy_shell(original.model, model)
    graph = model.graph
    _hoist_outer_initializers(graph, _declared_names(original.model.graph) | _declared_names(graph))
    for body in all_graphs(graph):
        if body is not graph:
            # an exporter's declarations inside a body are the sizes of its trace (torch: batch 1),
            # which onnxruntime checks against the rewritten body (a Squeeze now reading a tensor
            # declared [1, ..]); onnxruntime infers a body's shapes itself
            del body.value_info[:]
    used = _tensor_names_read(graph)
    for name, tensor in original.input_defaults.items():
        if name in used or name in {o.name for o in graph.output}:
            graph.initializer.append(tensor)
    if model.ir_version < 4:
        # Below IR 4 every initializer must also be listed as a graph input.
        listed = {i.name for i in graph.input}
        for tensor in graph.initializer:
            if tensor.name not in listed:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    _record_provenance(model, original.model, provenance)
    return model


def _hoist_outer_initializers(graph: onnx.GraphProto, outer: set[str]) -> None:
    """graphsurgeon exports a weight of the main graph that a body reads as an initializer of that
    body (of each body that reads it), and not of the main graph when no main node reads it: it
    would be copied into every branch, or lost where the body is written over. Each such weight
    goes back to the main graph, once; a body's own weights (an LSTM's in each branch) stay."""
    hoisted: dict[str, onnx.TensorProto] = {}
    for body in all_graphs(graph):
        if body is graph or not any(t.name in outer for t in body.initializer):
            continue
        for tensor in body.initializer:
            if tensor.name in outer and tensor.name not in hoisted:
                hoisted[tensor.name] = _copied(tensor)
        own = [_copied(t) for t in body.initializer if t.name not in outer]
        del body.initializer[:]
        body.initializer.extend(own)
    present = {t.name for t in graph.initializer}
    graph.initializer.extend(t for name, t in hoisted.items() if name not in present)


def _copied(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def _declared_names(graph: onnx.GraphProto) -> set[str]:
    """The names a graph itself declares: its inputs, initializers and node outputs, less the
    outputs of If/Loop/Scan nodes, which a body may use for its own values too (optimum's merged
    decoders name a branch's outputs after the If's: a branch's constant of that name is its own)."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    return names | {out for node in graph.node if not _holds_bodies(node) for out in node.output}


def _holds_bodies(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _copy_shell(model: onnx.ModelProto, into: onnx.ModelProto) -> None:
    """Every field of the model but its graph (copying the graph would copy every weight)."""
    for descriptor, value in model.ListFields():
        if descriptor.name == "graph":
            continue
        if descriptor.is_repeated:
            getattr(into, descriptor.name).extend(value)
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            getattr(into, descriptor.name).CopyFrom(value)
        else:
            setattr(into, descriptor.name, value)


def _tensor_names_read(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _tensor_names_read(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    names |= _tensor_names_read(sub)
    return names


def _record_provenance(model: onnx.ModelProto, original: onnx.ModelProto, provenance: str) -> None:
    """Name fuse as the producer and keep the original producer in the metadata (set once, so a
    second optimization does not overwrite the exporter's name with fuse's)."""
    props = {p.key: p.value for p in model.metadata_props}
    if "original_producer_name" not in props and original.producer_name != "fuse":
        onnx.helper.set_model_props(
            model,
            {**props, "original_producer_name": original.producer_name,
             "original_producer_version": original.producer_version},
        )
        props = {p.key: p.value for p in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, "fuse": provenance})
    model.producer_name = "fuse"
    model.producer_version = __version__
