"""One frozen configuration: `[tool.fuse]` in pyproject.toml or a fuse.toml, then CLI flags.

The file is found by walking up from the working directory; the nearest fuse.toml, or the
nearest pyproject.toml with a [tool.fuse] table, wins. Command-line flags override file keys.
"""

from __future__ import annotations

import math
import re
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
# The `schedule` pass's execution rules: onnxruntime's DEFAULT walk, the stored order, or both.
SCHEDULE_FOR = ("onnxruntime", "stored", "both")


# What a symbolic dim nobody bound stands for in the memory estimate and in benchmarks: 1, and the
# report lists it. Verification does not use it: it binds distinct primes (input_domain.py).
UNBOUND_DIM = 1


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
    upgrade_opset: int | None = None  # convert to this opset before fusing (onnx version converter)
    verify: bool = True  # compare with the original in onnxruntime; roll back passes that break it
    int_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # random integer inputs, high exclusive
    rtol: float | None = None  # None: per-dtype defaults (fuse_cli.verify.DEFAULT_TOLERANCES)
    atol: float | None = None
    allow_mismatch: bool = False  # exit 0 even when a pass had to be rolled back
    require_verified: bool = False  # exit 1 unless verification confirmed the output (CI)
    allow_peak_growth: bool = False  # keep rewrites that raise the estimated peak above the original's
    # CI gates: each makes the run exit 1 when its condition holds
    fail_on_fusable: bool = False  # any pass still fires: the model was not optimized
    max_peak_bytes: int | None = None  # estimated peak activation memory (after fusion) above this
    fail_on_near_miss: tuple[str, ...] = ()  # these passes report a near-miss
    measure: bool = False  # also measure the peak in onnxruntime (a child process per model)
    schedule_for: str | None = None  # the node order's execution rule (SCHEDULE_FOR); None: by target
    max_memory_bytes: int | None = None  # the run's memory cap (core/memory_cap.py); None: 75% of RAM
    source: str = "defaults"

    @property
    def schedule_rules(self) -> tuple[str, ...]:
        """The execution rules the `schedule` pass orders for: onnxruntime's walk for its targets;
        for --target onnx both it and the stored order (runtimes that follow the file)."""
        chosen = self.schedule_for or ("onnxruntime" if self.target != "onnx" else "both")
        return ("onnxruntime", "stored") if chosen == "both" else (chosen,)

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
    "require-verified": bool,
    "allow-peak-growth": bool,
}


def find_config_file(start: Path | None = None) -> tuple[Path, Mapping[str, Any]] | None:
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        fuse_toml = candidate / "fuse.toml"
        if fuse_toml.is_file():
            return fuse_toml, _read_toml(fuse_toml)
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            tool = _read_toml(pyproject).get("tool", {})
            table = tool.get("fuse") if isinstance(tool, Mapping) else None
            if table is not None:
                if not isinstance(table, Mapping):
                    raise UsageError(f"{pyproject}: [tool.fuse] must be a table of settings")
                return pyproject, table
    return None


def _read_toml(path: Path) -> Mapping[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{path}: cannot read configuration ({detail})") from exc


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
    """Check a file value's type strictly: TOML is typed, so `target = 1` or `fold-limit = true`
    is a mistake to report, not a value to coerce."""
    try:
        if kind == "names":
            if isinstance(raw, str):
                return split_names(raw)
            if isinstance(raw, list) and all(isinstance(name, str) for name in raw):
                return split_names(",".join(raw))
            raise TypeError('expected a list of pass names, like ["conv-bn", "matmul-add"]')
        if kind == "dims":
            if not isinstance(raw, Mapping):
                raise TypeError("expected a table of NAME = VALUE")
            return {str(k): _positive_int(v) for k, v in raw.items()}
        if kind == "megabytes":
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < math.inf:
                raise TypeError(f"expected a number of megabytes >= 0, got {raw!r}")
            return int(raw * 2**20)
        if not isinstance(raw, kind):
            raise TypeError(f"expected {'true or false' if kind is bool else 'a string'}, got {raw!r}")
        return raw
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: bad value for {key!r}: {exc}") from exc


def split_names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive_int(value: Any) -> int:
    number = None
    if not isinstance(value, bool) and not (isinstance(value, float) and not value.is_integer()):
        try:
            number = int(value)
        except (TypeError, ValueError):
            pass
    if number is None or number <= 0:
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
            shapes[name] = tuple(_positive_int(d) for d in re.split("[xX]", dims))
        except ValueError as exc:
            raise UsageError(f"--input-shape {item}: {exc}") from exc
    return shapes
