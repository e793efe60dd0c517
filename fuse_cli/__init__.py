"""fuse: an ONNX operator-fusion optimizer with an activation-memory audit.

The Python API (fuse_cli/public.py), what the CLI's commands do as calls:

    import fuse_cli
    result = fuse_cli.optimize(model)          # fuse optimize, writing nothing; model: ModelProto or path
    result.model, result.report, result.to_dict(), result.save("out.onnx")
    fuse_cli.audit_model(model)                # fuse report
    fuse_cli.compare_models(original, other)   # fuse verify

(`report` and `verify` are names of fuse's own modules, hence audit_model and compare_models.)
Errors: fuse_cli.InputError (exit 2), CheckFailed (1), InternalError (3), all FuseErrors.

The API is imported on first use: `import fuse_cli` stays light, as the onnxruntime worker process
(core/isolation.py), which imports this package, must not pay onnx's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fuse_cli.errors import CheckFailed, FuseError, InputError, InternalError

# Semantic versioning: a release that removes or changes a public name, or a field of the JSON
# report (report/report.schema.json: its schema_version), is a major one (minor while 0.x).
__version__ = "0.2.0"

_PUBLIC = ("optimize", "audit_model", "compare_models", "FuseResult", "Comparison")

# _PUBLIC spelled out, not unpacked, so that linters see the lazily imported names as exported
__all__ = ["__version__", "CheckFailed", "FuseError", "InputError", "InternalError",
           "optimize", "audit_model", "compare_models", "FuseResult", "Comparison"]

if TYPE_CHECKING:
    from fuse_cli.public import Comparison, FuseResult, audit_model, compare_models, optimize


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        from fuse_cli import public

        return getattr(public, name)
    raise AttributeError(f"module 'fuse_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
