"""The pass registry and the explicit pipelines, readable top to bottom.

Order matters and is part of the design: constants are folded first so weights built by
ConstantOfShape/Constant nodes become foldable; eliminations come before fusions so an Identity
between Conv and BatchNormalization does not block the fold.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from fuse_cli.errors import UsageError
from fuse_cli.pipeline.base import Pass
from fuse_cli.targets import TARGETS, targets_of_provider_alone, usable_targets

REGISTRY: dict[str, Pass] = {}


PORTABLE_PIPELINE: tuple[str, ...] = (
    # 1. make weights constant and drop what computes nothing
    "fold-constants",
    "inline-constant-if",  # after fold-constants, which may have made a condition a constant
    "eliminate-identity",
    "eliminate-dropout",
    "eliminate-noop-arith",
    "fold-scale-chains",
    "eliminate-empty-concat-inputs",  # before eliminate-noop-layout, which removes the one-input Concat left
    "eliminate-noop-layout",
    "merge-equal-weights",  # before eliminate-common-subexpressions: nodes reading equal copies then merge
    "eliminate-common-subexpressions",  # exporters compute Shape(x)[i] once per use
    # 2. layout and type plumbing that exporters leave behind
    "fuse-transposes",
    "fuse-reshapes",
    "reshape-around-elementwise",
    "static-reshape-shape",
    "static-shape-dims",
    "fold-shape-comparisons",
    "fuse-squeeze-unsqueeze",
    "merge-unsqueezes",
    "flatten-concats",
    "fuse-casts",
    "eliminate-flatten",
    # 3. fold affine arithmetic into Conv/Gemm weights (before anything fuses the activations)
    "pad-conv",
    "conv-bn",  # before bn-conv: folding into the Conv before a BN is exact at any padding
    "bn-conv",
    "concat-conv-bn",
    "conv-mul",
    "conv-add",
    "bn-mul",  # after conv-bn: a BatchNormalization its Conv could take is gone by now
    "bn-add",
    "matmul-bn",
    # QDQ node units as the standard quantized operators: after the folds, which leave a unit alone;
    # a pair around a move first, so that a unit reads the moved quantized values
    "drop-qdq-pairs",
    "qlinear-conv",
    "qlinear-matmul",
    # 4. decomposed normalizations and activations -> single standard operators
    "layer-norm",
    "moments-layer-norm",
    "rms-norm",
    "standard-rotary-embedding",  # opset 23; before standard-attention, which then finds Q and K as [B, S, H*d]
    "standard-rotary-before-head-split",  # one fused on split heads (behind a per-head norm) moves onto the projection
    "standard-attention",  # opset 23
    "standard-cached-attention",  # opset 23; after standard-attention: K/V held as heads (cross-attention)
    "gelu",
    "hard-sigmoid",
    "hard-swish",
    # 5. bias into Gemm, then whatever BatchNormalization is left
    "matmul-add",
    "matmul-add-into-view",
    "bn-affine",
    # 6. the form onnxruntime's own level-all optimizer meets: no slower CPU BiasGelu made of it
    "pin-gelu-bias",
    # 7. last, on the final operators, model passes run once: the dims onnxruntime's planner sees,
    # then the stored node order
    "unhold-buffers",
    "schedule",
)

# onnxruntime targets: the portable pipeline with onnxruntime's fused operators slotted in where
# their inputs are ready. Order dependencies (each has a test in tests/test_pipeline_order.py):
# - attention and bias-gelu run before matmul-add, which would otherwise turn their MatMul + Add
#   into Gemm and hide the pattern;
# - skip-layer-norm runs after layer-norm, whose LayerNormalization it absorbs;
# - fused-conv runs after every fold into Conv weights, fused-gemm after matmul-add.
RUNTIME_PIPELINE: tuple[str, ...] = (
    *PORTABLE_PIPELINE[: PORTABLE_PIPELINE.index("layer-norm")],
    # before attention and skip-layer-norm: a projection's bias goes into the quantized kernel's epilogue
    "dynamic-quantize-matmul",
    "layer-norm",
    "moments-layer-norm",
    "rms-norm",
    "simplified-layer-norm",
    "skip-layer-norm",
    "skip-simplified-layer-norm",
    "rotary-embedding",  # before the attentions, which then find Q and K rotated in their [B, S, H*d] form
    "rotary-before-head-split",  # a RotaryEmbedding fused on split heads moves onto the projection too
    "group-query-attention",
    "attention",
    "packed-attention",  # right after attention: its MultiHeadAttention over three projections of one input
    "cached-attention",  # after both: a decode step's K/V are the cache's present heads, not a projection's split
    "gelu",
    "contrib-gelu",
    "fast-gelu",
    "quick-gelu",
    "bias-gelu",
    "hard-sigmoid",
    "hard-swish",
    "fused-matmul",
    "matmul-add",
    "matmul-add-into-view",
    "fused-conv",
    "qgemm",  # before fused-gemm, which leaves a QDQ unit alone anyway
    "qlinear-binary",
    "qlinear-global-average-pool",
    "fused-gemm",
    "bn-affine",
    "pin-gelu-bias",  # after every GELU and bias pass; not on ort-cuda, where BiasGelu is faster
    "write-cpu-casts",  # ort-cpu's float16 models: the nodes its provider runs, before the planner's dims and the order
    "unhold-buffers",
    "pin-residual-dims",  # after unhold-buffers, which may drop the exporter's declarations
    "schedule",
)

PIPELINES: dict[str, tuple[str, ...]] = {
    "onnx": PORTABLE_PIPELINE,
    "ort": RUNTIME_PIPELINE,
    "ort-cpu": RUNTIME_PIPELINE,
    "ort-cuda": RUNTIME_PIPELINE,
}
DEFAULT_PIPELINE = PORTABLE_PIPELINE


def register(cls: type[Pass]) -> type[Pass]:
    """Adds the pass; one that emits non-standard operators belongs to the targets that run them."""
    if cls.emits:
        cls.targets = usable_targets(cls.emits)
    if cls.for_provider:
        cls.targets = cls.targets & targets_of_provider_alone(cls.for_provider)
    instance = cls()
    if instance.name in REGISTRY:
        raise RuntimeError(f"pass {instance.name!r} registered twice")
    REGISTRY[instance.name] = instance
    return cls


def pipeline_for(target: str) -> tuple[str, ...]:
    """The target's pipeline, less the passes whose output that target cannot run."""
    _check_target(target)
    # Names not registered yet are skipped here; tests/test_registry.py fails until they all are.
    return tuple(name for name in PIPELINES[target] if name in REGISTRY and target in REGISTRY[name].targets)


def resolve(target: str, passes: Iterable[str] | None = None, disable: Iterable[str] = ()) -> list[Pass]:
    """The passes to run, in pipeline order. Unknown names are usage errors with a suggestion:
    silently ignoring a misspelled pass name leaves users with wrong results they never notice."""
    _check_target(target)
    chosen = list(passes) if passes is not None else list(pipeline_for(target))
    disabled = list(disable)
    for name in chosen + disabled:
        _check_name(name)
    for name in chosen:
        if target not in REGISTRY[name].targets:
            allowed = ", ".join(sorted(REGISTRY[name].targets))
            raise UsageError(f"pass {name!r} emits operators that target {target!r} cannot run (targets: {allowed})")
    order = {name: i for i, name in enumerate(PIPELINES[target])}
    selected = sorted(set(chosen) - set(disabled), key=lambda n: order.get(n, len(order)))
    return [REGISTRY[name] for name in selected]


def _check_name(name: str) -> None:
    if name in REGISTRY:
        return
    close = difflib.get_close_matches(name, REGISTRY.keys(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known passes: {', '.join(sorted(REGISTRY))}"
    raise UsageError(f"unknown pass {name!r}{hint}")


def _check_target(target: str) -> None:
    if target not in TARGETS:
        close = difflib.get_close_matches(target, TARGETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown target {target!r} (choose from {', '.join(TARGETS)}){hint}")
