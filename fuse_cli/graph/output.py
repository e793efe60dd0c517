"""Where the output goes: checks made before any work (never over the input, never over its
weights), and the writer of candidates that verification reads."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx

from fuse_cli.errors import UsageError
from fuse_cli.graph.io import LoadedModel, save_model


class CandidateWriter:
    """Writes candidates for verification when they cannot go to onnxruntime from memory (weights
    still in the input's external data, or over protobuf's 2 GB): to the output path itself, so
    the final save of a verified model is not done twice and no third copy takes disk space; in a
    dry run or when writing over the input (which verification reads), to a temporary folder."""

    def __init__(self, loaded: LoadedModel, target: Path | None, external_data: bool | None):
        self.loaded, self.target, self.external_data = loaded, target, external_data
        self._to_target = target is not None and not same_file(loaded.path, target)
        self._scratch: Path | None = None
        self._at_target: tuple[onnx.ModelProto, list[Path]] | None = None

    def for_verification(self, model: onnx.ModelProto) -> Path:
        if self._to_target:
            return self.final(model)[0]
        self._scratch = self._scratch or Path(tempfile.mkdtemp(prefix="fuse-verify-"))
        return save_model(model, self._scratch / "candidate.onnx", source_dir=self.loaded.path.parent)[0]

    def final(self, model: onnx.ModelProto) -> list[Path]:
        assert self.target is not None
        if self._at_target is None or self._at_target[0] is not model:
            self._at_target = (model, save_model(model, self.target, external_data=self.external_data,
                                                 source_dir=self.loaded.path.parent))
        return self._at_target[1]

    def clean_up(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)



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

