"""The Python API: what `fuse optimize`, `fuse report` and `fuse verify` do, as calls that take a
ModelProto or a path and write nothing unless asked.

    result = fuse_cli.optimize(model, dims={"batch": 1})
    result.model          # the optimized onnx.ModelProto
    result.report         # the report the CLI renders (report/model.py); result.to_dict(): its JSON
    result.save("model.fused.onnx")

Why a result that owns a folder: the engine holds big weights by reference (graph/weights.py).
The weights a run leaves alone stay in the input's files; the new ones a pass computes go to a
parking lot, which the CLI writes beside its output. Nothing is written here, so the lot lives in
a scratch folder the result owns (the system's temp folder) until the result is closed or
collected; `model_by_reference` reads from it, `model` reads every weight in. A ModelProto input
is written there too: every step of the engine (verification in a worker process, the original's
reference runs) reads the model from a file.

Errors are one type per CLI exit code (errors.py): InputError (2), CheckFailed (1, raised by
`check()`), InternalError (3); never an exception from deep inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_tensor

from fuse_cli import api
from fuse_cli.config import FuseConfig, split_names
from fuse_cli.errors import EXIT_CHECK_FAILED, EXIT_INTERNAL, EXIT_OK, CheckFailed, FuseError, InputError, InternalError
from fuse_cli.graph.io import load_model
from fuse_cli.graph.save import save_model
from fuse_cli.graph.output import output_lock, same_file
from fuse_cli.graph.walk import all_graphs
from fuse_cli.graph.weights import ParkingLot, read_in, reference
from fuse_cli.report.model import Report
from fuse_cli.report.render import render_json, render_verify_json
from fuse_cli.verify import VerifyResult, load_inputs, verify_models

ModelInput = Union[onnx.ModelProto, str, os.PathLike]

# What a report and an error call a model given as a ModelProto (it has no path of its own).
IN_MEMORY = "<in-memory model>"


class FuseResult:
    """What `optimize` or `audit_model` made of a model. Owns a scratch folder (the new weights the
    model references) until `close()`, the end of a `with` block, or garbage collection."""

    def __init__(self, run: api.OptimizeResult, *, source: Path | None, external_data: bool, scratch: Path,
                 lot: ParkingLot):
        self.report: Report = run.report
        self._model = run.model_by_reference
        # never written over: the input and its weights (read_from adds the files the model reads)
        self._inputs = (*([source] if source is not None else []), *run.input_weight_files)
        self._external_data = external_data  # where `save` puts the weights by default: as the input had them
        self._scratch = scratch
        self._read_in = False
        self._finalizer = weakref.finalize(self, _remove_scratch, lot, scratch)

    @property
    def model_by_reference(self) -> onnx.ModelProto:
        """The optimized model, its big weights referenced where they are (the input's files, this
        result's scratch folder): valid while the result is open. Use `model` to keep it."""
        return self._model

    @property
    def model(self) -> onnx.ModelProto:
        """The optimized model whole, every weight read in (on first use; the same object after)."""
        if not self._read_in:
            if not self._finalizer.alive:
                raise InputError("the result is closed: its model's weights are gone (read `model` before closing)")
            read_in(self._model)
            self._read_in = True
        return self._model

    @property
    def verification(self) -> VerifyResult | None:
        """The outputs compared with the original's (None when verification was off)."""
        return self.report.verification

    @property
    def exit_code(self) -> int:
        """The exit code the CLI gives for this run: 0, or 1 when a check failed (`failures`)."""
        return self.report.exit_code

    @property
    def failures(self) -> tuple[str, ...]:
        return self.report.failures

    def check(self) -> FuseResult:
        """This result, or CheckFailed (with the result attached) where the CLI would exit 1."""
        if self.exit_code != EXIT_OK:
            raise CheckFailed(self.failures, self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The report as the CLI's --json writes it (report/report.schema.json)."""
        return json.loads(render_json(self.report))

    def save(self, path: str | os.PathLike, *, external_data: bool | None = None) -> list[Path]:
        """Write the model atomically, as `fuse optimize` does, and return the files written.
        external_data None keeps the weights as the input had them (in a side file, or inline
        unless over protobuf's 2 GB limit). Never over the input or a file its weights are in."""
        target = Path(path)
        with _public_errors():
            if not self._read_in and not self._finalizer.alive:
                raise InputError("the result is closed: its model's weights are gone (save before closing)")
            self._refuse_over_inputs(target)
            if target.is_dir():
                raise InputError(f"{target}: output path is a directory")
            if not target.parent.is_dir():
                raise InputError(f"{target}: output folder {target.parent} does not exist")
            with output_lock(target):
                return save_model(self._model, target,
                                  external_data=self._external_data or None if external_data is None else external_data)

    def _refuse_over_inputs(self, target: Path) -> None:
        read_from = {file for file, _, _ in filter(None, map(reference, self._model.graph.initializer))}
        for file in (*self._inputs, *read_from):
            if same_file(file, target) and not file.is_relative_to(self._scratch):
                raise InputError(f"{target}: would overwrite the input model or its weights")

    def close(self) -> None:
        """Remove the scratch folder. `model` read before stays whole; `model_by_reference` does not."""
        self._finalizer()

    def __repr__(self) -> str:
        verified = self.verification.status if self.verification is not None else "not verified"
        return (f"<FuseResult {self.report.model_path}: {self.report.nodes_before} -> {self.report.nodes_after} nodes, "
                f"{len(self.report.fusions)} fusions, {verified}, exit code {self.exit_code}>")

    def __enter__(self) -> FuseResult:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class Comparison:
    """What `compare_models` found: the outputs of two models on the same inputs (`fuse verify`)."""

    verification: VerifyResult

    @property
    def passed(self) -> bool:
        return self.verification.passed

    @property
    def exit_code(self) -> int:
        """The exit code `fuse verify` gives: 0 only when every output matches."""
        return EXIT_OK if self.passed else EXIT_CHECK_FAILED

    def check(self) -> Comparison:
        """This comparison, or CheckFailed where `fuse verify` would exit 1."""
        if not self.passed:
            failing = [f"output {o.name!r} differs (max abs diff {o.max_abs_diff:.3g})"
                       for o in self.verification.failing()]
            raise CheckFailed(tuple(failing) or (f"verification was {self.verification.status}: "
                                                 f"{self.verification.reason}",), self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The comparison as `fuse verify --json` writes it."""
        return json.loads(render_verify_json(self.verification))


def optimize(model: ModelInput, *, target: str = "onnx", dims: Mapping[str, int] | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None, passes: Sequence[str] | str | None = None,
             disable: Sequence[str] | str = (), verify: bool = True, base_dir: str | os.PathLike | None = None,
             freeze_inputs: bool = False, upgrade_opset: int | None = None,
             int_ranges: Mapping[str, tuple[int, int]] | None = None, rtol: float | None = None,
             atol: float | None = None, allow_peak_growth: bool = False) -> FuseResult:
    """Fuse `model` as `fuse optimize` does, writing nothing: a ModelProto (its external data read
    from `base_dir`) or a path (external data beside it). The options are the CLI's flags: `dims`
    binds symbolic dims (--dim), `input_shapes` whole input shapes, `passes`/`disable` choose passes
    by name, `verify` compares outputs with the original in onnxruntime and drops passes that
    change them. Raises InputError for bad input or options, InternalError for a bug in fuse."""
    return _run(model, base_dir, dry_run=False, config=_config(**_options_in(locals())))


def audit_model(model: ModelInput, *, target: str = "onnx", dims: Mapping[str, int] | None = None,
                input_shapes: Mapping[str, Sequence[int]] | None = None, passes: Sequence[str] | str | None = None,
                disable: Sequence[str] | str = (), verify: bool = True, base_dir: str | os.PathLike | None = None,
                freeze_inputs: bool = False, upgrade_opset: int | None = None,
                int_ranges: Mapping[str, tuple[int, int]] | None = None, rtol: float | None = None,
                atol: float | None = None, allow_peak_growth: bool = False) -> FuseResult:
    """The memory audit and dry run of `fuse report`: what fusion would do to `model` (same
    arguments as `optimize`). Its report judges the model as it is (report.dry_run is True)."""
    return _run(model, base_dir, dry_run=True, config=_config(**_options_in(locals())))


def compare_models(original: ModelInput | FuseResult, optimized: ModelInput | FuseResult, *,
                   dims: Mapping[str, int] | None = None,
                   inputs: Mapping[str, np.ndarray] | str | os.PathLike | None = None,
                   int_ranges: Mapping[str, tuple[int, int]] | None = None, rtol: float | None = None,
                   atol: float | None = None, seed: int = 0, base_dir: str | os.PathLike | None = None) -> Comparison:
    """Run both models on the same inputs and compare every output, as `fuse verify` does: `inputs`
    (a mapping, a .npz file or a folder of .pb tensors), else seeded random inputs at `dims` (by
    default distinct primes, at two settings). A mismatch is a result (`passed` False, `check()`
    raises), not an exception."""
    with _public_errors(), _scratch(keep=False) as (folder, _), _shown_as(folder):
        dims, ranges = _checked_dims(dims, "dims"), _checked_ranges(int_ranges)
        # a FuseResult's model goes to onnxruntime as it is: its references are fuse's own
        models = [m.model_by_reference if isinstance(m, FuseResult) else _model_file(m, base_dir, folder, name)
                  for m, name in ((original, "original"), (optimized, "optimized"))]
        # the CLI's one-line errors before onnxruntime sees a file; the original's header read once
        header = [load_model(m).model if isinstance(m, Path) else None for m in models][0]
        feeds = load_inputs(inputs) if isinstance(inputs, (str, os.PathLike)) else inputs
        result = verify_models(*(str(m) if isinstance(m, Path) else m for m in models), dims=dims, seed=seed,
                               rtol=rtol, atol=atol, feeds=feeds, int_ranges=ranges, header=header)
        return Comparison(result)


def _options_in(arguments: dict[str, Any]) -> dict[str, Any]:
    """The options among the arguments of `optimize` or `audit_model` (their locals on entry)."""
    return {k: v for k, v in arguments.items() if k not in ("model", "base_dir")}


def _config(*, target: str, dims, input_shapes, passes, disable, verify: bool, freeze_inputs: bool,
            upgrade_opset: int | None, int_ranges, rtol, atol, allow_peak_growth: bool) -> FuseConfig:
    """The CLI's FuseConfig from keyword arguments, each checked as the CLI checks its flag.
    Not read from a fuse.toml: a library call does not depend on the working folder."""
    with _public_errors():
        if not isinstance(target, str):
            raise InputError(f"target must be a string, got {target!r}")
        for name, value in (("rtol", rtol), ("atol", atol)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise InputError(f"{name} must be a number >= 0, got {value!r}")
        if upgrade_opset is not None and not _is_positive_int(upgrade_opset):
            raise InputError(f"upgrade_opset must be a positive integer, got {upgrade_opset!r}")
        return FuseConfig(
            target=target,
            passes=None if passes is None else _names(passes, "passes"),
            disable=_names(disable, "disable"),
            dims=_checked_dims(dims, "dims"),
            input_shapes={name: _checked_shape(shape, name)
                          for name, shape in _mapping(input_shapes, "input_shapes").items()},
            freeze_inputs=bool(freeze_inputs),
            upgrade_opset=upgrade_opset,
            verify=bool(verify),
            int_ranges=_checked_ranges(int_ranges),
            rtol=rtol,
            atol=atol,
            allow_peak_growth=bool(allow_peak_growth),
        )


def _run(model: ModelInput, base_dir, *, dry_run: bool, config: FuseConfig) -> FuseResult:
    with _public_errors(), _scratch(keep=True) as (folder, lot), _shown_as(folder):
        path = _model_file(model, base_dir, folder, "model")
        run = api.optimize_unwritten(path, config, lot, dry_run=dry_run)
        if isinstance(model, onnx.ModelProto):  # the report names no scratch file
            return FuseResult(replace(run, report=replace(run.report, model_path=IN_MEMORY)), source=None,
                              external_data=_has_external_data(model), scratch=folder, lot=lot)
        return FuseResult(run, source=path, external_data=bool(run.input_weight_files), scratch=folder, lot=lot)


@contextlib.contextmanager
def _scratch(*, keep: bool) -> Iterator[tuple[Path, ParkingLot]]:
    """A folder for the run and the parking lot in it, removed on an error, and at the end unless
    `keep` (then the FuseResult made in the block owns it)."""
    folder = Path(tempfile.mkdtemp(prefix="fuse-")).resolve()
    lot = ParkingLot(near=folder)
    try:
        yield folder, lot
    except BaseException:
        _remove_scratch(lot, folder)
        raise
    if not keep:
        _remove_scratch(lot, folder)


@contextlib.contextmanager
def _shown_as(folder: Path) -> Iterator[None]:
    """Errors name a ModelProto input IN_MEMORY, not the scratch file it was written to."""
    try:
        yield
    except FuseError as exc:
        exc.args = tuple(re.sub(re.escape(str(folder)) + r"/\w+\.onnx", IN_MEMORY, str(a)) for a in exc.args)
        raise


def _remove_scratch(lot: ParkingLot, folder: Path) -> None:
    lot.clean_up()
    shutil.rmtree(folder, ignore_errors=True)


def _model_file(model, base_dir, folder: Path, name: str) -> Path:
    """The file the engine reads `model` from: a path as given; a ModelProto written to `folder`
    by graph.save.save_model, one weight in memory at a time (external data over protobuf's 2 GB limit,
    and for a model whose weights are in files: copied file to file, never read in)."""
    if isinstance(model, (str, os.PathLike)):
        return Path(model)
    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")
    external = _with_weights_in_files(model, base_dir)
    path = folder / f"{name}.onnx"
    save_model(external or model, path, external_data=True if external is not None else None)
    return path


def _with_weights_in_files(model: onnx.ModelProto, base_dir) -> onnx.ModelProto | None:
    """None for a model holding all its weights; else a copy (cheap: its big weights are not in
    memory) whose initializers in external data name their files absolutely, resolved against
    `base_dir` as onnx does, and whose other external tensors (attributes, sparse parts) are read in."""
    if not _has_external_data(model):
        return None
    if base_dir is None:
        raise InputError("the model keeps weights in external data files: pass base_dir= (the folder they are "
                         "in), or the model's path")
    base = Path(base_dir).resolve()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in _initializers(copy):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _set_location(tensor, str(_data_file(tensor, base)))
    for tensor in _other_tensors(copy):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _data_file(tensor, base)
            load_external_data_for_tensor(tensor, str(base))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return copy


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in (*_initializers(model), *_other_tensors(model)))


def _data_file(tensor: onnx.TensorProto, base: Path) -> Path:
    """The file `tensor`'s bytes are in: inside `base`, as the loader demands of a model file's."""
    location = next((e.value for e in tensor.external_data if e.key == "location"), "")
    target = (base / location).resolve() if location and not os.path.isabs(location) else None
    if target is None or base not in target.parents:
        raise InputError(f"external data of {tensor.name!r} ({location!r}) is not a file inside "
                         f"base_dir {base}: refused")
    if not target.is_file():
        raise InputError(f"external data of {tensor.name!r}: {target} does not exist")
    return target


def _set_location(tensor: onnx.TensorProto, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def _initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for graph in all_graphs(model.graph):
        yield from graph.initializer


def _other_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The tensors other than dense initializers that may name external data."""
    for body in all_graphs(model.graph, *model.functions):
        for sparse in getattr(body, "sparse_initializer", ()):
            yield from (sparse.values, sparse.indices)
        for node in body.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for sparse in (*([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []), *attr.sparse_tensors):
                    yield from (sparse.values, sparse.indices)


@contextlib.contextmanager
def _public_errors() -> Iterator[None]:
    """The CLI's error guard for a library: each exit code one exception type, one line each."""
    try:
        yield
    except (InputError, CheckFailed, InternalError):
        raise
    except FuseError as exc:  # raised as the base class (or a private subclass): typed by its exit code
        kind = {EXIT_CHECK_FAILED: CheckFailed, EXIT_INTERNAL: InternalError}.get(exc.exit_code)
        if kind is CheckFailed:
            raise CheckFailed((str(exc),)) from None
        raise (kind or InputError)(str(exc)) from None
    except MemoryError:
        raise InputError("out of memory: the model needs more than this machine gives") from None
    except Exception as exc:  # noqa: BLE001 - a bug in fuse: one line, the cause chained for a report
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise InternalError(f"internal error ({type(exc).__name__}: {first}); this is a bug in fuse: "
                            "please report it with the chained traceback") from exc


def _names(value, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return split_names(value)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InputError(f"{what} must be pass names (a list of strings), got {value!r}")


def _mapping(value, what: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _is_positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _checked_dims(dims, what: str) -> dict:
    checked = {}
    for name, value in _mapping(dims, what).items():
        if not _is_positive_int(value):
            raise InputError(f"{what}: {name}={value!r} is not a positive integer")
        checked[name] = int(value)
    return checked


def _checked_shape(shape, name: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise InputError(f"input_shapes[{name!r}] must be a sequence of positive integers, got {shape!r}")
    return tuple(_checked_dims(dict(enumerate(shape)), f"input_shapes[{name!r}]").values())


def _checked_ranges(ranges) -> dict[str, tuple[int, int]]:
    checked = {}
    for name, span in _mapping(ranges, "int_ranges").items():
        try:
            low, high = (int(v) for v in span)
        except (TypeError, ValueError):
            raise InputError(f"int_ranges: {name} must be (low, high), got {span!r}") from None
        if low >= high:
            raise InputError(f"int_ranges: {name}: low must be below high, got {span!r}")
        checked[name] = (low, high)
    return checked
