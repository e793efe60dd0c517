"""Where the output goes: checks made before any work (never over the input, never over its
weights), the scratch folder candidates' new weights are parked in, and the one final write."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from fuse_cli.core.tensors import weight_bytes
from fuse_cli.errors import UsageError
from fuse_cli.graph.io import LoadedModel
from fuse_cli.graph.save import save_model
from fuse_cli.graph.weights import ParkingLot
from fuse_cli.progress import step, update


class CandidateWriter:
    """Candidates are verified from memory, their big weights by reference (onnxruntime maps the
    files), so nothing is written until the verified model is: once, at the output path. The new
    weights a pass computes wait in `lot`, beside the output (the final write copies them within
    one disk). external_data None keeps the weights where the user had them: in external data
    for an input with external data, else inline unless over protobuf's limit."""

    def __init__(self, loaded: LoadedModel, target: Path | None, external_data: bool | None,
                 lot: ParkingLot | None = None):
        self.target = target
        self.external_data = True if external_data is None and loaded.external else external_data
        self.lot = lot if lot is not None else ParkingLot(near=target.parent if target is not None else None)

    def settle(self, model: onnx.ModelProto) -> list[Path]:
        """Write `model` to the target, its weights then read from the written files; with no
        target (a dry run), read its parked weights back in, as the lot goes with the run."""
        if self.target is None:
            with step("read back new weights"):
                self.lot.unpark(model)
            return []
        with step("write"):
            # its weights: the bytes a big model's write takes its time over (the graph's are few)
            update(str(self.target), nbytes=weight_bytes(model))
            return save_model(model, self.target, external_data=self.external_data, relink=True)

    def clean_up(self) -> None:
        self.lot.clean_up()


def check_output_path(source: Path, target: Path, in_place: bool) -> None:
    """Before any work: the output must be writable and must not clobber the input."""
    if target.exists() and target.is_dir():
        raise UsageError(f"{target}: output path is a directory")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{target}: output folder {folder} does not exist")
    if same_file(source, target) and not in_place:
        raise UsageError(f"{target}: output would overwrite the input; pass --in-place to allow it")


def check_not_over_weights(loaded: LoadedModel, target: Path, external_data: bool | None) -> None:
    """Writing over the file the input's weights live in would corrupt the input (--in-place
    included: the model file is replaced atomically, its weights file is not)."""
    for weights in loaded.external_files:
        for written in (target, target.with_name(target.name + ".data")):
            if same_file(weights, written) and (written == target or external_data is not False):
                raise UsageError(f"{written}: output would overwrite the input's external data file")


def same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()



@contextlib.contextmanager
def output_lock(target: Path) -> Iterator[None]:
    """One run at a time per output path: two runs writing one output could leave a model beside
    the other run's data. An exclusive lock on a hidden file beside the output, for the run;
    a second run stops at once (exit 2) rather than wait. The file goes when the run ends: it is
    checked to still be the file locked, so a run that opened it as the holder removed it tries
    again on the new one."""
    lock_path = target.with_name(f".{target.name}.fuse-lock")
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise UsageError(f"{target}: cannot write to {lock_path.parent} ({exc.strerror or exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"{target}: another fuse run is writing this output; try again when it ends") from None
        try:
            current = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)
