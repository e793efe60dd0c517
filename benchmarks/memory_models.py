"""The models of the big-model memory table (benchmarks/big_models.py), built here, never stored.

- `write_decoder`: a Llama-like decoder skeleton in the decomposed form an exporter writes
  (RMSNorm as Pow/ReduceMean/Add/Sqrt/Div/Mul, attention through Reshape/Transpose/Softmax, a SiLU
  MLP as Sigmoid*Mul), random weights, fp16 or fp32, in external data. At the default sizes (16
  layers, hidden 2048, MLP 5632, vocabulary 32000) it has 0.95 B parameters: 1.9 GB in fp16,
  3.8 GB in fp32. Weights go to the data file a row block at a time: the builder never holds one
  whole weight, let alone the model.
- `write_conv_bn_stack`: Conv -> BatchNormalization -> Relu, repeated, weights embedded in the
  .onnx file (61 layers of 512 channels: 577 MB), the case where every weight is rewritten.
- `to_external_data`: an embedded model re-saved with its weights in external data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by default
OPSET = 17
_BLOCK_BYTES = 64 * 2**20


def write_decoder(path: Path, *, layers: int = 16, hidden: int = 2048, ffn: int = 5632, vocab: int = 32000,
                  heads: int = 16, dtype=np.float16, seed: int = 0) -> None:
    """input_ids [batch, sequence] -> logits [batch, sequence, vocab]; weights in `path`.data."""
    dtype = np.dtype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    nodes: list[onnx.NodeProto] = []
    initializers: list[TensorProto] = []

    with open(path.parent / data_name, "wb") as data:
        def weight(name: str, rows: int, cols: int, scale: float) -> str:
            offset = data.tell()
            per_block = max(1, _BLOCK_BYTES // (cols * 4))
            for start in range(0, rows, per_block):
                block = rng.standard_normal((min(per_block, rows - start), cols), dtype=np.float32)
                block *= scale
                data.write(block.astype(dtype).tobytes())
            tensor = TensorProto(name=name, data_type=elem, dims=[rows, cols], data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data_name), ("offset", str(offset)),
                               ("length", str(rows * cols * dtype.itemsize))):
                tensor.external_data.add(key=key, value=value)
            initializers.append(tensor)
            return name

        def const(name: str, value, kind=None) -> str:
            initializers.append(numpy_helper.from_array(np.asarray(value, dtype=kind or dtype), name))
            return name

        def op(op_type: str, inputs: list[str], name: str, **attrs) -> str:
            nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
            return name

        def rms_norm(x: str, name: str) -> str:
            variance = op("ReduceMean", [op("Pow", [x, "two"], f"{name}_pow")], f"{name}_mean", axes=[-1], keepdims=1)
            root = op("Sqrt", [op("Add", [variance, "epsilon"], f"{name}_add_eps")], f"{name}_sqrt")
            normed = op("Div", [x, root], f"{name}_div")
            return op("Mul", [normed, const(f"{name}.weight", np.ones(hidden))], f"{name}_mul")

        head_dim = hidden // heads
        const("two", 2.0)
        const("epsilon", 1e-5)
        const("attn_scale", np.sqrt(head_dim))
        const("split_heads", [0, 0, heads, head_dim], np.int64)
        const("merge_heads", [0, 0, hidden], np.int64)
        x = op("Gather", [weight("embed_tokens", vocab, hidden, 1.0), "input_ids"], "embed")
        for i in range(layers):
            p = f"layers.{i}"
            h = rms_norm(x, f"{p}.input_norm")

            def projected(kind: str, perm: list[int]) -> str:
                y = op("MatMul", [h, weight(f"{p}.{kind}.weight", hidden, hidden, hidden ** -0.5)], f"{p}.{kind}")
                return op("Transpose", [op("Reshape", [y, "split_heads"], f"{p}.{kind}_split")], f"{p}.{kind}_heads",
                          perm=perm)

            q = projected("q_proj", [0, 2, 1, 3])
            k = projected("k_proj", [0, 2, 3, 1])
            v = projected("v_proj", [0, 2, 1, 3])
            scores = op("Div", [op("MatMul", [q, k], f"{p}.qk"), "attn_scale"], f"{p}.scores")
            context = op("MatMul", [op("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.context")
            merged = op("Reshape", [op("Transpose", [context], f"{p}.context_t", perm=[0, 2, 1, 3]), "merge_heads"],
                        f"{p}.merged")
            attn = op("MatMul", [merged, weight(f"{p}.o_proj.weight", hidden, hidden, hidden ** -0.5)], f"{p}.o_proj")
            x = op("Add", [x, attn], f"{p}.attn_residual")
            h = rms_norm(x, f"{p}.post_norm")
            gate = op("MatMul", [h, weight(f"{p}.gate_proj.weight", hidden, ffn, hidden ** -0.5)], f"{p}.gate")
            up = op("MatMul", [h, weight(f"{p}.up_proj.weight", hidden, ffn, hidden ** -0.5)], f"{p}.up")
            silu = op("Mul", [gate, op("Sigmoid", [gate], f"{p}.gate_sigmoid")], f"{p}.silu")
            down = op("MatMul", [op("Mul", [silu, up], f"{p}.gated"),
                                 weight(f"{p}.down_proj.weight", ffn, hidden, ffn ** -0.5)], f"{p}.down")
            x = op("Add", [x, down], f"{p}.mlp_residual")
        op("MatMul", [rms_norm(x, "final_norm"), weight("lm_head", hidden, vocab, hidden ** -0.5)], "logits")

    graph = helper.make_graph(
        nodes, "decoder_skeleton",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "sequence", vocab])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="fuse-benchmark")
    onnx.save(model, str(path))


def write_conv_bn_stack(path: Path, *, layers: int = 61, channels: int = 512, seed: int = 0) -> None:
    """x [batch, channels, 8, 8] through `layers` Conv(3x3) -> BatchNormalization -> Relu, weights
    embedded in the file."""
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    x = "x"
    for i in range(layers):
        p = f"block{i}"
        weight = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) * (channels * 9) ** -0.5
        initializers.append(numpy_helper.from_array(weight, f"{p}.conv.weight"))
        for name, value in (("scale", rng.uniform(0.5, 1.5, channels)), ("bias", rng.normal(0, 0.1, channels)),
                            ("mean", rng.normal(0, 0.1, channels)), ("var", rng.uniform(0.5, 1.5, channels))):
            initializers.append(numpy_helper.from_array(value.astype(np.float32), f"{p}.bn.{name}"))
        nodes.append(helper.make_node("Conv", [x, f"{p}.conv.weight"], [f"{p}_conv"], name=f"{p}_conv", pads=[1] * 4))
        nodes.append(helper.make_node("BatchNormalization", [f"{p}_conv"] + [f"{p}.bn.{n}" for n in
                                      ("scale", "bias", "mean", "var")], [f"{p}_bn"], name=f"{p}_bn"))
        nodes.append(helper.make_node("Relu", [f"{p}_bn"], [f"{p}_relu"], name=f"{p}_relu"))
        x = f"{p}_relu"
    nodes[-1].output[0] = "y"
    shape = ["batch", channels, 8, 8]
    graph = helper.make_graph(nodes, "conv_bn_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="fuse-benchmark")
    onnx.save(model, str(path))


def to_external_data(source: Path, path: Path) -> None:
    """`source` re-saved as `path` with every weight of 1 KiB or more in `path`.data."""
    onnx.save(onnx.load(str(source)), str(path), save_as_external_data=True, location=path.name + ".data")


def model_size(path: Path) -> int:
    """The model file plus the external data files it names."""
    model = onnx.load(str(path), load_external_data=False)
    files = {path}
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                files.add(path.parent / entry.value)
    return sum(f.stat().st_size for f in files)


def uses_external_data(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
