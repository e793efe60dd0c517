"""Writing a model: its weights embedded or as external data, copied from file to file, never
held whole in memory; the data file under a name no other file has (graph/output.py makes the
write atomic and names the pair).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import set_external_data

from fuse_cli.errors import FuseError
from fuse_cli.graph import weights
from fuse_cli.graph import io
from fuse_cli.graph.io import all_initializers, all_tensors, first_line, is_external, threshold_bytes
from fuse_cli.graph.weights import encode_varint, length_delimited

# Smaller initializers stay inline in the .onnx file, as onnx.save does by default.
EXTERNAL_DATA_MIN_BYTES = 1024
_COPY_CHUNK_BYTES = 16 * 2**20


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None,
               relink: bool = False) -> list[Path]:
    """Write atomically (temp files + rename) and return the paths written.

    external_data: True forces a side `<name>.data` file, None picks it when the model would not fit
    protobuf's 2 GB limit inline. Weights held by reference are copied from file to file, never
    loaded. relink: leave `model`'s big weights referencing the written files (the files they came
    from, a scratch folder, may then go, and the model holds no payload); otherwise `model` is left
    as it was.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FuseError(f"{path}: output folder {folder} does not exist")
    # Parsers refuse a file over 2 GB, even one written a weight at a time (_write_streamed)
    too_big_inline = _tensor_bytes(model) > io.INLINE_SAVE_LIMIT_BYTES
    if external_data is None:
        external_data = too_big_inline
    elif not external_data and too_big_inline:
        raise FuseError(f"{path}: the weights exceed protobuf's 2 GB limit for one file: write external data")
    written: list[Path] = []
    claimed: Path | None = None  # the new data file, until the model that reads it stands
    tmp_dir = _make_temp_dir(folder, path)
    try:
        tmp_model = Path(tmp_dir) / path.name
        stale = _data_files_of(path)
        if external_data:
            data_name = _fresh_data_name(folder, path.name)
            claimed = folder / data_name
            placed = _save_with_external_data(model, tmp_model, data_name, relink)
            os.replace(Path(tmp_dir) / data_name, folder / data_name)
            written.append(folder / data_name)
        else:
            placed = _write_streamed(model, tmp_model)
        # the model last: until this rename the old model and its data stand, after it the new pair
        os.replace(tmp_model, path)
        claimed = None
        written.insert(0, path)
        for old in stale - set(written):
            old.unlink(missing_ok=True)
    except OSError as exc:
        raise FuseError(f"{path}: cannot write output ({first_line(exc)})") from exc
    except ValueError as exc:
        raise FuseError(f"{path}: cannot serialize model ({first_line(exc)}); try --external-data") from exc
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if claimed is not None:
            claimed.unlink(missing_ok=True)
    if relink:
        for tensor, name, offset, length in placed:
            weights.refer(tensor, (folder / name).resolve(), offset, length)
    return written


def _fresh_data_name(folder: Path, model_name: str) -> str:
    """`<model>.data`, or `<model>.1.data`, ... : the first name no file has, claimed (created
    empty) at once. The data of a model already at the output path is never written over: a
    kill before the model's rename leaves that model with its own data."""
    for n in range(10_000):
        name = f"{model_name}.data" if n == 0 else f"{model_name}.{n}.data"
        try:
            os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        return name
    raise OSError(f"no free name for the weights of {model_name} in {folder}")


def _data_files_of(path: Path) -> set[Path]:
    """The data files fuse wrote for the model now at `path` (names `_fresh_data_name` makes that
    the model references): what replacing it leaves unread, to remove once the new pair stands.
    Files of other names, the user's, are never removed."""
    if not path.is_file():
        return set()
    try:
        old = weights.read_model(path)
    except (ValueError, OSError, DecodeError):
        return set()
    ours = re.compile(re.escape(path.name) + r"(\.\d+)?\.data")
    return {path.parent / location for location in {_location(t) for t in all_tensors(old) if is_external(t)}
            if ours.fullmatch(location)}


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def has_unread_weights(model: onnx.ModelProto) -> bool:
    """Does `model` hold weights by reference (weights.py)? Such a model is complete only with
    the files it names."""
    return any(is_external(t) for t in model.graph.initializer)


# ModelProto.graph and GraphProto.initializer: field numbers of onnx.proto
_MODEL_GRAPH_FIELD, _GRAPH_INITIALIZER_FIELD = 7, 5
_TENSOR_RAW_DATA_FIELD = 9


def _write_streamed(model: onnx.ModelProto, model_file: Path) -> list:
    """The bytes onnx.save_model would write, without the whole model as one bytes object, and
    with the weights held by reference copied in from their files. Returns where each of those
    went: (tensor, file name, offset, length).

    SerializeToString builds the full file in memory (twice over, briefly, inside protobuf): on
    BERT-base that was 830 MB above fuse's resident size at the final save. Protobuf's wire
    format allows an embedded message field to occur several times, the parser merging the
    occurrences and appending repeated fields in order, so the graph is written once without its
    initializers and then once per initializer; a referenced weight's payload goes last in its
    record (field order does not matter to the parser), copied in chunks.
    """
    rest = onnx.ModelProto()
    for descriptor, value in model.ListFields():
        if descriptor.number != _MODEL_GRAPH_FIELD:
            _copy_field(rest, descriptor, value)
    graph = onnx.GraphProto()
    for descriptor, value in model.graph.ListFields():
        if descriptor.number != _GRAPH_INITIALIZER_FIELD:
            _copy_field(graph, descriptor, value)
    placed = []
    with open(model_file, "wb") as out:
        out.write(rest.SerializeToString())
        out.write(length_delimited(_MODEL_GRAPH_FIELD, graph.SerializeToString()))
        for tensor in model.graph.initializer:
            source = weights.reference(tensor)
            if source is None:
                out.write(length_delimited(_MODEL_GRAPH_FIELD, length_delimited(
                    _GRAPH_INITIALIZER_FIELD, tensor.SerializeToString())))
                continue
            file, offset, length = source
            head = onnx.TensorProto()
            head.CopyFrom(tensor)
            head.ClearField("external_data")
            head.ClearField("data_location")
            payload_key = encode_varint(_TENSOR_RAW_DATA_FIELD << 3 | 2) + encode_varint(length)
            record = head.SerializeToString() + payload_key
            out.write(encode_varint(_MODEL_GRAPH_FIELD << 3 | 2) + encode_varint(_delimited_size(len(record) + length)))
            out.write(encode_varint(_GRAPH_INITIALIZER_FIELD << 3 | 2) + encode_varint(len(record) + length) + record)
            placed.append((tensor, model_file.name, out.tell(), length))
            _copy_bytes(file, offset, length, out)
    return placed


def _delimited_size(size: int) -> int:
    """The size of a length-delimited record whose payload is `size` bytes (tag of one byte)."""
    return 1 + len(encode_varint(size)) + size


def _copy_field(message, descriptor, value) -> None:
    # protobuf 7 has is_repeated and no label; older releases only label
    repeated = getattr(descriptor, "is_repeated", None)
    if repeated is None:
        repeated = descriptor.label == descriptor.LABEL_REPEATED
    if repeated:
        getattr(message, descriptor.name).extend(value)
    elif descriptor.type == descriptor.TYPE_MESSAGE:
        getattr(message, descriptor.name).CopyFrom(value)
    else:
        setattr(message, descriptor.name, value)


def _save_with_external_data(model: onnx.ModelProto, model_file: Path, data_name: str, relink: bool) -> list:
    """Initializers of 1 KiB or more go to `data_name` beside `model_file`: weights held by
    reference are copied from file to file, never loaded. Returns where each went (see
    _write_streamed); unless relinking, the model is put back as it was.

    Not onnx.save_model(save_as_external_data=True): it strips the weights out of the caller's
    model for good, and refuses a location that exists relative to the *working directory*, so a
    second `--external-data` run from the output's folder failed.
    """
    moved: list[tuple[onnx.TensorProto, bytes]] = []
    relinked: list[tuple[onnx.TensorProto, list[tuple[str, str]]]] = []
    placed = []
    try:
        with open(model_file.parent / data_name, "wb") as data:
            for tensor in all_initializers(model):
                offset = data.tell()
                source = weights.reference(tensor)
                if source is not None:
                    file, source_offset, length = source
                    _copy_bytes(file, source_offset, length, data)
                    relinked.append((tensor, [(e.key, e.value) for e in tensor.external_data]))
                    _relink(tensor, [("location", data_name), ("offset", str(offset)), ("length", str(length))])
                    placed.append((tensor, data_name, offset, length))
                    continue
                raw = tensor.raw_data
                if len(raw) < EXTERNAL_DATA_MIN_BYTES:
                    continue
                data.write(raw)
                moved.append((tensor, raw))
                set_external_data(tensor, data_name, offset, len(raw))
                tensor.ClearField("raw_data")
                placed.append((tensor, data_name, offset, len(raw)))
        onnx.save_model(model, str(model_file))
    finally:
        for tensor, raw in moved:
            if not relink:
                tensor.ClearField("external_data")
                tensor.ClearField("data_location")
                tensor.raw_data = raw
        for tensor, entries in relinked:
            _relink(tensor, entries)
    return placed


def _relink(tensor: onnx.TensorProto, entries: list[tuple[str, str]]) -> None:
    del tensor.external_data[:]
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _copy_bytes(source: Path, offset: int, length: int, into) -> None:
    """Through one reused buffer: the copy never holds more than a chunk of the weight."""
    buffer = memoryview(bytearray(min(length, _COPY_CHUNK_BYTES)))
    with open(source, "rb", buffering=0) as f:
        f.seek(offset)
        while length > 0:
            read = f.readinto(buffer[:min(length, len(buffer))])
            if not read:
                raise OSError(f"{source} ends before the weights it should hold")
            into.write(buffer[:read])
            length -= read


def _make_temp_dir(folder: Path, path: Path) -> str:
    try:
        return tempfile.mkdtemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise FuseError(f"{path}: cannot write to {folder} ({exc.strerror or first_line(exc)})") from exc


def _tensor_bytes(model: onnx.ModelProto) -> int:
    # ByteSize: no copy of the weights; a weight still in external data by its shape
    return sum(threshold_bytes(t) if is_external(t) else t.ByteSize() for t in all_tensors(model))
