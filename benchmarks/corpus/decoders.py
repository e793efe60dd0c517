"""Export the decoder corpus: random-init decoder LLMs with a KV cache, as onnxruntime serves them.

Each model in two graphs per exporter:

  prefill  input_ids, attention_mask [batch, sequence] -> last_hidden_state, present.N.key/value
           [batch, kv_heads, sequence, head_size] (the prompt's K/V, no past)
  decode   input_ids [batch, sequence], attention_mask [batch, past_sequence + sequence],
           past_key_values.N.key/value [batch, kv_heads, past_sequence, head_size]
           -> last_hidden_state, present.N.key/value [batch, kv_heads, past_sequence + sequence, head_size]
           (a decode step has sequence 1; the graph takes any)

each also with `position_ids` [batch, sequence] as an input (file names `...-positions-...`, manifest
`positions: true`): transformers 5.x's `model(input_ids, attention_mask, position_ids,
past_key_values)`, as a generation loop calls it, the rotary cos/sin then computed per row from the
given ids ([batch, 1, sequence, head_size], not the [1, 1, sequence, head_size] of positions the
model makes itself). The ids fed are generation's: cumsum(attention_mask) - 1 (0 on padding), the
last `sequence` of them. Decoder-only models (not Whisper's decoder).

and two exporters: `opset17` (TorchScript, eager attention: MatMul/Softmax/MatMul) and `dynamo18`
(torch.export, opset 18, the library's default sdpa attention). Models (vocab 1000): Llama, Qwen2,
Qwen3, Mistral, Gemma and Gemma2 with grouped K/V heads, Phi-3 (packed QKV) and GPT-2 (one K/V head
per head), see MODELS, each at every size of SIZES:

  tiny   hidden 128, 2 layers, 4 heads of 32 (2 KV heads where grouped), MLP 344
  small  hidden 512, 4 layers, 8 heads of 64 (2 KV heads where grouped), MLP 1368

(head sizes 32 and 64, so GroupQueryAttention's CPU kernel applies; the MLP is Llama's 8/3 ratio,
Qwen2's is 11/4: 352 and 1408; GPT-2's is its default 4x). File names carry the size except for
tiny: `llama-gqa-prefill-opset17.onnx`, `llama-gqa-small-prefill-opset17.onnx`.

One encoder-decoder, Whisper's decoder (EncoderDecoder), with Optimum's cache names and no decoder
attention_mask (neither Optimum's nor onnxruntime's Whisper export has one):

  prefill  input_ids [batch, sequence], encoder_hidden_states [batch, encoder_sequence, d_model]
           -> last_hidden_state, present.N.decoder.key/value [batch, heads, sequence, head_size]
           (self-attention) and present.N.encoder.key/value [batch, heads, encoder_sequence,
           head_size] (cross-attention K/V, computed once from the encoder's states)
  decode   input_ids, past_key_values.N.decoder.key/value [batch, heads, past_sequence, head_size],
           past_key_values.N.encoder.key/value [batch, heads, encoder_sequence, head_size] (the
           prefill's cross K/V as cached inputs, as onnxruntime's Whisper decoder takes them; no
           encoder states) -> last_hidden_state, present.N.decoder.key/value [batch, heads,
           past_sequence + sequence, head_size]

(d_model, heads and decoder layers from SIZES: tiny 128, 4 of 32, 2 layers; small 512, 8 of 64, 4).

    .venv-corpus/bin/python benchmarks/corpus/decoders.py [--out DIR] [--only NAME,...] [--sizes tiny,small]
        [--positions without,with] [--dtype float32|float16] [--force]

DIR defaults to $FUSE_DECODER_MODELS or benchmarks/corpus/decoder-models (float16:
$FUSE_DECODER_MODELS_FP16 or benchmarks/corpus/decoder-models-fp16).

`--dtype float16` writes the float16 copies (issue 32: fp16 copies fuse what their fp32 copies
fuse) to their own folder under the same file names: the same seeded, perturbed model made
`model.half()` before export (as corpus/fp16.py does for the base corpus), so the past K/V inputs,
the encoder states and every float output are float16; torch's float16 forward on the CPU is the
reference, at FP16_CHECK_REL_TOL. The manifest records `dtype`; an export that fails is recorded
with its error (a skip the fusion table reports), never dropped. Every export is traced at
batch 2, sequence 7, past 5 (encoder 9) and checked in onnxruntime (optimizations off) against torch
at batch 3, sequence 2 (decode) or 11 (prefill), past 13 (encoder 15), with padding in the first
row's mask where there is one; the manifest records the check, node and op counts, inputs with
symbolic dims and their ranges, the size (`size`, `size_config`) and the dynamo form's dim bounds
(`dim_max`). `--sizes` (default all: tiny,small) chooses the sizes exported, `--positions` (default both:
without,with) the graphs without and with a position_ids input.

Gemma2's decode step is bounded to past_sequence <= 511: its sliding-window layer (window 512)
masks by whether the window is full, which torch.export decides at trace time (guard
`past_key_values_0_key.size()[2] <= 511`; with the default bound 512 the dynamo export failed
"Constraints violated (past_sequence)"). The graph is the window-not-full one, in both forms. A
longer past is outside the graph's interface anyway: the sliding layer's present keeps the last 511
positions while the full layer's keeps all, so the presents stop sharing one past_sequence. Up to
past 511 both forms match torch (also checked at past 300 + sequence 300, where the sliding layer's
present is 511 long, shorter than its declared past_sequence + sequence).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import io
import json
import os
import platform
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as base  # noqa: E402 - the sibling script, not an installed package

DEFAULT_OUT = Path(os.environ.get("FUSE_DECODER_MODELS", base.HERE / "decoder-models"))
DEFAULT_OUT_FP16 = Path(os.environ.get("FUSE_DECODER_MODELS_FP16", base.HERE / "decoder-models-fp16"))
DTYPES = ("float32", "float16")  # --dtype: the model's parameters, past K/V and float outputs
# float16 through a few layers rounds each op's output to 11 bits; a wrong conversion (a lost Cast,
# a float16 overflow) is off by far more than this fraction of the output's largest magnitude.
FP16_CHECK_REL_TOL = 2e-2
VOCAB = 1000
FORMS = {"opset17": ("torchscript", 17), "dynamo18": ("dynamo", 18)}
KINDS = ("prefill", "decode")
POSITIONS = {"without": False, "with": True}  # --positions: a position_ids input or not
TRACE = {"batch": 2, "sequence": 7, "past_sequence": 5, "encoder_sequence": 9}
CHECK = {"batch": 3, "sequence": 2, "past_sequence": 13, "encoder_sequence": 15}
# What the dynamo exports accept (Decoder.dim_max lowers past_sequence below a sliding window);
# encoder_sequence reaches Whisper's 1500 frames (30 s of audio).
DIM_MAX = {"batch": 64, "sequence": 512, "past_sequence": 512, "encoder_sequence": 1500}
CHECK_PREFILL_SEQUENCE = 11
# The mask's and the present K/V's length, written as the arithmetic it is (as dynamo's `s0 + s1`):
# fuse's input domain then evaluates it instead of giving it a size of its own that no run accepts.
TOTAL = "past_sequence + sequence"


@dataclass
class Graph:
    """One exported graph's interface: names in order, each input's and output's symbolic dims by
    axis (names of TRACE, or TOTAL), and the output dims that are static (see pin_static_dims)."""
    inputs: list[str]
    outputs: list[str]
    axes: dict[str, dict[int, str]]
    static: dict[str, dict[int, int]]

    def dims(self) -> list[str]:
        """The plain symbolic dims (TOTAL is their sum), in TRACE's order."""
        used = {d for by_axis in self.axes.values() for d in by_axis.values()}
        return [d for d in TRACE if d in used]


def cache_tensors(graph: Graph, prefix: str, layers: int, parts: dict[str, str], heads: int, size: int) -> None:
    """Add `prefix.N[.part].key/value` [batch, heads, parts[part], size] per layer to `graph`, as
    inputs (prefix past_key_values) or outputs (present). `parts` maps a part name ("" for a
    decoder-only cache) to the dim of its length; outputs get heads and size pinned as static."""
    outputs = prefix == "present"
    for i in range(layers):
        for part, length in parts.items():
            for kv in ("key", "value"):
                name = ".".join(filter(None, (prefix, str(i), part, kv)))
                (graph.outputs if outputs else graph.inputs).append(name)
                graph.axes[name] = {0: "batch", 2: length}
                if outputs:
                    graph.static[name] = {1: heads, 3: size}


def kv_heads(config) -> tuple[int, int]:
    """(K/V heads, head size) of a decoder config."""
    heads = config.num_attention_heads
    return getattr(config, "num_key_value_heads", None) or heads, config.hidden_size // heads


def token_ids(dims: dict[str, int], gen):
    """[batch, sequence] ids over the whole vocabulary."""
    torch = base._torch()
    return torch.randint(0, VOCAB, (dims["batch"], dims["sequence"]), generator=gen, dtype=torch.int64)


def named_forward(step_class, names: list[str]) -> None:
    """torch.export binds dynamic_shapes to forward's parameter names: give `forward(self, *args)`
    one per graph input."""
    p = inspect.Parameter
    step_class.forward.__signature__ = inspect.Signature(
        [p("self", p.POSITIONAL_OR_KEYWORD)] + [p(n.replace(".", "_"), p.POSITIONAL_OR_KEYWORD) for n in names])


@dataclass
class Decoder:
    """A decoder-only model: input_ids and attention_mask, a DynamicCache built from the config (so
    Gemma2's sliding layers are sliding)."""
    name: str
    make: Callable[["Size"], tuple[Any, Any]]  # Size -> (model class, config)
    note: str
    dynamo_attention: str = "sdpa"  # the library's attention for the dynamo export (Gemma2 has no sdpa)
    family = "decoder-only"

    def graph(self, config, decode: bool, positions: bool = False) -> Graph:
        total = TOTAL if decode else "sequence"
        graph = Graph(["input_ids", "attention_mask"], ["last_hidden_state"],
                      {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: total},
                       "last_hidden_state": {0: "batch", 1: "sequence"}},
                      {"last_hidden_state": {2: config.hidden_size}})
        if positions:
            graph.inputs.append("position_ids")
            graph.axes["position_ids"] = {0: "batch", 1: "sequence"}
        kv, size = kv_heads(config)
        if decode:
            cache_tensors(graph, "past_key_values", config.num_hidden_layers, {"": "past_sequence"}, kv, size)
        cache_tensors(graph, "present", config.num_hidden_layers, {"": total}, kv, size)
        return graph

    def step(self, model, graph: Graph, decode: bool):
        """forward(input_ids, attention_mask[, position_ids][, past K, past V per layer]) ->
        (last_hidden_state, present K, present V per layer): plain tensors in and out, the cache
        built inside."""
        torch = base._torch()
        from transformers import DynamicCache
        layers = model.config.num_hidden_layers
        positions = "position_ids" in graph.inputs

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, *rest):
                position_ids, past = (rest[0], rest[1:]) if positions else (None, rest)
                pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)] if past else None
                cache = DynamicCache(pairs, config=self.model.config)
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 cache=cache, use_cache=True, return_dict=True)
                present = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
                return (out.last_hidden_state, *present)

        named_forward(Step, graph.inputs)
        return Step().eval()

    def inputs(self, config, decode: bool, dims: dict[str, int], gen, positions: bool = False) -> tuple:
        """Ids over the vocabulary; a 0/1 mask padding the first row by 2: at the end for a prefill
        (left padding there makes fully masked query rows, whose outputs torch's sdpa and eager
        attention define differently), at the start for a decode step (the padded prompt of a batch
        being generated); with `positions`, generation's position ids for that mask (cumsum - 1,
        0 on padding: the first row's differ from the others'); random past K/V."""
        torch = base._torch()
        batch, past = dims["batch"], dims["past_sequence"]
        ids = token_ids(dims, gen)
        mask = torch.ones(batch, past + dims["sequence"] if decode else dims["sequence"], dtype=torch.int64)
        if decode:
            mask[0, :2] = 0
        else:
            mask[0, -2:] = 0
        given = ((mask.cumsum(-1) - 1).clamp(min=0)[:, -dims["sequence"]:],) if positions else ()
        if not decode:
            return (ids, mask, *given)
        kv, size = kv_heads(config)
        return (ids, mask, *given, *(torch.randn(batch, kv, past, size, generator=gen)
                                     for _ in range(2 * config.num_hidden_layers)))

    def dim_max(self, config) -> dict[str, int]:
        """The dynamo export's upper bounds. A sliding-window layer keeps the last `window - 1`
        tokens and masks by whether its window is full, a branch torch.export resolves at trace time
        (Gemma2 guards `past_sequence <= 511` for window 512): the graph is the window-not-full one,
        so its past is bounded to `window - 1`."""
        from transformers import DynamicCache
        windows = [layer.sliding_window for layer in DynamicCache(config=config).layers
                   if getattr(layer, "is_sliding", False)]
        limit = min([DIM_MAX["past_sequence"], *(w - 1 for w in windows)])
        return {**DIM_MAX, "past_sequence": limit}


@dataclass
class EncoderDecoder(Decoder):
    """An encoder-decoder's decoder with an EncoderDecoderCache, as Optimum's and onnxruntime's
    Whisper exports serve it (no decoder attention_mask: Whisper generation has none). The prefill
    takes the encoder's states and returns the cross-attention K/V it computed from them beside the
    self-attention K/V; the decode step takes the cross K/V as cached inputs
    (`past_key_values.N.encoder.key`), never the encoder states, and returns only the self K/V."""
    family = "encoder-decoder"

    def graph(self, config, decode: bool) -> Graph:
        total = TOTAL if decode else "sequence"
        graph = Graph(["input_ids"], ["last_hidden_state"],
                      {"input_ids": {0: "batch", 1: "sequence"}, "last_hidden_state": {0: "batch", 1: "sequence"}},
                      {"last_hidden_state": {2: config.d_model}})
        heads, layers = config.decoder_attention_heads, config.decoder_layers
        size = config.d_model // heads
        if decode:
            cache_tensors(graph, "past_key_values", layers,
                          {"decoder": "past_sequence", "encoder": "encoder_sequence"}, heads, size)
            cache_tensors(graph, "present", layers, {"decoder": total}, heads, size)
        else:
            graph.inputs.append("encoder_hidden_states")
            graph.axes["encoder_hidden_states"] = {0: "batch", 1: "encoder_sequence"}
            cache_tensors(graph, "present", layers, {"decoder": total, "encoder": "encoder_sequence"}, heads, size)
        return graph

    def step(self, model, graph: Graph, decode: bool):
        """forward(input_ids, encoder_hidden_states) (prefill) or forward(input_ids, then per layer
        self K, self V, cross K, cross V) (decode) -> (last_hidden_state, the presents of `graph`)."""
        torch = base._torch()
        from transformers import DynamicCache, EncoderDecoderCache
        layers = model.config.decoder_layers

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.decoder = model.decoder

            def forward(self, input_ids, *rest):
                if decode:
                    self_kv = DynamicCache([(rest[4 * i], rest[4 * i + 1]) for i in range(layers)])
                    cross_kv = DynamicCache([(rest[4 * i + 2], rest[4 * i + 3]) for i in range(layers)])
                    # A filled cross cache is marked updated, so cross-attention reads it and never
                    # these states; the layer only needs them to be not None to run cross-attention.
                    states = rest[2]
                else:
                    self_kv, cross_kv, states = DynamicCache(), DynamicCache(), rest[0]
                out = self.decoder(input_ids=input_ids, encoder_hidden_states=states,
                                   cache=EncoderDecoderCache(self_kv, cross_kv), use_cache=True, return_dict=True)
                present = []
                for own, cross in zip(out.cache.self_attention_cache.layers, out.cache.cross_attention_cache.layers):
                    present += [own.keys, own.values] + ([] if decode else [cross.keys, cross.values])
                return (out.last_hidden_state, *present)

        named_forward(Step, graph.inputs)
        return Step().eval()

    def inputs(self, config, decode: bool, dims: dict[str, int], gen) -> tuple:
        """Ids over the vocabulary; random encoder states (prefill) or random self and cross K/V (decode)."""
        torch = base._torch()
        batch, heads = dims["batch"], config.decoder_attention_heads
        size = config.d_model // heads
        if not decode:
            return token_ids(dims, gen), torch.randn(batch, dims["encoder_sequence"], config.d_model, generator=gen)
        lengths = [dims["past_sequence"]] * 2 + [dims["encoder_sequence"]] * 2
        return (token_ids(dims, gen), *(torch.randn(batch, heads, n, size, generator=gen)
                                        for _ in range(config.decoder_layers) for n in lengths))


@dataclass(frozen=True)
class Size:
    """One row of SIZES: every family's config takes its dims from here (`mlp(ratio)` rounds
    hidden * ratio up to a multiple of 8: 8/3 is Llama's ratio, 344 at hidden 128)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int  # the grouped families' K/V heads (Phi-3, GPT-2 and Whisper have one per head)

    @property
    def head(self) -> int:
        return self.hidden // self.heads

    def mlp(self, ratio: float = 8 / 3) -> int:
        return -(-int(self.hidden * ratio) // 8) * 8

    def fields(self) -> dict[str, int]:
        return {"hidden": self.hidden, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
                "head": self.head, "mlp": self.mlp(), "qwen2_mlp": self.mlp(QWEN2_RATIO)}


QWEN2_RATIO = 11 / 4  # Qwen2's MLP ratio (352 at hidden 128)
# tiny's file names carry no size (`llama-gqa-prefill-opset17.onnx`); the others insert it
# (`llama-gqa-small-prefill-opset17.onnx`).
SIZES = {"tiny": Size(hidden=128, layers=2, heads=4, kv_heads=2),
         "small": Size(hidden=512, layers=4, heads=8, kv_heads=2)}


def _llama(size: Size):
    from transformers import LlamaConfig, LlamaModel
    return LlamaModel, LlamaConfig(vocab_size=VOCAB, hidden_size=size.hidden, intermediate_size=size.mlp(),
                                   num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                   num_key_value_heads=size.kv_heads, max_position_embeddings=512)


def _qwen2(size: Size):
    from transformers import Qwen2Config, Qwen2Model
    return Qwen2Model, Qwen2Config(vocab_size=VOCAB, hidden_size=size.hidden, intermediate_size=size.mlp(QWEN2_RATIO),
                                   num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                   num_key_value_heads=size.kv_heads, max_position_embeddings=512)


def _phi3(size: Size):
    from transformers import Phi3Config, Phi3Model
    return Phi3Model, Phi3Config(vocab_size=VOCAB, hidden_size=size.hidden, intermediate_size=size.mlp(),
                                 num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                 num_key_value_heads=size.heads, max_position_embeddings=512,
                                 original_max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)


def _gpt2(size: Size):
    from transformers import GPT2Config, GPT2Model
    return GPT2Model, GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=size.hidden, n_layer=size.layers,
                                 n_head=size.heads, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def _grouped(family: str, **extra) -> Callable[[Size], tuple[Any, Any]]:
    """transformers' `{family}Model` at the grouped size of `size`: its hidden, layers, heads, KV
    heads, head size and MLP (Llama's ratio), plus `extra` (a callable value is called with `size`)."""
    def make(size: Size):
        import transformers
        config = getattr(transformers, f"{family}Config")(
            vocab_size=VOCAB, hidden_size=size.hidden, intermediate_size=size.mlp(), num_hidden_layers=size.layers,
            num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, head_dim=size.head,
            max_position_embeddings=512, **{k: v(size) if callable(v) else v for k, v in extra.items()})
        return getattr(transformers, f"{family}Model"), config
    return make


def _whisper(size: Size):
    """WhisperModel (its decoder is exported; the one-layer encoder is built only because the model
    class holds it). Whisper's special token ids (50256, 50257) are moved inside the small vocabulary:
    the padding id must index the embedding, and transformers warns of the others; the
    begin-suppressed tokens, a generation setting, are dropped with them."""
    from transformers import WhisperConfig, WhisperModel
    return WhisperModel, WhisperConfig(vocab_size=VOCAB, d_model=size.hidden, decoder_layers=size.layers,
                                       decoder_attention_heads=size.heads, decoder_ffn_dim=size.mlp(),
                                       encoder_layers=1, encoder_attention_heads=size.heads,
                                       encoder_ffn_dim=size.mlp(), max_target_positions=448, pad_token_id=VOCAB - 1,
                                       bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                                       decoder_start_token_id=VOCAB - 2, begin_suppress_tokens=None)


# Notes are formatted with Size.fields() of the size exported.
MODELS = [
    Decoder("llama-gqa", _llama, "LlamaModel(hidden {hidden}, {layers} layers, {heads} heads, {kv_heads} KV heads, "
                                 "head {head}, MLP {mlp})"),
    Decoder("qwen2-gqa", _qwen2, "Qwen2Model(hidden {hidden}, {layers} layers, {heads} heads, {kv_heads} KV heads, "
                                 "head {head}, MLP {qwen2_mlp}; Q/K/V biases)"),
    Decoder("phi3", _phi3, "Phi3Model(hidden {hidden}, {layers} layers, {heads} heads = {heads} KV heads, "
                           "head {head}, packed QKV)"),
    Decoder("gpt2", _gpt2, "GPT2Model(hidden {hidden}, {layers} layers, {heads} heads, head {head})"),
    Decoder("qwen3-gqa", _grouped("Qwen3"), "Qwen3Model(grouped size; RMSNorm on each head's Q and K)"),
    Decoder("mistral-gqa", _grouped("Mistral", sliding_window=None), "MistralModel(grouped size)"),
    Decoder("gemma-gqa", _grouped("Gemma"),
            "GemmaModel(grouped size; RMSNorm by 1 + weight, tanh GELU, scaled embeddings)"),
    Decoder("gemma2-gqa", _grouped("Gemma2", query_pre_attn_scalar=lambda size: size.head, sliding_window=512),
            "Gemma2Model(grouped size; attention logits soft-capped by tanh, sliding window 512, pre/post norms; "
            "decode valid for past_sequence <= 511, see the module docstring)",
            dynamo_attention="eager"),
    EncoderDecoder("whisper", _whisper, "WhisperModel's decoder (d_model {hidden}, {layers} layers, {heads} heads, "
                                        "head {head}, MLP {mlp}; LayerNorm, exact GELU, learned positions, "
                                        "self- and cross-attention)"),
]


def export_torchscript(step, args: tuple, path: Path, graph: Graph, opset: int, _dim_max: dict) -> dict:
    torch = base._torch()
    torch.onnx.export(step, args, str(path), dynamo=False, opset_version=opset, do_constant_folding=False,
                      input_names=graph.inputs, output_names=graph.outputs,
                      dynamic_axes={k: v for k, v in graph.axes.items() if k in graph.inputs + graph.outputs})
    return {"exporter": "torch.onnx.export(dynamo=False)", "do_constant_folding": False}


def export_dynamo(step, args: tuple, path: Path, graph: Graph, opset: int, dim_max: dict) -> dict:
    """torch.export has no sum of two dims, so a TOTAL axis is its own dim (Dim.AUTO) and the names
    are set afterwards from the symbols torch chose (its own symbol, or `s1 + s2`, becomes TOTAL)."""
    torch = base._torch()
    import onnx
    from torch.export import Dim
    dims = {name: Dim(name, min=1, max=dim_max[name]) for name in graph.dims()}
    dims[TOTAL] = Dim.AUTO
    shapes = tuple({axis: dims[d] for axis, d in graph.axes[name].items()} for name in graph.inputs)
    program = torch.onnx.export(step, args, None, dynamo=True, opset_version=opset, input_names=graph.inputs,
                                output_names=graph.outputs, dynamic_shapes=shapes)
    program.save(str(path), external_data=False)
    model = onnx.load(str(path))
    rename_dims(model, graph.axes)
    onnx.save(model, str(path))
    return {"exporter": "torch.onnx.export(dynamo=True)", "optimize": True,
            "dim_max": {name: dim_max[name] for name in graph.dims()}}


def rename_dims(model, axes: dict[str, dict[int, str]]) -> None:
    """Graph inputs and outputs get the names of `axes`; a symbol torch chose is renamed everywhere
    (value_info too), so one dim has one name in the whole file."""
    renames: dict[str, str] = {}
    values = {v.name: v for v in (*model.graph.input, *model.graph.output)}
    for name, by_axis in axes.items():
        dims = values[name].type.tensor_type.shape.dim
        for axis, wanted in by_axis.items():
            if dims[axis].dim_param:
                renames.setdefault(dims[axis].dim_param, wanted)
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def pin_static_dims(path: Path, graph: Graph) -> None:
    """Dims that are not symbolic written as their sizes: the TorchScript exporter names a present
    K/V's head size `Concatpresent.0.key_dim_3` (it concatenates onto an empty cache), a name no
    shape analysis can equate with the 32 it is."""
    import onnx
    model = onnx.load(str(path))
    for value in model.graph.output:
        for axis, size in graph.static.get(value.name, {}).items():
            value.type.tensor_type.shape.dim[axis].dim_value = size
    onnx.save(model, str(path))


def check(path: Path, step, graph: Graph, args: tuple, dims: dict[str, int], tolerance: float) -> dict:
    """onnxruntime (optimizations off) against torch on `args` (at other sizes than the trace's),
    every output, within `tolerance` of each output's largest magnitude."""
    import numpy as np
    import onnxruntime as ort
    torch = base._torch()
    with torch.no_grad():
        ref = [t.double().numpy() for t in step(*args)]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    got = session.run(None, {n: a.numpy() for n, a in zip(graph.inputs, args) if n in wanted})
    worst, ok = 0.0, len(got) == len(ref)
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            return {"check_ok": False, "check_error": f"shape {g.shape} != torch {r.shape}"}
        diff = float(np.max(np.abs(g.astype(np.float64) - r)))
        worst = max(worst, diff)
        ok = ok and bool(np.isfinite(g).all()) and diff <= tolerance * max(float(np.max(np.abs(r))), 1e-6)
    return {"check_ok": ok, "check_max_abs_diff": worst, "check_rel_tol": tolerance,
            "check_dims": {d: dims[d] for d in graph.dims()}}


def in_dtype(args: tuple, dtype: str) -> tuple:
    """The float tensors of `args` (past K/V, encoder states) in `dtype`; ids, masks and positions as they are."""
    torch = base._torch()
    return tuple(a.to(getattr(torch, dtype)) if a.is_floating_point() else a for a in args)


def sized_name(entry: Decoder, size: str) -> str:
    """The model's name at `size`: tiny keeps the plain name (its files predate sizes)."""
    return entry.name if size == "tiny" else f"{entry.name}-{size}"


def export_one(entry: Decoder, size: str, form: str, kind: str, out: Path, force: bool,
               positions: bool = False, dtype: str = "float32") -> dict:
    torch = base._torch()
    name = sized_name(entry, size)
    file = out / f"{name}-{kind}{'-positions' if positions else ''}-{form}.onnx"
    dims = SIZES[size]
    record: dict[str, Any] = {"model": entry.name, "size": size, "size_config": dims.fields(), "form": form,
                              "kind": kind, "positions": positions, "dtype": dtype, "file": file.name,
                              "note": entry.note.format(**dims.fields())}
    given = {"positions": True} if positions else {}  # only Decoder's graph and inputs take it
    if file.exists() and not force:
        return {**record, "status": "kept"}
    exporter, opset = FORMS[form]
    decode = kind == "decode"
    seed = zlib.crc32(name.encode())
    start = time.perf_counter()
    tmp = file.with_name(file.name + ".partial")
    try:
        torch.manual_seed(seed)
        cls, config = entry.make(dims)
        attn = "eager" if exporter == "torchscript" else entry.dynamo_attention
        model = cls._from_config(config, attn_implementation=attn).eval()
        spec = base.Spec(name, "transformers", lambda _a: model, None, {}, "last_hidden_state")
        record.update(base.perturb(model, spec, torch.Generator().manual_seed(seed)))
        model.to(getattr(torch, dtype))  # float16: the perturbed float32 weights, rounded once
        graph = entry.graph(config, decode, **given)
        step = entry.step(model, graph, decode)
        args = in_dtype(entry.inputs(config, decode, TRACE, torch.Generator().manual_seed(1), **given), dtype)
        export = export_torchscript if exporter == "torchscript" else export_dynamo
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            record.update(export(step, args, tmp, graph, opset, entry.dim_max(config)))
        pin_static_dims(tmp, graph)
        at = {**CHECK, "sequence": CHECK["sequence"] if decode else CHECK_PREFILL_SEQUENCE}
        checked = in_dtype(entry.inputs(config, decode, at, torch.Generator().manual_seed(2), **given), dtype)
        tolerance = FP16_CHECK_REL_TOL if dtype == "float16" else base.CHECK_REL_TOL
        record.update(check(tmp, step, graph, checked, at, tolerance))
        os.replace(tmp, file)
        record.update(describe(file))
        record.update({"attn_implementation": attn, "exporter_kind": exporter, "seed": seed, "family": entry.family,
                       "status": "exported" if record["check_ok"] else "check-failed"})
    except Exception as error:  # noqa: BLE001 - recorded with the exact error, then the next file
        record.update(status="failed", error=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc(limit=-8))
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def describe(path: Path) -> dict:
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype
    model = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                              for n in model.graph.node)
    # position ids up to the configs' max_position_embeddings (512; GPT-2's n_positions)
    ranges = {"input_ids": [0, VOCAB], "attention_mask": [0, 2], "position_ids": [0, 512]}
    inputs = [{"name": v.name, "dtype": str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
               "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
               **({"range": ranges[v.name]} if v.name in ranges else {})} for v in model.graph.input]
    return {"nodes": len(model.graph.node),
            "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "op_types": dict(sorted(ops.items())), "inputs": inputs, "bytes": path.stat().st_size,
            "outputs": [o.name for o in model.graph.output]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default {DEFAULT_OUT}; float16: {DEFAULT_OUT_FP16})")
    parser.add_argument("--only", default="", help="comma-separated: " + ", ".join(m.name for m in MODELS))
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help="comma-separated sizes to export: " + ", ".join(SIZES) + " (default: all)")
    parser.add_argument("--positions", default=",".join(POSITIONS),
                        help="comma-separated: graphs without and/or with a position_ids input (default: both)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="float16: the model.half() copies, to their own folder (default float32)")
    parser.add_argument("--force", action="store_true", help="re-export files that exist")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := sorted(set(names) - {m.name for m in MODELS}):
        parser.error(f"unknown model: {unknown}")
    sizes = [s for s in args.sizes.split(",") if s]
    if unknown := sorted(set(sizes) - set(SIZES)) or (not sizes and ["(none)"]):
        parser.error(f"unknown size: {unknown}")
    positions = [p for p in args.positions.split(",") if p]
    if unknown := sorted(set(positions) - set(POSITIONS)) or (not positions and ["(none)"]):
        parser.error(f"unknown --positions: {unknown}")
    out: Path = args.out or (DEFAULT_OUT_FP16 if args.dtype == "float16" else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)

    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import transformers
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__}
    print("decoders:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    manifest["ranges"] = "half-open [low, high)"
    failed, started = 0, time.perf_counter()
    for size, entry in ((size, entry) for size in SIZES if size in sizes for entry in MODELS):
        if names and entry.name not in names:
            continue
        for form in FORMS:
            for kind, given in ((k, POSITIONS[p]) for p in positions for k in KINDS):
                if given and entry.family != "decoder-only":
                    continue
                record = export_one(entry, size, form, kind, out, args.force, given, args.dtype)
                if record["status"] == "kept":
                    print(f"  {record['file']}: exists, kept (--force re-exports)", flush=True)
                    continue
                manifest["files"][record["file"]] = {**record, "versions": versions}
                failed += record["status"] != "exported"
                if record["status"] == "failed":
                    print(f"  {record['file']}: FAILED: {record['error'][:1500]}", flush=True)
                else:
                    print(f"  {record['file']}: {record['nodes']} nodes, {record['seconds']} s, "
                          f"max |ort - torch| {record['check_max_abs_diff']:.1e}"
                          + ("" if record["check_ok"] else " CHECK FAILED"), flush=True)
                manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"done in {time.perf_counter() - started:.0f} s; {failed} failed; manifest {manifest_path}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
