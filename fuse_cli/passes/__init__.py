"""The fusion passes, one per module (named after the pass), or one family per module where the
passes share one pattern. Importing this package registers every pass; the machinery they run
on is fuse_cli.pipeline, the helpers they share fuse_cli.toolkit."""

import importlib
import pkgutil

from fuse_cli.pipeline.registry import DEFAULT_PIPELINE, PIPELINES, REGISTRY, TARGETS, pipeline_for, resolve

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DEFAULT_PIPELINE", "PIPELINES", "REGISTRY", "TARGETS", "pipeline_for", "resolve"]
