"""Export the held-out corpus: model families fuse is not tuned on, for calibrating and testing on breadth.

Same machinery as export.py (random weights made non-trivial by `perturb`, a check in onnxruntime
against PyTorch at another batch/sequence than the trace, atomic writes, a manifest), other models:

  timm          deit_tiny, vit_tiny, swin_tiny, convnext_atto, efficientvit_m0, levit_128s, mobilevit_xxs:
                TorchScript exporter at opset 13 (levit_128s also at opset 17)
  torchvision   shufflenet_v2_x1_0, squeezenet1_1, googlenet, inception_v3 (299x299), densenet121,
                regnet_y_400mf, mnasnet0_5: TorchScript opset 17 (BatchNormalization kept) and dynamo
                (its default opset); three of them also with a static batch of 1
  a small U-Net written here (skip concatenations, BN + ReLU, bilinear upsampling), same three forms
  ultralytics   YOLOv8n from its yaml (random init): TorchScript opset 17, batch, height and width symbolic
  transformers  small random configs of ViT, BERT, GPT-2, Llama (GQA), Qwen2, the T5 encoder and the
                Whisper encoder: TorchScript opset 14 and dynamo opset 18

    .venv-corpus/bin/python benchmarks/corpus/heldout.py [--out DIR] [--only NAME,...] [--force]

Integer inputs take realistic values (ids over the whole vocabulary, 0/1 masks with padding,
segment ids, positions); each input's valid range is in the manifest as a half-open [low, high),
where high may be a symbolic dim's name ("sequence"). The manifest also gives two shape settings
per file, `small` and `large` (an activation peak of about 32 MiB), with their estimated peaks.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as base  # noqa: E402 - the sibling script, not an installed package

DEFAULT_OUT = base.HERE / "heldout-models"
# form -> (exporter, opset; None is the dynamo exporter's default, batch symbolic)
FORMS: dict[str, tuple[str, int | None, bool]] = {
    "opset13": ("torchscript", 13, True),
    "opset14": ("torchscript", 14, True),
    "opset17": ("torchscript", 17, True),
    "opset17-static": ("torchscript", 17, False),
    "dynamo": ("dynamo", None, True),
    "dynamo18": ("dynamo", 18, True),
}
TIMM_FORMS = ("opset13",)
CNN_FORMS = ("opset17", "dynamo")
CNN_STATIC_FORMS = ("opset17", "dynamo", "opset17-static")
TEXT_FORMS = ("opset14", "dynamo18")
SMALL_SEQ, LARGE_SEQ = 128, 256
TARGET_PEAK = 32 * 2**20  # the `large` setting aims here, inside 16-64 MiB
VOCAB = 1000
YOLO_IMAGE = 320


@dataclass
class Heldout:
    spec: base.Spec
    family: str
    forms: tuple[str, ...]
    # input name -> half-open valid range [low, high); high may name a symbolic dim
    ranges: dict[str, tuple[int, int | str]] = field(default_factory=dict)
    image: int = base.IMAGE  # perturb's BatchNorm warm-up images, and the model's input side
    attn: str | None = None  # transformers: attention for every form, instead of eager / the default


# ----------------------------------------------------------------------------- inputs

def image_inputs(side: int) -> Callable[[int, int, Any], dict]:
    def inputs(batch: int, _seq: int, gen) -> dict:
        return {"pixel_values": base._torch().randn(batch, 3, side, side, generator=gen)}
    return inputs


def text_inputs(names: tuple[str, ...]) -> Callable[[int, int, Any], dict]:
    """What a tokenizer feeds: ids over the whole vocabulary, a 0/1 mask padding the end of the
    first row (so every check has padded positions), two segments per row, positions 0..seq-1."""
    def inputs(batch: int, seq: int, gen) -> dict:
        torch = base._torch()
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - max(2, seq // 8):] = 0
        boundary = torch.randint(1, max(seq, 2), (batch, 1), generator=gen)
        every = {
            "input_ids": torch.randint(0, VOCAB, (batch, seq), generator=gen, dtype=torch.int64),
            "token_type_ids": (torch.arange(seq).unsqueeze(0) >= boundary).to(torch.int64),
            "attention_mask": mask,
            "position_ids": torch.arange(seq, dtype=torch.int64).expand(batch, seq).contiguous(),
        }
        return {n: every[n] for n in names}
    return inputs


RANGES = {"input_ids": (0, VOCAB), "token_type_ids": (0, 2), "attention_mask": (0, 2), "position_ids": (0, "sequence")}
BATCH = {0: "batch"}
BATCH_SEQ = {0: "batch", 1: "sequence"}


# ----------------------------------------------------------------------------- models

def timm_model(name: str, image: int = base.IMAGE, forms: tuple[str, ...] = TIMM_FORMS) -> Heldout:
    def build(_attn: str):
        import timm
        from timm.layers import set_fused_attn
        # Explicit MatMul/Softmax attention: the TorchScript exporter has no symbolic for
        # aten::scaled_dot_product_attention below opset 14.
        set_fused_attn(False)
        return timm.create_model(name, pretrained=False)
    spec = base.Spec(name=name.replace("_", "-"), library="timm", build=build, inputs=image_inputs(image),
                     dynamic_axes={"pixel_values": BATCH, "logits": BATCH}, output="logits",
                     note=f"timm.create_model({name!r}, pretrained=False), fused attention off, 3x{image}x{image}")
    return Heldout(spec, "timm", forms, image=image)


def torchvision_model(name: str, forms: tuple[str, ...] = CNN_FORMS, image: int = base.IMAGE, **kwargs) -> Heldout:
    def build(_attn: str):
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kwargs)
    args = "".join(f", {k}={v}" for k, v in kwargs.items())
    spec = base.Spec(name=name.replace("_", "-"), library="torchvision", build=build, inputs=image_inputs(image),
                     dynamic_axes={"pixel_values": BATCH, "logits": BATCH}, output="logits",
                     note=f"torchvision.models.{name}(weights=None{args}), 3x{image}x{image}")
    return Heldout(spec, "torchvision", forms, image=image)


def unet_build(_attn: str):
    torch = base._torch()
    nn = torch.nn

    def block(cin: int, cout: int):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self, widths=(16, 32, 64, 128), classes: int = 2):
            super().__init__()
            self.down = nn.ModuleList(block(cin, cout) for cin, cout in zip((3,) + widths[:-2], widths[:-1]))
            self.bottom = block(widths[-2], widths[-1])
            self.up = nn.ModuleList(block(wide + narrow, narrow) for wide, narrow in zip(widths[:0:-1], widths[-2::-1]))
            self.head = nn.Conv2d(widths[0], classes, 1)

        def forward(self, x):
            skips = []
            for stage in self.down:
                x = stage(x)
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
            x = self.bottom(x)
            for stage, skip in zip(self.up, reversed(skips)):
                x = nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
                x = stage(torch.cat([x, skip], dim=1))
            return self.head(x)

    return UNet()


def yolov8_build(_attn: str):
    """ultralytics' YOLOv8n detector from its yaml (random init, no weight download), its Detect
    head in export mode: one tensor of decoded boxes and class scores, as ultralytics' own ONNX
    export writes it. With height and width symbolic the TorchScript exporter declares dims such as
    floor(floor(height/2 - 1/2)/2) + 1 (issue 34)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    model = YOLO("yolov8n.yaml").model
    for module in model.modules():
        if type(module).__name__ == "Detect":
            module.export, module.format = True, "onnx"
    return model


def hf_wrapper(model, names: tuple[str, ...], **fixed):
    """A module whose forward takes exactly `names` (positional, as both exporters bind them) and
    returns the last hidden state."""
    torch = base._torch()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(names, inputs)), **fixed, return_dict=True).last_hidden_state

    # torch.export binds dynamic_shapes to the signature's names.
    p = inspect.Parameter
    LastHidden.forward.__signature__ = inspect.Signature(
        [p("self", p.POSITIONAL_OR_KEYWORD)] + [p(n, p.POSITIONAL_OR_KEYWORD) for n in names])
    return LastHidden().eval()


def hf_model(name: str, make: Callable[[], tuple[Any, Any]], names: tuple[str, ...], note: str,
             inputs=None, dynamic: dict | None = None, forms: tuple[str, ...] = TEXT_FORMS,
             attn: str | None = None, **fixed) -> Heldout:
    """`make` returns (model class, config); the dynamo forms get the library's default attention
    unless `attn` names one for all forms."""
    def build(form_attn: str):
        cls, config = make()
        return hf_wrapper(cls._from_config(config, attn_implementation=attn or form_attn), names, **fixed)
    axes = dynamic or {n: BATCH_SEQ for n in names}
    seq_out = BATCH_SEQ if any(1 in a for a in axes.values()) else BATCH
    spec = base.Spec(name=name, library="transformers", build=build, inputs=inputs or text_inputs(names),
                     dynamic_axes={**axes, "last_hidden_state": seq_out}, output="last_hidden_state", note=note)
    return Heldout(spec, "transformers", forms, ranges={n: RANGES[n] for n in names if n in RANGES}, attn=attn)


def _bert():
    from transformers import BertConfig, BertModel
    return BertModel, BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                 intermediate_size=1024, max_position_embeddings=512, type_vocab_size=2)


def _gpt2():
    from transformers import GPT2Config, GPT2Model
    return GPT2Model, GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=256, n_layer=4, n_head=4,
                                 bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def _llama():
    from transformers import LlamaConfig, LlamaModel
    return LlamaModel, LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def _qwen2():
    from transformers import Qwen2Config, Qwen2Model
    return Qwen2Model, Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel
    return T5EncoderModel, T5Config(vocab_size=VOCAB, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8,
                                    feed_forward_proj="gated-gelu")


def _vit():
    from transformers import ViTConfig, ViTModel
    return ViTModel, ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768)


WHISPER_MELS, WHISPER_FRAMES = 80, 200


def _whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    # The encoder takes exactly 2 * max_source_positions frames.
    return WhisperEncoder, WhisperConfig(vocab_size=VOCAB, d_model=256, encoder_layers=2, encoder_attention_heads=4,
                                         encoder_ffn_dim=1024, decoder_layers=1, decoder_attention_heads=4,
                                         decoder_ffn_dim=1024, num_mel_bins=WHISPER_MELS, pad_token_id=VOCAB - 1,
                                         bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                                         decoder_start_token_id=VOCAB - 1,
                                         max_source_positions=WHISPER_FRAMES // 2, max_target_positions=64)


def mel_inputs(batch: int, _seq: int, gen) -> dict:
    return {"input_features": base._torch().randn(batch, WHISPER_MELS, WHISPER_FRAMES, generator=gen)}


MODELS: list[Heldout] = [
    *(timm_model(n) for n in ("deit_tiny_patch16_224", "vit_tiny_patch16_224", "swin_tiny_patch4_window7_224",
                              "convnext_atto", "efficientvit_m0", "mobilevit_xxs")),
    # LeViT also at opset 17: BatchNorm on Linear outputs and a Transpose of every Linear's weight,
    # whose execution order the memory estimate must replay (issue 34).
    timm_model("levit_128s", forms=("opset13", "opset17")),
    torchvision_model("shufflenet_v2_x1_0", CNN_STATIC_FORMS),
    torchvision_model("squeezenet1_1", CNN_STATIC_FORMS),
    torchvision_model("googlenet", aux_logits=False, init_weights=True),
    torchvision_model("inception_v3", image=299, aux_logits=False, init_weights=True),
    torchvision_model("densenet121"),
    torchvision_model("regnet_y_400mf"),
    torchvision_model("mnasnet0_5", CNN_STATIC_FORMS),
    Heldout(base.Spec(name="unet-small", library="torch", build=unet_build, inputs=image_inputs(base.IMAGE),
                      dynamic_axes={"pixel_values": BATCH, "logits": BATCH}, output="logits",
                      note="U-Net in heldout.py: widths 16-32-64-128, 3 levels, conv-BN-ReLU x2, max-pool down, "
                           "bilinear upsample + skip concatenation up, 2 classes, 3x224x224"),
            "torch", CNN_STATIC_FORMS),
    Heldout(base.Spec(name="yolov8n", library="ultralytics", build=yolov8_build, inputs=image_inputs(YOLO_IMAGE),
                      dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"},
                                    "boxes": {0: "batch", 2: "anchors"}}, output="boxes",
                      note=f"ultralytics YOLO('yolov8n.yaml').model, Detect in export mode, "
                           f"3x{YOLO_IMAGE}x{YOLO_IMAGE}, batch, height and width symbolic"),
            "ultralytics", ("opset17",), image=YOLO_IMAGE),
    hf_model("hf-vit-tiny", _vit, ("pixel_values",), "ViTModel(hidden 192, 4 layers, 3 heads, MLP 768), no pooler",
             inputs=image_inputs(base.IMAGE), dynamic={"pixel_values": BATCH}),
    hf_model("bert-small", _bert, ("input_ids", "token_type_ids", "attention_mask"),
             f"BertModel(vocab {VOCAB}, hidden 256, 4 layers, 4 heads, MLP 1024, type_vocab 2), no pooler"),
    hf_model("gpt2-small", _gpt2, ("input_ids", "attention_mask", "position_ids"),
             f"GPT2Model(vocab {VOCAB}, 512 positions, hidden 256, 4 layers, 4 heads), use_cache=False",
             use_cache=False),
    hf_model("llama-gqa", _llama, ("input_ids", "attention_mask"),
             f"LlamaModel(vocab {VOCAB}, hidden 256, 4 layers, 8 heads, 2 KV heads, MLP 688), use_cache=False",
             use_cache=False),
    hf_model("qwen2-small", _qwen2, ("input_ids", "attention_mask"),
             f"Qwen2Model(vocab {VOCAB}, hidden 256, 4 layers, 8 heads, 2 KV heads, MLP 704), use_cache=False",
             use_cache=False),
    # Its dynamo form with the default (sdpa) attention fails (KNOWN_FAILURES); t5-encoder-eager has one.
    hf_model("t5-encoder", _t5_encoder, ("input_ids", "attention_mask"),
             f"T5EncoderModel(vocab {VOCAB}, d_model 256, d_kv 32, d_ff 1024, 4 layers, 8 heads, gated-gelu)",
             forms=("opset14",)),
    hf_model("t5-encoder-eager", _t5_encoder, ("input_ids", "attention_mask"),
             f"T5EncoderModel(vocab {VOCAB}, d_model 256, d_kv 32, d_ff 1024, 4 layers, 8 heads, gated-gelu), "
             "eager attention in the dynamo export", forms=("dynamo18",), attn="eager"),
    hf_model("whisper-encoder", _whisper_encoder, ("input_features",),
             f"WhisperEncoder(d_model 256, 2 layers, 4 heads, FFN 1024, {WHISPER_MELS} mels x {WHISPER_FRAMES} frames)",
             inputs=mel_inputs, dynamic={"input_features": BATCH}),
]


# Exports left out of MODELS because they fail, with the exact error (torch 2.14.1, transformers 5.24.0);
# they are listed in the manifest.
KNOWN_FAILURES = {
    "t5-encoder-dynamo18.onnx": "ConversionError: Failed to decompose the FX graph for ONNX compatibility. "
                                "[...] <class 'ValueError'>: Cannot view a tensor with shape "
                                "torch.Size([s43, s53, 8, 32]) and strides (256*s53, 32, 32*s53, 1) as a tensor "
                                "with shape (s43, s53, 256)! While executing %view_4 : "
                                "call_function[target=torch.ops.aten.view.default](args = (%transpose_3, "
                                "[%sym_size_int_11, %sym_size_int_12, -1])) (T5Attention.forward: "
                                "attn_output.reshape(*input_shape, -1) after the sdpa attention interface)",
}


def export(model, spec: base.Spec, form: str, args: tuple, path: Path) -> dict:
    exporter, opset, dynamic = FORMS[form]
    if exporter == "torchscript":
        return base.export_torchscript(model, spec, args, path, opset, dynamic)
    return base.export_dynamo(model, spec, args, path, opset)


# ----------------------------------------------------------------------------- shape settings

def activation_bytes(path: Path, feeds: dict) -> dict[str, int]:
    """Bytes of every node output (Constant nodes' excepted: those are weights) for these feeds."""
    import onnx
    import onnxruntime as ort
    model = onnx.load(str(path))
    known = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type != "Constant":
            model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in node.output if n and n not in known)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    return {n: v.nbytes for n, v in zip(names, values)}


def peak_bytes(path: Path, sizes: dict[str, int]) -> int:
    """Liveness in the file's node order: a tensor lives from its node to its last reader."""
    import onnx
    graph = onnx.load(str(path), load_external_data=False).graph
    end = len(graph.node)
    last = {o.name: end for o in graph.output}
    for i, node in enumerate(graph.node):
        for name in node.input:
            last[name] = max(last.get(name, i), i)
    live = peak = 0
    frees: dict[int, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            size = sizes.get(name, 0)
            live += size
            frees[last.get(name, i)] = frees.get(last.get(name, i), 0) + size
        peak = max(peak, live)
        live -= frees.pop(i, 0)
    return peak


def shape_settings(path: Path, entry: Heldout, static: bool) -> dict:
    """`small` (batch 1, sequence 128) and `large` (peak near 32 MiB), estimated from three runs at
    batch 1 and 2 and sequence 64 and 128: each tensor's size is fitted as c * batch^a * sequence^b."""
    torch = base._torch()
    text = any(1 in axes for axes in entry.spec.dynamic_axes.values())
    # symbolic image sides (height, width) stay at the exported image's side in both settings
    sides = {name: entry.image for axes in entry.spec.dynamic_axes.values() for axis, name in axes.items()
             if axis >= 2 and name not in ("batch", "sequence", "anchors")}

    def measure(batch: int, seq: int) -> dict[str, int]:
        return activation_bytes(path, entry.spec.inputs(batch, seq, torch.Generator().manual_seed(3)))

    s0 = SMALL_SEQ // 2
    at = measure(1, s0)
    by_batch = at if static else measure(2, s0)
    by_seq = measure(1, 2 * s0) if text else at

    def predict(batch: int, seq: int) -> int:
        sizes = {}
        for name, size in at.items():
            if size == 0:
                continue
            a = math.log2(max(by_batch.get(name, size), 1) / size)
            b = math.log2(max(by_seq.get(name, size), 1) / size)
            sizes[name] = int(size * batch ** a * (seq / s0) ** b)
        return peak_bytes(path, sizes)

    def setting(batch: int, seq: int) -> dict:
        dims = {"batch": batch, **sides, **({"sequence": seq} if text else {})}
        return {**dims, "activation_peak_mib": round(predict(batch, seq) / 2**20, 2)}

    small = setting(1, SMALL_SEQ)
    if static:
        return {"small": small, "large": {**small, "note": "static shapes: batch is fixed at 1"}}
    large_seq = LARGE_SEQ if text and predict(1, LARGE_SEQ) < TARGET_PEAK else SMALL_SEQ
    batch = min(range(1, 513), key=lambda b: abs(math.log(max(predict(b, large_seq), 1) / TARGET_PEAK)))
    return {"small": small, "large": setting(batch, large_seq)}


def describe_inputs(path: Path, entry: Heldout) -> list[dict]:
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype
    graph = onnx.load(str(path), load_external_data=False).graph
    inputs = []
    for value in graph.input:
        t = value.type.tensor_type
        info = {"name": value.name, "dtype": str(tensor_dtype_to_np_dtype(t.elem_type)),
                "shape": [d.dim_param or d.dim_value for d in t.shape.dim]}
        if value.name in entry.ranges:
            info["range"] = list(entry.ranges[value.name])
        inputs.append(info)
    return inputs


# ----------------------------------------------------------------------------- main

def log(result: dict) -> None:
    if result["status"] == "failed":
        print(f"  {result['file']}: FAILED after {result['seconds']} s: {result['error'][:2000]}", flush=True)
    else:
        print(f"  {result['file']}: {result['nodes']} nodes, opset {result['opset']}, {result['seconds']} s,"
              f" max |ort - torch| {result.get('check_max_abs_diff', float('nan')):.2e}"
              f" (output max {result.get('check_output_max_abs', float('nan')):.2e})"
              + ("" if result["check_ok"] else f" CHECK FAILED: {result.get('check_error', '')}"), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--only", default="", help="comma-separated: " + ", ".join(m.spec.name for m in MODELS))
    parser.add_argument("--force", action="store_true", help="re-export files that exist")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {m.spec.name for m in MODELS})
    if unknown:
        parser.error(f"unknown model: {unknown}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    import onnx
    import onnxruntime
    import onnxscript
    import timm
    import torch
    import torchvision
    import transformers
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    versions = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
                "timm": timm.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
                "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__}
    print("heldout:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    manifest["ranges"] = "half-open [low, high); high may be a symbolic dim's name"
    manifest["known_failures"] = KNOWN_FAILURES
    for name in KNOWN_FAILURES:
        manifest["files"].pop(name, None)
    failed = 0
    started = time.perf_counter()
    for entry in MODELS:
        if names and entry.spec.name not in names:
            continue
        print(f"{entry.spec.name}:", flush=True)
        for result in base.export_model(entry.spec, list(entry.forms), out, args.force, log, export, entry.image):
            if result["status"] == "kept":
                print(f"  {result['file']}: exists, kept (--force re-exports)", flush=True)
                continue
            exporter, _opset, dynamic = FORMS[result["form"]]
            forced = {"attn_implementation": entry.attn} if entry.attn else {}
            record = {**result, **forced, "family": entry.family, "exporter": exporter,
                      "export_call": result.get("exporter"), "versions": versions}
            if result["status"] != "failed":
                path = out / result["file"]
                record["inputs"] = describe_inputs(path, entry)
                record["shapes"] = shape_settings(path, entry, static=not dynamic)
                print(f"    small {record['shapes']['small']}, large {record['shapes']['large']}", flush=True)
            manifest["files"][result["file"]] = record
            failed += result["status"] != "exported"
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"done in {time.perf_counter() - started:.0f} s; {failed} failed; manifest {manifest_path}", flush=True)
    print(base.summary_table(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
