"""Where the output goes: checks made before any work (never over the input, never over its
weights), the scratch folder candidates' new weights are parked in, and the one final write."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from fuse_cli.errors import UsageError
from fuse_cli.graph.io import LoadedModel, save_model
from fuse_cli.graph.weights import ParkingLot


class CandidateWriter:
    """Candidates are verified from memory, their big weights by reference (onnxruntime maps the
    files), so nothing is written until the verified model is: once, at the output path. The new
    weights a pass computes wait in `lot`, beside the output (the final write copies them within
    one disk). external_data None keeps the weights where the user had them: in external data
    for an input with external data, else inline unless over protobuf's limit."""

    def __init__(self, loaded: LoadedModel, target: Path | None, external_data: bool | None):
        self.target = target
        self.external_data = True if external_data is None and loaded.external else external_data
        self.lot = ParkingLot(near=target.parent if target is not None else None)

    def settle(self, model: onnx.ModelProto) -> list[Path]:
        """Write `model` to the target, its weights then read from the written files; with no
        target (a dry run), read its parked weights back in, as the lot goes with the run."""
        if self.target is None:
            self.lot.unpark(model)
            return []
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

