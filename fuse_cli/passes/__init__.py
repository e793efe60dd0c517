"""Fusion passes: one family per module. Importing this package registers every pass."""

import importlib
import pkgutil

from fuse_cli.passes.registry import DEFAULT_PIPELINE, REGISTRY, TARGETS, pipeline_for, resolve

_INFRASTRUCTURE = {"base", "engine", "registry"}

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DEFAULT_PIPELINE", "REGISTRY", "TARGETS", "pipeline_for", "resolve"]
