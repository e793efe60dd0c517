"""Deliberately wrong rewrites, for the mutation suite (tests/test_mutations.py): each is a real
pass whose rewrite is tampered with the way fusion code goes wrong in practice (a dropped eps,
swapped Q and K, an axis off by one, a bias added twice, a residual dropped, ...). Test-only:
they are registered for the duration of one test and never reach the CLI.

A mutation is (name, the real pass, what goes wrong, the models it is applied to). The tamper
edits the match before the real rewrite (a wrong attribute read) or the replacement after it (a
wrong attribute or input written), so the wrong rewrite is the real one but for one mistake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import Replacement
from fuse_cli.passes import REGISTRY
from fuse_cli.pipeline.base import PatternPass

Tamper = Callable[[Replacement, object, object], bool | None]  # (replacement, match, editor): False = not applied


@dataclass(frozen=True)
class Mutation:
    name: str
    base: str  # the real pass
    mistake: str
    target: str
    models: tuple[str, ...]  # model names tests/test_mutations.py knows
    first: tuple[str, ...] = ()  # real passes that make the pattern (conv-bn before fused-conv)
    after: Tamper | None = None
    before: Callable[[object], None] | None = None  # tampers the match (its node attributes)

    def make_pass(self) -> PatternPass:
        base_cls = type(REGISTRY[self.base])
        mutation = self

        class Mutated(base_cls):
            name = f"mutant-{mutation.name}"
            description = f"Broken on purpose: {mutation.mistake}"

            applied = 0  # rewrites the mistake was made in (a tamper returns False where it cannot apply)

            def rewrite(self, m, g) -> Replacement:
                if mutation.before is not None:
                    mutation.before(m)
                replacement = super().rewrite(m, g)
                if mutation.after is None or mutation.after(replacement, m, g) is not False:
                    type(self).applied += 1
                return replacement

        return Mutated()


# --------------------------------------------------------------------------- tamper toolkit

def _node(replacement: Replacement, op: str) -> gs.Node:
    return next(n for n in replacement.nodes if n.op == op)


def set_attr(op: str, key: str, value: Callable) -> Tamper:
    def tamper(rep, m, g):
        node = _node(rep, op)
        node.attrs[key] = value(node.attrs.get(key))
    return tamper


def scale_input(op: str, index: int, factor: Callable[[np.ndarray], np.ndarray]) -> Tamper:
    """Replace the node's constant input `index` by factor(values) (a new constant: the original
    may be shared)."""
    def tamper(rep, m, g):
        node = _node(rep, op)
        values = np.asarray(node.inputs[index].values)
        node.inputs[index] = gs.Constant(f"{node.inputs[index].name}_mutated", factor(values).astype(values.dtype))
    return tamper


def swap_inputs(op: str, i: int, j: int) -> Tamper:
    def tamper(rep, m, g):
        node = _node(rep, op)
        node.inputs[i], node.inputs[j] = node.inputs[j], node.inputs[i]
    return tamper


def drop_input(op: str, index: int) -> Tamper:
    def tamper(rep, m, g):
        node = _node(rep, op)
        while len(node.inputs) > index:
            node.inputs.pop()  # graphsurgeon's synchronized lists take pop, not slice deletion
    return tamper


def replace_input_with(op: str, index: int, source: int) -> Tamper:
    """Input `index` reads input `source` instead: a dropped residual (x + x for x + skip)."""
    def tamper(rep, m, g):
        node = _node(rep, op)
        node.inputs[index] = node.inputs[source]
    return tamper


def rename_op(op: str, new_op: str, domain: str | None = None) -> Tamper:
    def tamper(rep, m, g):
        node = _node(rep, op)
        node.op = new_op
        if domain is not None:
            node.domain = domain
    return tamper


def both(*tampers: Tamper) -> Tamper:
    def tamper(rep, m, g):
        return False if any(t(rep, m, g) is False for t in tampers) else None
    return tamper


def match_attr(capture: str, key: str, value) -> Callable[[object], None]:
    def tamper(m):
        m.node(capture).attrs[key] = value
    return tamper


def _bias_as_column(node: gs.Node) -> None:
    index = next(i for i, t in enumerate(node.inputs) if isinstance(t, gs.Constant))
    values = np.asarray(node.inputs[index].values)
    node.inputs[index] = gs.Constant(f"{node.inputs[index].name}_mutated", values.reshape(-1, 1))


def _bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 through bfloat16 (8 significant bits) and back: a rounding done twice."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x8000) & 0xFFFF0000).view(np.float32)


def _roll_channels(values: np.ndarray) -> np.ndarray:
    return np.roll(values, 1, axis=0)


CNN = ("cnn_bn_relu", "light_resnet50")

MUTATIONS: tuple[Mutation, ...] = (
    # Conv + BatchNormalization
    Mutation("conv-bn-drop-eps", "conv-bn", "folds BatchNormalization ignoring epsilon", "onnx", ("conv_bn_tiny_var",),
             before=match_attr("bn", "epsilon", 0.0)),
    Mutation("conv-bn-eps-unit", "conv-bn", "epsilon read in the wrong unit (x1e4)", "onnx",
             CNN + ("conv_bn_tiny_var",),
             before=lambda m: m.node("bn").attrs.__setitem__("epsilon", m.node("bn").attrs.get("epsilon", 1e-5) * 1e4)),
    Mutation("conv-bn-bias-dropped", "conv-bn", "the folded bias is not written", "onnx", CNN,
             after=drop_input("Conv", 2)),
    Mutation("conv-bn-bias-twice", "conv-bn", "the bias is added twice", "onnx", CNN,
             after=scale_input("Conv", 2, lambda b: 2 * b)),
    Mutation("conv-bn-wrong-channel", "conv-bn", "each scale lands on the next output channel", "onnx", CNN,
             after=scale_input("Conv", 1, _roll_channels)),
    Mutation("conv-bn-bf16-weights", "conv-bn", "folded weights rounded through bfloat16", "onnx", CNN,
             after=scale_input("Conv", 1, _bf16)),
    # MatMul + Add -> Gemm, Gemm + activation
    Mutation("matmul-add-bias-dropped", "matmul-add", "the bias is not passed to Gemm", "onnx", ("mlp", "cnn_bn_relu"),
             after=drop_input("Gemm", 2)),
    Mutation("matmul-add-beta", "matmul-add", "beta left at 2 (the bias added twice)", "onnx", ("mlp", "cnn_bn_relu"),
             after=set_attr("Gemm", "beta", lambda v: 2.0)),
    Mutation("matmul-add-alpha", "matmul-add", "alpha (the product's scale) wrong", "onnx", ("mlp",),
             after=set_attr("Gemm", "alpha", lambda v: 0.5)),
    Mutation("fused-gemm-activation", "fused-gemm", "Sigmoid fused where the graph had Relu", "ort-cpu", ("mlp",),
             first=("matmul-add",), after=set_attr("FusedGemm", "activation", lambda v: "Sigmoid")),
    # Conv + activation (+ residual)
    Mutation("fused-conv-activation", "fused-conv", "Tanh fused where the graph had Relu", "ort-cpu",
             ("cnn_bn_relu", "light_resnet50"), first=("conv-bn",),
             after=set_attr("FusedConv", "activation", lambda v: "Tanh")),
    Mutation("fused-conv-residual-dropped", "fused-conv", "the residual Z is not passed", "ort-cpu",
             ("conv_residual_relu", "light_resnet50"), first=("conv-bn",), after=lambda rep, m, g: _drop_residual(rep)),
    # LayerNormalization
    Mutation("layer-norm-eps-unit", "layer-norm", "epsilon x1e4", "ort-cpu", ("transformer_block_opset14",),
             after=set_attr("LayerNormalization", "epsilon", lambda v: (v or 1e-5) * 1e4)),
    Mutation("layer-norm-axis-off-by-one", "layer-norm", "normalizes over axis -2 instead of -1", "ort-cpu",
             ("transformer_block_opset14",), after=set_attr("LayerNormalization", "axis", lambda v: -2)),
    Mutation("layer-norm-gamma-beta-swapped", "layer-norm", "gamma and beta swapped", "ort-cpu",
             ("transformer_block_opset14",), after=swap_inputs("LayerNormalization", 1, 2)),
    # GELU
    Mutation("gelu-wrong-form", "contrib-gelu", "x*sigmoid(1.702x) written for the exact erf GELU", "ort-cpu",
             ("transformer_block_opset14", "transformer_block_opset17"),
             after=rename_op("Gelu", "QuickGelu", "com.microsoft")),
    Mutation("bias-gelu-bias-dropped", "bias-gelu", "the bias is not passed to BiasGelu", "ort-cuda",
             ("transformer_block_opset17",), first=("contrib-gelu",),
             after=both(drop_input("BiasGelu", 1), rename_op("BiasGelu", "Gelu"))),
    Mutation("pin-gelu-bias-column", "pin-gelu-bias", "the bias written as an [N, 1] column, not a [1, N] row", "onnx",
             ("transformer_block_opset17",), after=lambda rep, m, g: _bias_as_column(_node(rep, "Add"))),
    # Attention
    Mutation("attention-swapped-qk", "attention", "query and key swapped", "ort-cpu", ("transformer_block_opset17",),
             after=swap_inputs("MultiHeadAttention", 0, 1)),
    Mutation("attention-wrong-scale", "attention", "scores scaled by 1/d instead of 1/sqrt(d)", "ort-cpu",
             ("transformer_block_opset17",),
             after=set_attr("MultiHeadAttention", "scale", lambda v: (v or 0.125) ** 2)),
    Mutation("attention-heads", "attention", "num_heads off by a factor of 2", "ort-cpu",
             ("transformer_block_opset17",),
             after=set_attr("MultiHeadAttention", "num_heads", lambda v: v * 2)),
    Mutation("attention-causal", "attention", "a causal mask added to bidirectional attention", "ort-cpu",
             ("transformer_block_opset17",), after=set_attr("MultiHeadAttention", "unidirectional", lambda v: 1)),
    Mutation("attention-value-is-key", "attention", "keys passed as values", "ort-cpu", ("transformer_block_opset17",),
             after=replace_input_with("MultiHeadAttention", 2, 1)),
    # Decoder LLMs: rotary embedding, grouped-query attention
    Mutation("rotary-interleaved", "rotary-embedding", "rotates interleaved pairs, not the two halves", "ort-cpu",
             ("llama_attention",), after=set_attr("RotaryEmbedding", "interleaved", lambda v: 1)),
    Mutation("rotary-cos-sin-swapped", "rotary-embedding", "cos and sin caches swapped", "ort-cpu",
             ("llama_attention",), after=swap_inputs("RotaryEmbedding", 2, 3)),
    Mutation("gqa-mask-dropped", "group-query-attention", "the graph's causal + padding mask not passed", "ort-cpu",
             ("llama_attention",), first=("rotary-embedding",), after=drop_input("GroupQueryAttention", 10)),
    Mutation("gqa-wrong-scale", "group-query-attention", "scores scaled by 1/d instead of 1/sqrt(d)", "ort-cpu",
             ("llama_attention",), first=("rotary-embedding",),
             after=set_attr("GroupQueryAttention", "scale", lambda v: (v or 8**-0.5) ** 2)),
    Mutation("cached-attention-mask-dropped", "cached-attention", "the decode step's mask (causal offset, padding) "
             "not passed", "ort-cpu", ("llama_decode_step",), first=("rotary-embedding",),
             after=drop_input("MultiHeadAttention", 5)),
    # Skip normalization
    Mutation("skip-layer-norm-residual-dropped", "skip-layer-norm", "x + x instead of x + skip", "ort-cuda",
             ("transformer_block_opset17",), after=replace_input_with("SkipLayerNormalization", 1, 0)),
    Mutation("skip-layer-norm-eps", "skip-layer-norm", "epsilon left at the contrib default x1e4", "ort-cuda",
             ("transformer_block_opset17",),
             after=set_attr("SkipLayerNormalization", "epsilon", lambda v: (v or 1e-12) * 1e4 + 1e-1)),
    # Layout
    Mutation("transposes-wrong-perm", "fuse-transposes", "composes the permutations in the wrong order", "onnx",
             ("transpose_chain",), after=set_attr("Transpose", "perm", lambda v: list(reversed(v)))),
    Mutation("pad-conv-pads-doubled", "pad-conv", "pads added twice", "onnx", ("pad_conv",),
             after=set_attr("Conv", "pads", lambda v: [2 * p for p in v])),
    Mutation("fused-matmul-alpha", "fused-matmul", "the scalar folded in twice", "ort-cpu", ("attention_scores",),
             after=set_attr("FusedMatMul", "alpha", lambda v: 2 * (v or 1.0))),
)


def _drop_residual(rep: Replacement) -> bool | None:
    """FusedConv(X, W, B, Z): Z, the residual summed before the activation, left out."""
    node = _node(rep, "FusedConv")
    if len(node.inputs) < 4:
        return False  # a FusedConv without a residual: nothing to get wrong here
    node.inputs.pop()
    return None
