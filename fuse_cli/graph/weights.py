"""Weights held by reference, never copied: a big weight is bytes in a file (the model file itself,
its external data, or a scratch file fuse wrote), and a model in memory names where they are.

Why: a weight in a ModelProto's raw_data is a copy, and every step that touches the proto copies
it again (SerializeToString for onnxruntime, graphsurgeon's export, the save). On BERT-base
(436 MB, weights in the file) `fuse optimize` peaked at 5.3x the file that way. Held by
reference, a weight is read only by the pass that rewrites it (a read-only memory map) and by
onnxruntime, which maps external data files itself (core/sessions.py).

- `read_model`: parse a model file without the payloads of its big embedded weights; each becomes
  an external-data reference to the model file itself, at the offset where protobuf stored it
  (external data is "these bytes of that file", and raw_data is stored contiguously).
- `WeightBytes`: a weight's bytes read in pieces, from its file where it is held by reference
  (merge-equal-weights compares weights that way without holding any whole).
- `ParkingLot`: a scratch folder where the new weights of a candidate (a folded Conv weight) are
  written before graphsurgeon exports the graph, so the export and the verification sessions
  read them from there instead of copying them out of numpy.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.errors import FuseError

# A weight from this size on is held by reference. Small enough that BERT's 2.4 MB matrices and a
# conv's weights are, large enough that shape-like constants (axes, shapes, scalars) stay inline
# for the passes and shape inference that read them.
BIG_WEIGHT_BYTES = 64 * 2**10

# field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data /
# external_data / data_location
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 9, 13, 14
_LENGTH_DELIMITED = 2

# Bytes WeightBytes.sample reads from each end and the middle of a weight: distinct weights of one
# shape (almost always) differ there, so only equal ones are read in full.
SAMPLE_BYTES = 256
# Weights are compared in pieces of this size, so none is held whole for it.
CHUNK_BYTES = 4 * 2**20


def read_model(path: Path) -> onnx.ModelProto:
    """`path` parsed, the raw_data of each main-graph initializer of BIG_WEIGHT_BYTES or more left
    in the file and referenced as external data (location: the file's own name). Raises ValueError
    when the file is not the protobuf this expects; onnx.load then says what is wrong with it."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("empty file")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return onnx.ModelProto.FromString(_without_big_payloads(data, path.name))
    finally:
        data.close()


def _without_big_payloads(data: mmap.mmap, location: str) -> bytes:
    """The model's bytes with big raw_data payloads replaced by references: the protobuf wire
    format is a sequence of (field, value) records, and a message field's records can be cut and
    appended to, so only the graph and its initializers are walked, nothing is decoded. A graph
    stored in several records (legal; graph/io.py's streamed writer puts each weight in one) is
    cut record by record: the parser merges them as it would have merged the originals."""
    rest = bytearray()
    for number, start, value_start, end in _fields(data, 0, len(data)):
        if number != _MODEL_GRAPH:
            rest += data[start:end]
            continue
        # records are copied in runs; only an initializer long enough to hold a big payload is cut
        graph, run_start = bytearray(), value_start
        for g_number, g_start, g_value_start, g_end in _fields(data, value_start, end):
            if g_number == _GRAPH_INITIALIZER and g_end - g_value_start >= BIG_WEIGHT_BYTES:
                graph += data[run_start:g_start]
                graph += length_delimited(_GRAPH_INITIALIZER,
                                          _tensor_by_reference(data, g_value_start, g_end, location))
                run_start = g_end
        graph += data[run_start:end]
        rest += length_delimited(_MODEL_GRAPH, bytes(graph))
    return bytes(rest)


def _tensor_by_reference(data: mmap.mmap, start: int, end: int, location: str) -> bytes:
    kept, payloads = bytearray(), []
    for number, f_start, value_start, f_end in _fields(data, start, end):
        if number == _TENSOR_RAW_DATA:
            payloads.append((f_start, value_start, f_end))
        elif number in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            return data[start:end]  # already external: nothing embedded to leave in place
        else:
            kept += data[f_start:f_end]
    if len(payloads) != 1 or payloads[0][2] - payloads[0][1] < BIG_WEIGHT_BYTES:
        return data[start:end]
    _, offset, payload_end = payloads[0]
    reference = onnx.TensorProto(data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(payload_end - offset))):
        reference.external_data.add(key=key, value=value)
    return bytes(kept) + reference.SerializeToString()


def _fields(data, start: int, end: int):
    """(field number, record start, value start, record end) of each record in data[start:end]."""
    position = start
    while position < end:
        key, value_start = _varint(data, position, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, record_end = _varint(data, value_start, end)
        elif wire_type == 1:
            record_end = value_start + 8
        elif wire_type == 5:
            record_end = value_start + 4
        elif wire_type == _LENGTH_DELIMITED:
            length, value_start = _varint(data, value_start, end)
            record_end = value_start + length
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if number == 0 or record_end > end:
            raise ValueError("truncated or not protobuf")
        yield number, position, value_start, record_end
        position = record_end


def _varint(data, position: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= end or shift > 63:
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def length_delimited(number: int, payload: bytes) -> bytes:
    """A protobuf field `number` holding `payload` (wire type 2), as the writer in graph/io.py streams them."""
    return encode_varint(number << 3 | _LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def reference(tensor: onnx.TensorProto) -> tuple[Path, int, int] | None:
    """(file, offset, length) of a tensor held by reference (its location absolute, as fuse's
    loader leaves it), None for one held in memory."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    entries = {e.key: e.value for e in tensor.external_data}
    length = int(entries["length"]) if "length" in entries else _nbytes(tensor)
    return Path(entries["location"]), int(entries.get("offset") or 0), length


def refer(tensor: onnx.TensorProto, file: Path | str, offset: int, length: int) -> None:
    """Make `tensor` a reference to file[offset:offset+length], dropping any payload it held."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", str(file)), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def read_in(model: onnx.ModelProto, where=lambda file: True) -> None:
    """Read the payloads of `model`'s weights held by reference (in files `where` accepts) into it:
    a whole model in memory, for a caller that wants one."""
    for tensor in model.graph.initializer:
        source = reference(tensor)
        if source is not None and where(source[0]):
            file, offset, length = source
            with open(file, "rb") as f:
                f.seek(offset)
                payload = f.read(length)
            if len(payload) != length:
                raise OSError(f"{file} ends before the weight {tensor.name!r} it should hold")
            tensor.ClearField("external_data")
            tensor.ClearField("data_location")
            tensor.raw_data = payload


def _nbytes(tensor: onnx.TensorProto) -> int:
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


# Types whose external bytes are the little-endian numpy array itself (onnx's external data format).
_MAPPABLE_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
})


class LoadedValues(gs.ir.tensor.LazyValues):
    """graphsurgeon's lazy values of a weight of the loaded model, handing out copies of its
    TensorProto: graphsurgeon's exporter renames the proto it is handed in place, so a weight a
    pass renamed (fold-constants suffixes the tensors of an If branch it inlines) would be renamed
    in the loaded model itself, and every later candidate built from it would miss the weight.
    A copy costs little: a big weight's proto is a reference (its payload stays in its file)."""

    @property
    def tensor(self) -> onnx.TensorProto:
        copy = onnx.TensorProto()
        copy.CopyFrom(self._tensor)
        return copy

    @tensor.setter
    def tensor(self, value: onnx.TensorProto) -> None:
        self._tensor = value


class MappedValues(gs.ir.tensor.LazyValues):
    """graphsurgeon's lazy values for a weight held by reference. The values are a read-only
    mapping of the file: a check that reads a weight's shape or dtype costs no memory, and
    graph/io.unload_unchanged_weights can hand the unread reference back for export."""

    def load(self) -> np.ndarray:
        file, offset, length = reference(self.tensor)
        if self.tensor.data_type not in _MAPPABLE_TYPES:
            with open(file, "rb") as f:
                f.seek(offset)
                payload = f.read(length)
            inline = onnx.TensorProto(data_type=self.tensor.data_type, dims=self.tensor.dims, raw_data=payload)
            return np.array(onnx.numpy_helper.to_array(inline))
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)).newbyteorder("<")
        values = np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=tuple(self.tensor.dims))
        values.fuse_lazy_source = self
        _maps.append(weakref.ref(values))
        return values


# The mappings MappedValues made, weakly: a graph a run is done with still holds those its passes
# read (graphsurgeon's nodes and tensors refer to each other, so only a collection frees them).
_maps: list[weakref.ref] = []


def mapped_weights_alive() -> bool:
    """Is any weight mapping still referenced? (Then a collection unmaps the dead graph's.)"""
    _maps[:] = [ref for ref in _maps if ref() is not None]
    return bool(_maps)


class ParkingLot:
    """A scratch folder for the new weights of candidates, made on first use. Weights are appended
    to one file and never removed (a bisection's candidates share most of them; disk is cheaper
    than memory); the folder goes when the run ends."""

    def __init__(self, near: Path | None = None):
        # beside the output when there is one: the final write then copies within one disk
        self.near = near
        self.folder: Path | None = None
        self._out = None

    @property
    def file(self) -> Path | None:
        return None if self.folder is None else self.folder / "weights.bin"

    def park_constants(self, graph: gs.Graph) -> None:
        """Every big constant whose values are in memory (a pass computed them) goes to the lot and
        becomes a reference, so graphsurgeon's export does not copy it into the ModelProto."""
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Constant) and isinstance(tensor._values, np.ndarray):
                tensor._values = self.hold(tensor.name, tensor._values)
                tensor.data_location = None

    def hold(self, name: str, values: np.ndarray) -> np.ndarray | MappedValues:
        """`values` parked and held by reference when big (and plain numbers), else as they are. A
        weight's own mapping stays itself (unload_unchanged_weights hands its reference back)."""
        if values.nbytes < BIG_WEIGHT_BYTES or values.dtype.kind not in "biuf" \
                or getattr(values, "fuse_lazy_source", None) is not None:
            return values
        if self._out is None:
            try:
                # absolute: a weight's location is read from other folders than the working one
                # (onnxruntime resolves a relative one against the model's; `-o out/m.onnx` with the
                # input elsewhere made every parked weight missing and verification roll back)
                self.folder = Path(tempfile.mkdtemp(prefix=".fuse-weights-", dir=self.near)).absolute()
            except OSError as exc:
                raise FuseError(f"{self.near or tempfile.gettempdir()}: cannot write weights there "
                                f"({exc.strerror or exc})") from exc
            self._out = open(self.file, "wb")
        values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
        offset = self._out.tell()
        self._out.write(memoryview(values.reshape(-1)).cast("B"))
        self._out.flush()  # onnxruntime and memory maps read the file, not this buffer
        proto = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(values.dtype),
                                 dims=values.shape)
        refer(proto, self.file, offset, values.nbytes)
        return MappedValues(proto)

    def unpark(self, model: onnx.ModelProto) -> None:
        """The weights of `model` parked here, read back into it (before the lot goes)."""
        if self._out is not None:
            self._out.flush()
            read_in(model, lambda file: file == self.file)

    def clean_up(self) -> None:
        if self._out is not None:
            self._out.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            self._out = None


class WeightBytes:
    """A weight's bytes, read in pieces. A weight held by reference is read
    from its file, never mapped: a mapping's pages stay resident while graphsurgeon holds it, and
    one page touched mapped megabytes (BERT-base: 72 samples of mapped weights held 200 MB). A
    weight not loaded yet is loaded for each comparison and not kept, so a group of them is never
    held at once."""

    def __init__(self, tensor: gs.Constant, where: tuple[Path, int, int] | None, size: int):
        self.tensor = tensor
        self._where = where
        self.size = size

    @classmethod
    def of(cls, tensor: gs.Constant) -> WeightBytes | None:
        """None for strings, which have no fixed-width bytes. (Sparse initializers are dense by
        now: graph/io.py.)"""
        values = tensor._values
        lazy = values if isinstance(values, MappedValues) else getattr(values, "fuse_lazy_source", None)
        if lazy is not None:
            where = reference(lazy.tensor)
            return cls(tensor, where, where[2])
        data = _flat_bytes(values)
        return None if data is None else cls(tensor, None, data.size)

    def _data(self) -> np.ndarray:
        return _flat_bytes(self.tensor._values)

    def _read(self, start: int, length: int) -> bytes:
        file, offset, _ = self._where
        with open(file, "rb") as f:
            f.seek(offset + start)
            return f.read(min(length, self.size - start))

    def chunks(self) -> Iterator[bytes]:
        data = None if self._where is not None else self._data()
        for start in range(0, self.size, CHUNK_BYTES):
            yield self._read(start, CHUNK_BYTES) if data is None else data[start:start + CHUNK_BYTES].tobytes()

    def sample(self) -> bytes:
        if self.size <= 3 * SAMPLE_BYTES:
            return b"".join(self.chunks())
        middle, end = self.size // 2, self.size - SAMPLE_BYTES
        if self._where is not None:
            return b"".join(self._read(start, SAMPLE_BYTES) for start in (0, middle, end))
        data = self._data()
        return b"".join(data[start:start + SAMPLE_BYTES].tobytes() for start in (0, middle, end))

    def digest(self) -> bytes:
        digest = hashlib.sha256()
        for chunk in self.chunks():
            digest.update(chunk)
        return digest.digest()

    def equals(self, other: WeightBytes) -> bool:
        return self.size == other.size and all(a == b for a, b in zip(self.chunks(), other.chunks()))


def _flat_bytes(values) -> np.ndarray | None:
    """An in-memory or not yet loaded weight's bytes, little-endian as a file holds them (loaded
    afresh, not kept, when not loaded yet); None for strings."""
    array = np.asarray(values.load() if isinstance(values, gs.ir.tensor.LazyValues) else values)
    if array.dtype == object:
        return None
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
