"""Export the benchmark corpus: public model architectures with random weights, three ONNX forms each.

Runs inside the corpus virtualenv (`make bench-corpus` creates .venv-corpus with torch, torchvision,
transformers, onnx, onnxscript and onnxruntime); fuse itself and `make test` never need it.
No weights are downloaded: every model is built from its constructor or its config
(torchvision `weights=None`, transformers `*Config()`), then made non-trivial (see `perturb`).

    .venv-corpus/bin/python benchmarks/corpus/export.py [--out DIR] [--only resnet50,bert-base]
                                                        [--forms opset17,opset14,dynamo] [--force]
    .venv-corpus/bin/python benchmarks/corpus/export.py --summary [--out DIR]   # table of what is there

Forms (file names NAME-FORM.onnx):
  opset17  legacy TorchScript exporter (dynamo=False), training=TrainingMode.PRESERVE on a model in
           eval mode, do_constant_folding=False, opset 17: BatchNormalization stays a node (the
           EVAL-mode peephole that folds it into Conv does not run), LayerNorm is one
           LayerNormalization node, GELU is decomposed (Erf or Tanh: Gelu needs opset 20).
  opset14  the same settings at opset 14: LayerNorm decomposed too (ReduceMean, Sub, Pow, Sqrt, Div).
  dynamo   the exporter's default: torch.onnx.export(..., dynamo=True) with its default opset and
           its default onnxscript optimization, the attention implementation the library picks by
           default (sdpa), weights inside the file (external_data=False).

Symbolic dims are named `batch` and `sequence` (what benchmarks/run.py binds by default). Every
export is traced at batch 2 (sequence 7) and checked in onnxruntime against PyTorch at batch 3
(sequence 13), so a dim baked in by the trace fails the check. Integer inputs (input_ids,
attention_mask) are valid for any value in [0, 10), the range fuse's random inputs use.

Each file is written to a temporary name and renamed when complete; existing files are skipped
unless --force. Results (node counts, op types, check errors, failures with the exact error) go to
DIR/manifest.json. Exit status 1 when any export or check failed; the others are kept.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models"
FORMS = ("opset17", "opset14", "dynamo")
TRACE_BATCH, TRACE_SEQ = 2, 7
CHECK_BATCH, CHECK_SEQ = 3, 13
IMAGE = 224
# A conversion is wrong, not merely reordered float math, when it is off by more than this
# fraction of the output's largest magnitude.
CHECK_REL_TOL = 1e-3


@dataclass
class Spec:
    name: str
    library: str
    # attention implementation -> nn.Module in eval mode: "eager" for the TorchScript exporter's
    # forms (explicit MatMul/Softmax attention), "sdpa" (the library's default) for dynamo
    build: Callable[[str], Any]
    inputs: Callable[[int, int, Any], dict]  # (batch, sequence, generator) -> {name: tensor}
    dynamic_axes: dict[str, dict[int, str]]
    output: str
    note: str = ""


# ----------------------------------------------------------------------------- model definitions

def _torch():
    import torch
    return torch


def image_inputs(batch: int, _seq: int, gen) -> dict:
    torch = _torch()
    return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)}


def ids_inputs(batch: int, seq: int, gen) -> dict:
    torch = _torch()
    return {"input_ids": torch.randint(0, 10, (batch, seq), generator=gen, dtype=torch.int64)}


def ids_mask_inputs(batch: int, seq: int, gen) -> dict:
    torch = _torch()
    ids = ids_inputs(batch, seq, gen)["input_ids"]
    # Padding at the end of the first row, as a tokenizer writes it; values stay in {0, 1}.
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq - 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def torchvision_spec(name: str) -> Spec:
    def build(_attn: str):
        import torchvision
        return getattr(torchvision.models, name)(weights=None)
    return Spec(name=name.replace("_", "-"), library="torchvision", build=build, inputs=image_inputs,
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}}, output="logits",
                note=f"torchvision.models.{name}(weights=None), 1000 classes, 3x{IMAGE}x{IMAGE}")


class LastHidden:
    """Wraps a transformers base model so the export has plain tensor inputs and one output."""

    @staticmethod
    def make(model, input_names: tuple[str, ...], legacy: bool, **fixed):
        torch = _torch()

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

        # Named arguments (torch.export matches dynamic_shapes against the signature).
        if input_names == ("input_ids", "attention_mask"):
            def forward(self, input_ids, attention_mask):
                return self.model(input_ids=input_ids, attention_mask=attention_mask, **fixed,
                                  return_dict=True).last_hidden_state
        elif input_names == ("input_ids",) and legacy:
            # Without a mask transformers 5 looks for packed sequences in the position ids with
            # torch.diff, which the TorchScript exporter has no symbolic for ("Exporting the operator
            # 'aten::diff' to ONNX opset version 17 is not supported"): pass an all-ones mask.
            def forward(self, input_ids):
                return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **fixed,
                                  return_dict=True).last_hidden_state
        elif input_names == ("input_ids",):
            def forward(self, input_ids):
                return self.model(input_ids=input_ids, **fixed, return_dict=True).last_hidden_state
        else:
            def forward(self, pixel_values):
                return self.model(pixel_values=pixel_values, **fixed, return_dict=True).last_hidden_state
        Wrapper.forward = forward
        return Wrapper().eval()


def bert_build(attn: str):
    from transformers import BertConfig, BertModel
    config = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, vocab 30522
    model = BertModel._from_config(config, attn_implementation=attn, add_pooling_layer=False)
    return LastHidden.make(model, ("input_ids", "attention_mask"), attn == "eager")


def gpt2_build(attn: str):
    from transformers import GPT2Config, GPT2Model
    config = GPT2Config()  # gpt2 (124M): 12 layers, hidden 768, 12 heads, gelu_new (tanh)
    model = GPT2Model._from_config(config, attn_implementation=attn)
    return LastHidden.make(model, ("input_ids",), attn == "eager", use_cache=False)


def vit_build(attn: str):
    from transformers import ViTConfig, ViTModel
    config = ViTConfig()  # vit-base-patch16-224: 12 layers, hidden 768, 12 heads, exact GELU
    model = ViTModel._from_config(config, attn_implementation=attn, add_pooling_layer=False)
    return LastHidden.make(model, ("pixel_values",), attn == "eager")


def llama_build(attn: str):
    from transformers import LlamaConfig, LlamaModel
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         rms_norm_eps=1e-6)
    model = LlamaModel._from_config(config, attn_implementation=attn)
    return LastHidden.make(model, ("input_ids",), attn == "eager", use_cache=False)


SEQ_AXES = {"input_ids": {0: "batch", 1: "sequence"}, "last_hidden_state": {0: "batch", 1: "sequence"}}

SPECS: list[Spec] = [
    torchvision_spec("resnet50"),
    torchvision_spec("mobilenet_v2"),
    torchvision_spec("mobilenet_v3_small"),
    torchvision_spec("efficientnet_b0"),
    torchvision_spec("convnext_tiny"),
    Spec("bert-base", "transformers", bert_build, ids_mask_inputs,
         {**SEQ_AXES, "attention_mask": {0: "batch", 1: "sequence"}}, "last_hidden_state",
         note="BertModel(BertConfig()), no pooler; inputs input_ids, attention_mask"),
    Spec("gpt2", "transformers", gpt2_build, ids_inputs, SEQ_AXES, "last_hidden_state",
         note="GPT2Model(GPT2Config()), use_cache=False; input input_ids"),
    Spec("vit-base", "transformers", vit_build, image_inputs,
         {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}, "last_hidden_state",
         note="ViTModel(ViTConfig()), no pooler; input pixel_values 3x224x224"),
    Spec("llama-small", "transformers", llama_build, ids_inputs, SEQ_AXES, "last_hidden_state",
         note="LlamaModel(LlamaConfig(hidden 512, 4 layers, 8 heads, 4 KV heads, MLP 1408, vocab 32000)), "
              "use_cache=False; input input_ids"),
]


# ----------------------------------------------------------------------------- making weights non-trivial

def perturb(model, spec: Spec, gen, image: int = IMAGE) -> dict:
    """Random init leaves LayerNorm/BatchNorm/RMSNorm weights at exactly 1, biases at 0 and BN
    running statistics at 0/1, so folding them wrongly would not change a single output. Scale
    every constant parameter by 1 + 0.1*noise (or add 0.02*noise to zeros), then run training-mode
    forward passes so each BatchNormalization's running mean and variance are real statistics."""
    torch = _torch()
    changed = 0
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if not p.is_floating_point() or p.numel() == 0:
                continue
            flat = p.reshape(-1)
            if not bool(torch.all(flat == flat[0])):
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if float(flat[0]) == 0.0:
                p.add_(0.02 * noise)
            else:
                p.mul_(1 + 0.1 * noise)
            changed += 1
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        momenta = [m.momentum for m in bns]
        for m in bns:
            m.momentum = None  # cumulative average over the warm-up passes
        model.train()
        with torch.no_grad():
            for _ in range(4):
                x = 0.5 + torch.randn(8, 3, image, image, generator=gen)
                model(x)
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
    model.eval()
    return {"constant_parameters_perturbed": changed, "batchnorm_layers_warmed": len(bns)}


# ----------------------------------------------------------------------------- export and check

def export_torchscript(model, spec: Spec, args: tuple, path: Path, opset: int, dynamic: bool = True) -> dict:
    """The legacy TorchScript exporter, keeping BatchNormalization nodes (see the module docstring)."""
    torch = _torch()
    names = list(spec.inputs(1, 1, torch.Generator()).keys())
    axes = {k: v for k, v in spec.dynamic_axes.items() if k in names or k == spec.output} if dynamic else None
    torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                      input_names=names, output_names=[spec.output], dynamic_axes=axes)
    return {"exporter": "torch.onnx.export(dynamo=False)", "training": "PRESERVE", "do_constant_folding": False}


def export_dynamo(model, spec: Spec, args: tuple, path: Path, opset: int | None = None) -> dict:
    """The dynamo exporter with its default optimization; `opset` None takes the exporter's default."""
    torch = _torch()
    from torch.export import Dim
    names = list(spec.inputs(1, 1, torch.Generator()).keys())
    dims = {"batch": Dim("batch", min=1, max=4096), "sequence": Dim("sequence", min=2, max=512)}
    # Positional, in the order of `args` (torchvision's forward names its input x).
    shapes = tuple({axis: dims[d] for axis, d in spec.dynamic_axes.get(n, {}).items()} for n in names)
    extra = {} if opset is None else {"opset_version": opset}
    program = torch.onnx.export(model, args, None, dynamo=True, input_names=names, output_names=[spec.output],
                                dynamic_shapes=shapes, **extra)
    program.save(str(path), external_data=False)
    return {"exporter": "torch.onnx.export(dynamo=True)", "optimize": True}


def export_form(model, spec: Spec, form: str, args: tuple, path: Path) -> dict:
    if form in ("opset17", "opset14"):
        return export_torchscript(model, spec, args, path, 17 if form == "opset17" else 14)
    return export_dynamo(model, spec, args, path)


def check(path: Path, model, spec: Spec, gen, batch: int = CHECK_BATCH, seq: int = CHECK_SEQ) -> dict:
    """Run the export in onnxruntime at other dims than the trace's and compare with PyTorch."""
    import numpy as np
    import onnxruntime as ort
    torch = _torch()
    feeds = spec.inputs(batch, seq, gen)
    with torch.no_grad():
        ref = model(*feeds.values()).numpy()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
    if got.shape != ref.shape:
        return {"check_ok": False, "check_error": f"shape {got.shape} != PyTorch {ref.shape}"}
    diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    ok = bool(np.isfinite(got).all()) and diff <= CHECK_REL_TOL * max(scale, 1e-6)
    return {"check_ok": ok, "check_max_abs_diff": diff, "check_output_max_abs": scale,
            "check_shape": list(got.shape)}


def describe(path: Path) -> dict:
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                              for n in model.graph.node)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    inputs = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        inputs[value.name] = [d.dim_param or d.dim_value for d in t.shape.dim]
    return {"bytes": path.stat().st_size, "nodes": len(model.graph.node), "initializers": len(model.graph.initializer),
            "opset": opsets.get("ai.onnx"), "ir_version": model.ir_version, "inputs": inputs, "op_types": dict(ops)}


def export_model(spec: Spec, forms: list[str], out: Path, force: bool, log,
                 export: Callable[..., dict] = export_form, image: int = IMAGE) -> list[dict]:
    """Export `spec` in each form with `export(model, spec, form, args, path)`: the "dynamo*" forms get
    the library's default attention, the others eager; a "*-static" form is traced and checked at
    batch 1 (its batch is not symbolic). `image` is the side of perturb's BatchNorm warm-up images."""
    torch = _torch()
    results = []
    todo = [f for f in forms if force or not (out / f"{spec.name}-{f}.onnx").exists()]
    for form in forms:
        if form not in todo:
            results.append({"model": spec.name, "form": form, "file": f"{spec.name}-{form}.onnx", "status": "kept"})
    if not todo:
        return results
    built: dict[str, Any] = {}
    for form in todo:
        file = out / f"{spec.name}-{form}.onnx"
        attn = "sdpa" if form.startswith("dynamo") else "eager"
        seed = zlib.crc32(spec.name.encode())
        entry: dict[str, Any] = {"model": spec.name, "form": form, "file": file.name, "library": spec.library,
                                 "note": spec.note, "seed": seed}
        if spec.library == "transformers":
            entry["attn_implementation"] = attn
        start = time.perf_counter()
        tmp = file.with_name(file.name + ".partial")
        try:
            key = attn if spec.library == "transformers" else "-"
            if key not in built:
                torch.manual_seed(seed)
                gen = torch.Generator().manual_seed(seed)
                model = spec.build(attn).eval()
                built[key] = (model, perturb(model, spec, gen, image))
            model, perturbed = built[key]
            entry.update(perturbed)
            trace_batch, check_batch = (1, 1) if form.endswith("-static") else (TRACE_BATCH, CHECK_BATCH)
            args = tuple(spec.inputs(trace_batch, TRACE_SEQ, torch.Generator().manual_seed(1)).values())
            captured = io.StringIO()
            with warnings.catch_warnings(), contextlib.redirect_stdout(captured):
                warnings.simplefilter("ignore")
                entry.update(export(model, spec, form, args, tmp))
            entry["export_seconds"] = round(time.perf_counter() - start, 1)
            entry.update(check(tmp, model, spec, torch.Generator().manual_seed(2), check_batch))
            os.replace(tmp, file)
            entry.update(describe(file))
            entry["status"] = "exported" if entry["check_ok"] else "check-failed"
        except Exception as error:  # noqa: BLE001 - recorded with the exact error, then the next form
            entry["status"] = "failed"
            entry["error"] = f"{type(error).__name__}: {error}"
            entry["traceback"] = traceback.format_exc(limit=-8)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        entry["seconds"] = round(time.perf_counter() - start, 1)
        log(entry)
        results.append(entry)
    return results


# ----------------------------------------------------------------------------- summary

KEY_OPS = ("BatchNormalization", "Conv", "LayerNormalization", "ReduceMean", "Erf", "Tanh", "Gelu",
           "MatMul", "Gemm", "Softmax", "Pow", "Sqrt", "HardSigmoid", "HardSwish", "Sigmoid",
           "Shape", "Gather", "Constant")


def summary_table(out: Path) -> str:
    rows = []
    for path in sorted(out.glob("*.onnx")):
        d = describe(path)
        ops = d["op_types"]
        key = ", ".join(f"{op} {ops[op]}" for op in KEY_OPS if op in ops)
        rows.append((path.name, f"{d['bytes'] / 2**20:.1f} MiB", str(d["opset"]), str(d["nodes"]),
                     str(len(ops)), " ".join(f"{k}={v}" for k, v in d["inputs"].items()), key))
    head = ("file", "size", "opset", "nodes", "op types", "inputs", "selected op counts")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--only", default="", help="comma-separated model names: " + ", ".join(s.name for s in SPECS))
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated, from " + ", ".join(FORMS))
    parser.add_argument("--force", action="store_true", help="re-export files that exist")
    parser.add_argument("--summary", action="store_true", help="print the table of the folder's models and exit")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.summary:
        print(summary_table(out))
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {s.name for s in SPECS})
    forms = [f for f in args.forms.split(",") if f]
    if unknown or set(forms) - set(FORMS):
        parser.error(f"unknown model or form: {unknown or sorted(set(forms) - set(FORMS))}")
    specs = [s for s in SPECS if not names or s.name in names]
    out.mkdir(parents=True, exist_ok=True)

    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import torchvision
    import transformers
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    versions = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
                "transformers": transformers.__version__, "onnx": onnx.__version__,
                "onnxscript": onnxscript.__version__,
                "onnxruntime": onnxruntime.__version__}
    print("corpus:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    def log(entry):
        if entry["status"] == "failed":
            print(f"  {entry['file']}: FAILED after {entry['seconds']} s: {entry['error'][:2000]}", flush=True)
        else:
            extra = "" if entry["check_ok"] else f" CHECK FAILED: {entry.get('check_error') or entry}"
            print(f"  {entry['file']}: {entry['bytes'] / 2**20:.1f} MiB, {entry['nodes']} nodes, "
                  f"opset {entry['opset']}, {entry['seconds']} s, "
                  f"max |ort - torch| {entry.get('check_max_abs_diff', float('nan')):.2e}"
                  f" (output max {entry.get('check_output_max_abs', float('nan')):.2e}){extra}", flush=True)

    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    failed = 0
    started = time.perf_counter()
    for spec in specs:
        print(f"{spec.name}:", flush=True)
        for entry in export_model(spec, forms, out, args.force, log):
            if entry["status"] == "kept":
                print(f"  {entry['file']}: exists, kept (--force re-exports)", flush=True)
                continue
            manifest["files"][entry["file"]] = {**entry, "versions": versions}
            failed += entry["status"] != "exported"
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"done in {time.perf_counter() - started:.0f} s; {failed} failed; manifest {manifest_path}", flush=True)
    print(summary_table(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
