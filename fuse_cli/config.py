"""One frozen configuration: `[tool.fuse]` in pyproject.toml or a fuse.toml, then CLI flags.

The file is found by walking up from the working directory; the nearest fuse.toml, or the
nearest pyproject.toml with a [tool.fuse] table, wins. Command-line flags override file keys.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fuse_cli.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_FOLD_LIMIT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class FuseConfig:
    target: str = "onnx"
    passes: tuple[str, ...] | None = None  # None: the target's default pipeline
    disable: tuple[str, ...] = ()
    dims: Mapping[str, int] = field(default_factory=dict)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    freeze_inputs: bool = False
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    external_data: bool | None = None  # None: only when the model needs it (> 2 GB)
    source: str = "defaults"

    def with_overrides(self, **overrides: Any) -> FuseConfig:
        """Apply CLI values; None means "not given on the command line"."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **given)


_FILE_KEYS = {
    "target": str,
    "passes": "names",
    "disable": "names",
    "dims": "dims",
    "freeze-inputs": bool,
    "fold-limit": "megabytes",
}


def find_config_file(start: Path | None = None) -> tuple[Path, Mapping[str, Any]] | None:
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        fuse_toml = candidate / "fuse.toml"
        if fuse_toml.is_file():
            return fuse_toml, _read_toml(fuse_toml)
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            table = _read_toml(pyproject).get("tool", {}).get("fuse")
            if table is not None:
                return pyproject, table
    return None


def _read_toml(path: Path) -> Mapping[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read configuration ({exc})") from exc


def load_config(start: Path | None = None) -> FuseConfig:
    found = find_config_file(start)
    if found is None:
        return FuseConfig()
    path, table = found
    values: dict[str, Any] = {"source": str(path)}
    for key, raw in table.items():
        kind = _FILE_KEYS.get(key)
        if kind is None:
            raise UsageError(f"{path}: unknown key {key!r} in fuse configuration (known: {', '.join(_FILE_KEYS)})")
        values[key.replace("-", "_")] = _convert(path, key, kind, raw)
    if "fold_limit" in values:
        values["fold_limit_bytes"] = values.pop("fold_limit")
    known = {f.name for f in fields(FuseConfig)}
    return FuseConfig(**{k: v for k, v in values.items() if k in known})


def _convert(path: Path, key: str, kind: Any, raw: Any) -> Any:
    try:
        if kind == "names":
            return split_names(raw if isinstance(raw, str) else ",".join(raw))
        if kind == "dims":
            if not isinstance(raw, Mapping):
                raise TypeError("expected a table of NAME = VALUE")
            return {str(k): _positive_int(v) for k, v in raw.items()}
        if kind == "megabytes":
            return int(float(raw) * 2**20)
        if kind is bool and not isinstance(raw, bool):
            raise TypeError("expected true or false")
        return kind(raw)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: bad value for {key!r}: {exc}") from exc


def split_names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{value!r} is not a positive integer")
    number = int(value)
    if number <= 0:
        raise ValueError(f"{value!r} is not a positive integer")
    return number


def parse_dims(items: tuple[str, ...]) -> dict[str, int]:
    """`--dim batch=8` -> {"batch": 8}."""
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--dim expects NAME=VALUE, got {item!r}")
        try:
            dims[name.strip()] = _positive_int(value.strip())
        except ValueError as exc:
            raise UsageError(f"--dim {item}: {exc}") from exc
    return dims


def parse_input_shapes(items: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """`--input-shape image:1x3x224x224` -> {"image": (1, 3, 224, 224)}."""
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--input-shape expects NAME:D1xD2x..., got {item!r}")
        try:
            shapes[name] = tuple(_positive_int(d) for d in dims.lower().split("x"))
        except ValueError as exc:
            raise UsageError(f"--input-shape {item}: {exc}") from exc
    return shapes
