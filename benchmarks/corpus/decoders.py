"""Export the decoder corpus: tiny random-init decoder LLMs with a KV cache, as onnxruntime serves them.

Each model in two graphs per exporter:

  prefill  input_ids, attention_mask [batch, sequence] -> last_hidden_state, present.N.key/value
           [batch, kv_heads, sequence, head_size] (the prompt's K/V, no past)
  decode   input_ids [batch, sequence], attention_mask [batch, past_sequence + sequence],
           past_key_values.N.key/value [batch, kv_heads, past_sequence, head_size]
           -> last_hidden_state, present.N.key/value [batch, kv_heads, past_sequence + sequence, head_size]
           (a decode step has sequence 1; the graph takes any)

and two exporters: `opset17` (TorchScript, eager attention: MatMul/Softmax/MatMul) and `dynamo18`
(torch.export, opset 18, the library's default sdpa attention). Models (2 layers, hidden 128, head
size 32 so GroupQueryAttention's CPU kernel applies, vocab 1000): Llama, Qwen2, Qwen3, Mistral,
Gemma and Gemma2 with grouped K/V heads, Phi-3 (packed QKV) and GPT-2 (one K/V head per head), see
MODELS.

    .venv-corpus/bin/python benchmarks/corpus/decoders.py [--out DIR] [--only NAME,...] [--force]

DIR defaults to $FUSE_DECODER_MODELS or benchmarks/corpus/decoder-models. Every export is traced at
batch 2, sequence 7, past 5 and checked in onnxruntime (optimizations off) against torch at batch 3,
sequence 2 (decode) or 11 (prefill), past 13, with padding in the first row's mask; the
manifest records the check, node and op counts, inputs with symbolic dims and their ranges.
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
VOCAB = 1000
FORMS = {"opset17": ("torchscript", 17), "dynamo18": ("dynamo", 18)}
KINDS = ("prefill", "decode")
TRACE = {"batch": 2, "sequence": 7, "past_sequence": 5}
CHECK = {"batch": 3, "sequence": 2, "past_sequence": 13}
CHECK_PREFILL_SEQUENCE = 11
# The mask's and the present K/V's length, written as the arithmetic it is (as dynamo's `s0 + s1`):
# fuse's input domain then evaluates it instead of giving it a size of its own that no run accepts.
TOTAL = "past_sequence + sequence"


@dataclass
class Decoder:
    name: str
    make: Callable[[], tuple[Any, Any]]  # -> (model class, config)
    note: str
    dynamo_attention: str = "sdpa"  # the library's attention for the dynamo export (Gemma2 has no sdpa)


def _llama():
    from transformers import LlamaConfig, LlamaModel
    return LlamaModel, LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _qwen2():
    from transformers import Qwen2Config, Qwen2Model
    return Qwen2Model, Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _phi3():
    from transformers import Phi3Config, Phi3Model
    return Phi3Model, Phi3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                                 original_max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)


def _gpt2():
    from transformers import GPT2Config, GPT2Model
    return GPT2Model, GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=128, n_layer=2, n_head=4,
                                 bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def _grouped(family: str, **extra) -> Callable[[], tuple[Any, Any]]:
    """transformers' `{family}Model` at the corpus's grouped size: hidden 128, 2 layers, 4 heads,
    2 KV heads, head 32, MLP 344 (plus `extra`)."""
    def make():
        import transformers
        config = getattr(transformers, f"{family}Config")(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=512, **extra)
        return getattr(transformers, f"{family}Model"), config
    return make


MODELS = [
    Decoder("llama-gqa", _llama, "LlamaModel(hidden 128, 2 layers, 4 heads, 2 KV heads, head 32, MLP 344)"),
    Decoder("qwen2-gqa", _qwen2, "Qwen2Model(hidden 128, 2 layers, 4 heads, 2 KV heads, head 32, MLP 352; "
                                 "Q/K/V biases)"),
    Decoder("phi3", _phi3, "Phi3Model(hidden 128, 2 layers, 4 heads = 4 KV heads, head 32, packed QKV)"),
    Decoder("gpt2", _gpt2, "GPT2Model(hidden 128, 2 layers, 4 heads, head 32)"),
    Decoder("qwen3-gqa", _grouped("Qwen3"), "Qwen3Model(grouped size; RMSNorm on each head's Q and K)"),
    Decoder("mistral-gqa", _grouped("Mistral", sliding_window=None), "MistralModel(grouped size)"),
    Decoder("gemma-gqa", _grouped("Gemma"),
            "GemmaModel(grouped size; RMSNorm by 1 + weight, tanh GELU, scaled embeddings)"),
    Decoder("gemma2-gqa", _grouped("Gemma2", query_pre_attn_scalar=32, sliding_window=512),
            "Gemma2Model(grouped size; attention logits soft-capped by tanh, sliding window 512, pre/post norms)",
            dynamo_attention="eager"),
]


def wrapper(model, layers: int, decode: bool):
    """forward(input_ids, attention_mask[, past K, past V per layer]) -> (last_hidden_state,
    present K, present V per layer): plain tensors in and out, the cache built inside."""
    torch = base._torch()
    from transformers import DynamicCache

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)] if past else None
            cache = DynamicCache(pairs, config=self.model.config)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True,
                             return_dict=True)
            present = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)

    # torch.export binds dynamic_shapes to the signature's names: one per past tensor.
    p = inspect.Parameter
    names = io_names(layers, decode)[0]
    Step.forward.__signature__ = inspect.Signature(
        [p("self", p.POSITIONAL_OR_KEYWORD)] + [p(n.replace(".", "_"), p.POSITIONAL_OR_KEYWORD) for n in names])
    return Step().eval()


def io_names(layers: int, decode: bool) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask"]
    if decode:
        inputs += [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    outputs = ["last_hidden_state"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return inputs, outputs


def make_inputs(config, decode: bool, batch: int, sequence: int, past: int, gen) -> tuple:
    """Ids over the vocabulary; a 0/1 mask padding the first row by 2: at the end for a prefill
    (left padding there makes fully masked query rows, whose outputs torch's sdpa and eager
    attention define differently), at the start for a decode step (the padded prompt of a batch
    being generated); random past K/V."""
    torch = base._torch()
    total = past + sequence if decode else sequence
    ids = torch.randint(0, VOCAB, (batch, sequence), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, total, dtype=torch.int64)
    if not decode:
        mask[0, -2:] = 0
        return ids, mask
    mask[0, :2] = 0
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    size = config.hidden_size // heads
    past_kv = [torch.randn(batch, kv, past, size, generator=gen) for _ in range(2 * config.num_hidden_layers)]
    return (ids, mask, *past_kv)


def dims_of(layers: int, decode: bool) -> dict[str, dict[int, str]]:
    inputs, outputs = io_names(layers, decode)
    total = TOTAL if decode else "sequence"
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: total},
            "last_hidden_state": {0: "batch", 1: "sequence"}}
    for name in inputs[2:]:
        axes[name] = {0: "batch", 2: "past_sequence"}
    for name in outputs[1:]:
        axes[name] = {0: "batch", 2: total}
    return axes


def export_torchscript(step, args: tuple, path: Path, layers: int, decode: bool, opset: int) -> dict:
    torch = base._torch()
    inputs, outputs = io_names(layers, decode)
    torch.onnx.export(step, args, str(path), dynamo=False, opset_version=opset, do_constant_folding=False,
                      input_names=inputs, output_names=outputs, dynamic_axes=dims_of(layers, decode))
    return {"exporter": "torch.onnx.export(dynamo=False)", "do_constant_folding": False}


def export_dynamo(step, args: tuple, path: Path, layers: int, decode: bool, opset: int) -> dict:
    """torch.export has no sum of two dims, so the mask's total length is its own dim and the
    names are set afterwards from the symbols torch chose (its own symbol, or `s1 + s2`, becomes TOTAL)."""
    torch = base._torch()
    import onnx
    from torch.export import Dim
    inputs, outputs = io_names(layers, decode)
    batch, seq = Dim("batch", min=1, max=64), Dim("sequence", min=1, max=512)
    past = Dim("past_sequence", min=1, max=512)
    shapes = [{0: batch, 1: seq}, {0: batch, 1: Dim.AUTO if decode else seq}]
    shapes += [{0: batch, 2: past}] * (len(inputs) - 2)
    program = torch.onnx.export(step, args, None, dynamo=True, opset_version=opset, input_names=inputs,
                                output_names=outputs, dynamic_shapes=tuple(shapes))
    program.save(str(path), external_data=False)
    model = onnx.load(str(path))
    rename_dims(model, dims_of(layers, decode))
    onnx.save(model, str(path))
    return {"exporter": "torch.onnx.export(dynamo=True)", "optimize": True}


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


def pin_static_dims(path: Path, config, decode: bool) -> None:
    """Dims that are not symbolic written as their sizes: the TorchScript exporter names a present
    K/V's head size `Concatpresent.0.key_dim_3` (it concatenates onto an empty cache), a name no
    shape analysis can equate with the 32 it is."""
    import onnx
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    static = {"last_hidden_state": {2: config.hidden_size}}
    model = onnx.load(str(path))
    for value in model.graph.output:
        sizes = static.get(value.name, {1: kv, 3: config.hidden_size // heads})
        for axis, size in sizes.items():
            value.type.tensor_type.shape.dim[axis].dim_value = size
    onnx.save(model, str(path))


def check(path: Path, step, config, decode: bool, gen) -> dict:
    """onnxruntime (optimizations off) against torch at other sizes than the trace's, every output."""
    import numpy as np
    import onnxruntime as ort
    torch = base._torch()
    sequence = CHECK["sequence"] if decode else CHECK_PREFILL_SEQUENCE
    args = make_inputs(config, decode, CHECK["batch"], sequence, CHECK["past_sequence"], gen)
    with torch.no_grad():
        ref = [t.numpy() for t in step(*args)]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, {n: a.numpy() for n, a in zip(names, args)})
    worst, ok = 0.0, len(got) == len(ref)
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            return {"check_ok": False, "check_error": f"shape {g.shape} != torch {r.shape}"}
        diff = float(np.max(np.abs(g.astype(np.float64) - r)))
        worst = max(worst, diff)
        ok = ok and bool(np.isfinite(g).all()) and diff <= base.CHECK_REL_TOL * max(float(np.max(np.abs(r))), 1e-6)
    return {"check_ok": ok, "check_max_abs_diff": worst,
            "check_dims": {"batch": CHECK["batch"], "sequence": sequence,
                           **({"past_sequence": CHECK["past_sequence"]} if decode else {})}}


def export_one(entry: Decoder, form: str, kind: str, out: Path, force: bool) -> dict:
    torch = base._torch()
    file = out / f"{entry.name}-{kind}-{form}.onnx"
    record: dict[str, Any] = {"model": entry.name, "form": form, "kind": kind, "file": file.name, "note": entry.note}
    if file.exists() and not force:
        return {**record, "status": "kept"}
    exporter, opset = FORMS[form]
    decode = kind == "decode"
    seed = zlib.crc32(entry.name.encode())
    start = time.perf_counter()
    tmp = file.with_name(file.name + ".partial")
    try:
        torch.manual_seed(seed)
        cls, config = entry.make()
        attn = "eager" if exporter == "torchscript" else entry.dynamo_attention
        model = cls._from_config(config, attn_implementation=attn).eval()
        spec = base.Spec(entry.name, "transformers", lambda _a: model, None, {}, "last_hidden_state")
        record.update(base.perturb(model, spec, torch.Generator().manual_seed(seed)))
        step = wrapper(model, config.num_hidden_layers, decode)
        args = make_inputs(config, decode, TRACE["batch"], TRACE["sequence"], TRACE["past_sequence"],
                           torch.Generator().manual_seed(1))
        export = export_torchscript if exporter == "torchscript" else export_dynamo
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            record.update(export(step, args, tmp, config.num_hidden_layers, decode, opset))
        pin_static_dims(tmp, config, decode)
        record.update(check(tmp, step, config, decode, torch.Generator().manual_seed(2)))
        os.replace(tmp, file)
        record.update(describe(file, decode))
        record.update({"attn_implementation": attn, "exporter_kind": exporter, "seed": seed,
                       "status": "exported" if record["check_ok"] else "check-failed"})
    except Exception as error:  # noqa: BLE001 - recorded with the exact error, then the next file
        record.update(status="failed", error=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc(limit=-8))
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def describe(path: Path, decode: bool) -> dict:
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype
    model = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                              for n in model.graph.node)
    ranges = {"input_ids": [0, VOCAB], "attention_mask": [0, 2]}
    inputs = [{"name": v.name, "dtype": str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
               "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
               **({"range": ranges[v.name]} if v.name in ranges else {})} for v in model.graph.input]
    return {"nodes": len(model.graph.node), "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "op_types": dict(sorted(ops.items())), "inputs": inputs, "bytes": path.stat().st_size,
            "outputs": [o.name for o in model.graph.output]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--only", default="", help="comma-separated: " + ", ".join(m.name for m in MODELS))
    parser.add_argument("--force", action="store_true", help="re-export files that exist")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := sorted(set(names) - {m.name for m in MODELS}):
        parser.error(f"unknown model: {unknown}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import transformers
    versions = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                "onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__}
    print("decoders:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    manifest["ranges"] = "half-open [low, high)"
    failed, started = 0, time.perf_counter()
    for entry in MODELS:
        if names and entry.name not in names:
            continue
        for form in FORMS:
            for kind in KINDS:
                record = export_one(entry, form, kind, out, args.force)
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
