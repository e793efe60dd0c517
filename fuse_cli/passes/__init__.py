"""Fusion passes. Importing this package registers every pass."""

from fuse_cli.passes import (  # noqa: F401  (imported for registration)
    conv_bn,
    eliminate,
    fold_constants,
    matmul_add,
)
from fuse_cli.passes.registry import DEFAULT_PIPELINE, REGISTRY, TARGETS, pipeline_for, resolve

__all__ = ["DEFAULT_PIPELINE", "REGISTRY", "TARGETS", "pipeline_for", "resolve"]
