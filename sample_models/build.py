"""Build the small, deterministic ONNX sample models that fuse's demo, tests and docs use.

Run ``python sample_models/build.py`` from anywhere; the ``.onnx`` files are written beside this
script and are byte-for-byte identical on every run (weights come from a seeded numpy generator).
Every model declares IR version 8 (onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by
default), float32 weights, and a graph input with symbolic ``batch`` (and ``sequence``) dims.

What each sample exercises:

``cnn_bn_relu.onnx`` (opset 17)
    Conv + BatchNormalization folding with non-trivial statistics: a Conv with a bias, a Conv
    without one, a depthwise Conv (group=16) and a strided 1x1 Conv, one BatchNormalization with a
    non-default epsilon (1e-3). Conv + Relu and Conv + Clip(0, 6) activation fusion, a residual
    Add followed by Relu, and a GlobalAveragePool -> Flatten -> MatMul + Add classifier head.

``mlp.onnx`` (opset 17)
    MatMul + Add (-> Gemm) fusion with Relu activations, plus an inference-mode Dropout and an
    Identity for the elimination passes.

``transformer_block_opset14.onnx`` (opset 14)
    One BERT-style post-LN encoder block (hidden 64, 4 heads, FFN 256) in the decomposed form
    torch.onnx.export writes at opset 14: Linear layers as MatMul + Add(bias, matmul) (bias
    first, as torch emits it), multi-head attention through Reshape/Transpose/MatMul/Div/Softmax,
    LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add (ReduceMean axes as an
    attribute, as before opset 18), GELU in the Erf form, and residual Adds feeding each LayerNorm
    (SkipLayerNormalization candidates). Scalar constants are 0-d initializers.

``transformer_block_opset17.onnx`` (opset 17)
    The same block with the same weights, each LayerNorm as one LayerNormalization node; GELU stays
    decomposed (Gelu needs opset 20). Its outputs must match the opset 14 file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT_DIR = Path(__file__).resolve().parent
SEED = 20240611
IR_VERSION = 8
PRODUCER = "fuse-sample-models"
MAX_BYTES = 2 * 1024 * 1024

HIDDEN = 64
HEADS = 4
HEAD_SIZE = HIDDEN // HEADS
FFN = 256
LN_EPSILON = 1e-5


class GraphBuilder:
    """Collects nodes and initializers; each node's single output is named ``<node name>_out``."""

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng  # only needed by normal() and uniform()
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate name {name!r}")
        self._names.add(name)
        return name

    def const(self, name: str, value: Any, dtype: type = np.float32) -> str:
        """Add an initializer (scalars become 0-d tensors) and return its name."""
        array = np.asarray(value, dtype=dtype)
        self.initializers.append(numpy_helper.from_array(array, self._claim(name)))
        return name

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> str:
        return self.const(name, self.rng.normal(mean, std, size=shape))

    def uniform(self, name: str, shape: tuple[int, ...], low: float, high: float) -> str:
        return self.const(name, self.rng.uniform(low, high, size=shape))

    def op(self, op_type: str, inputs: list[str], name: str, output: str | None = None, **attrs: Any) -> str:
        """Add one node and return the name of its output."""
        output = self._claim(output or f"{name}_out")
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=self._claim(name), **attrs))
        return output

    def model(
        self,
        name: str,
        doc: str,
        opset: int,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers, doc_string=doc)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name=PRODUCER,
            ir_version=IR_VERSION,
            doc_string=doc,
        )
        helper.set_model_props(model, {"source": "fuse sample_models/build.py"})
        return model


def float_tensor(name: str, dims: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


# --- cnn_bn_relu.onnx ------------------------------------------------------------------------


def conv(b: GraphBuilder, x: str, name: str, c_in: int, c_out: int, kernel: int, *,
         bias: bool, group: int = 1, stride: int = 1) -> str:
    fan_in = c_in // group * kernel * kernel
    inputs = [x, b.normal(f"{name}.weight", (c_out, c_in // group, kernel, kernel), np.sqrt(2.0 / fan_in))]
    if bias:
        inputs.append(b.normal(f"{name}.bias", (c_out,), 0.1))
    pad = kernel // 2
    return b.op("Conv", inputs, name, kernel_shape=[kernel, kernel], pads=[pad] * 4,
                strides=[stride, stride], group=group, dilations=[1, 1])


def batch_norm(b: GraphBuilder, x: str, name: str, channels: int, epsilon: float) -> str:
    gamma = b.uniform(f"{name}.scale", (channels,), 0.5, 1.5)
    beta = b.normal(f"{name}.bias", (channels,), 0.2)
    mean = b.normal(f"{name}.mean", (channels,), 0.5)
    var = b.uniform(f"{name}.var", (channels,), 0.5, 2.0)
    return b.op("BatchNormalization", [x, gamma, beta, mean, var], name, epsilon=epsilon)


def build_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    b = GraphBuilder(rng)
    x = conv(b, "image", "conv1", 3, 16, 3, bias=True)
    relu1 = b.op("Relu", [batch_norm(b, x, "bn1", 16, 1e-5)], "relu1")
    x = conv(b, relu1, "conv2", 16, 16, 3, bias=False)
    x = b.op("Relu", [batch_norm(b, x, "bn2", 16, 1e-3)], "relu2")
    x = b.op("Add", [x, relu1], "residual_add")
    x = b.op("Relu", [x], "relu3")
    x = conv(b, x, "dwconv3", 16, 16, 3, bias=False, group=16)
    x = b.op("Relu", [batch_norm(b, x, "bn3", 16, 1e-5)], "relu4")
    x = conv(b, x, "conv4", 16, 32, 1, bias=False, stride=2)
    x = batch_norm(b, x, "bn4", 32, 1e-5)
    x = b.op("Clip", [x, b.const("clip.min", 0.0), b.const("clip.max", 6.0)], "clip4")
    x = b.op("GlobalAveragePool", [x], "gap")
    x = b.op("Flatten", [x], "flatten", axis=1)
    x = b.op("MatMul", [x, b.normal("fc.weight", (32, 10), np.sqrt(1.0 / 32))], "fc_matmul")
    b.op("Add", [x, b.normal("fc.bias", (10,), 0.1)], "fc_add", output="logits")
    return b.model(
        "cnn_bn_relu",
        "Small CNN for Conv+BatchNormalization folding and Conv+Relu/Clip fusion.",
        17,
        [float_tensor("image", ["batch", 3, 32, 32])],
        [float_tensor("logits", ["batch", 10])],
    )


# --- mlp.onnx --------------------------------------------------------------------------------


def dense(b: GraphBuilder, x: str, name: str, n_in: int, n_out: int, output: str | None = None) -> str:
    x = b.op("MatMul", [x, b.normal(f"{name}.weight", (n_in, n_out), np.sqrt(2.0 / n_in))], f"{name}_matmul")
    return b.op("Add", [x, b.normal(f"{name}.bias", (n_out,), 0.1)], f"{name}_add", output=output)


def build_mlp(rng: np.random.Generator) -> onnx.ModelProto:
    b = GraphBuilder(rng)
    x = b.op("Relu", [dense(b, "features", "fc1", 64, 128)], "relu1")
    x = b.op("Dropout", [x], "dropout1")
    x = b.op("Relu", [dense(b, x, "fc2", 128, 128)], "relu2")
    x = b.op("Identity", [x], "identity2")
    dense(b, x, "fc3", 128, 10, output="scores")
    return b.model(
        "mlp",
        "Three-layer MLP for MatMul+Add fusion, with an inference Dropout and an Identity to eliminate.",
        17,
        [float_tensor("features", ["batch", 64])],
        [float_tensor("scores", ["batch", 10])],
    )


# --- transformer_block_opset{14,17}.onnx ------------------------------------------------------


def draw_block_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One set of encoder weights, shared by both opset variants."""

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    weights: dict[str, np.ndarray] = {}
    for proj in ("query", "key", "value", "attn_out"):
        weights[f"{proj}.weight"] = normal((HIDDEN, HIDDEN), HIDDEN**-0.5)
        weights[f"{proj}.bias"] = normal((HIDDEN,), 0.02)
    weights["ffn_in.weight"] = normal((HIDDEN, FFN), HIDDEN**-0.5)
    weights["ffn_in.bias"] = normal((FFN,), 0.02)
    weights["ffn_out.weight"] = normal((FFN, HIDDEN), FFN**-0.5)
    weights["ffn_out.bias"] = normal((HIDDEN,), 0.02)
    for ln in ("ln1", "ln2"):
        weights[f"{ln}.weight"] = rng.uniform(0.5, 1.5, size=HIDDEN).astype(np.float32)
        weights[f"{ln}.bias"] = normal((HIDDEN,), 0.1)
    return weights


def linear(b: GraphBuilder, x: str, name: str, w: dict[str, np.ndarray]) -> str:
    """torch's 3-D Linear export: MatMul by the pre-transposed weight, then Add(bias, product)."""
    x = b.op("MatMul", [x, b.const(f"{name}.weight", w[f"{name}.weight"])], f"{name}_matmul")
    return b.op("Add", [b.const(f"{name}.bias", w[f"{name}.bias"]), x], f"{name}_add")


def decomposed_layer_norm(b: GraphBuilder, x: str, name: str, w: dict[str, np.ndarray],
                          output: str | None = None) -> str:
    mean = b.op("ReduceMean", [x], f"{name}_mean", axes=[-1], keepdims=1)
    centered = b.op("Sub", [x, mean], f"{name}_sub")
    squared = b.op("Pow", [centered, b.const(f"{name}.pow_exponent", 2.0)], f"{name}_pow")
    variance = b.op("ReduceMean", [squared], f"{name}_var", axes=[-1], keepdims=1)
    x = b.op("Add", [variance, b.const(f"{name}.epsilon", LN_EPSILON)], f"{name}_add_eps")
    x = b.op("Sqrt", [x], f"{name}_sqrt")
    x = b.op("Div", [centered, x], f"{name}_div")
    x = b.op("Mul", [x, b.const(f"{name}.weight", w[f"{name}.weight"])], f"{name}_mul_gamma")
    return b.op("Add", [x, b.const(f"{name}.bias", w[f"{name}.bias"])], f"{name}_add_beta", output=output)


def fused_layer_norm(b: GraphBuilder, x: str, name: str, w: dict[str, np.ndarray],
                     output: str | None = None) -> str:
    scale, bias = b.const(f"{name}.weight", w[f"{name}.weight"]), b.const(f"{name}.bias", w[f"{name}.bias"])
    return b.op("LayerNormalization", [x, scale, bias], name, output=output, axis=-1, epsilon=LN_EPSILON)


def attention_heads(b: GraphBuilder, x: str, name: str, perm: list[int]) -> str:
    x = b.op("Reshape", [x, "attn.split_heads_shape"], f"{name}_reshape")
    return b.op("Transpose", [x], f"{name}_transpose", perm=perm)


def build_transformer(weights: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    b = GraphBuilder()
    layer_norm = decomposed_layer_norm if opset < 17 else fused_layer_norm
    hidden = "hidden"

    # 0 copies batch, -1 infers sequence: the constant shapes work for any symbolic batch/sequence.
    b.const("attn.split_heads_shape", [0, -1, HEADS, HEAD_SIZE], np.int64)
    b.const("attn.merge_heads_shape", [0, 0, HIDDEN], np.int64)
    q = attention_heads(b, linear(b, hidden, "query", weights), "query", [0, 2, 1, 3])
    k = attention_heads(b, linear(b, hidden, "key", weights), "key", [0, 2, 3, 1])
    v = attention_heads(b, linear(b, hidden, "value", weights), "value", [0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], "attn_qk_matmul")
    scores = b.op("Div", [scores, b.const("attn.scale", float(np.sqrt(HEAD_SIZE)))], "attn_scale_div")
    probs = b.op("Softmax", [scores], "attn_softmax", axis=-1)
    context = b.op("MatMul", [probs, v], "attn_v_matmul")
    context = b.op("Transpose", [context], "attn_merge_transpose", perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, "attn.merge_heads_shape"], "attn_merge_reshape")
    x = b.op("Add", [linear(b, context, "attn_out", weights), hidden], "attn_residual_add")
    attn_out = layer_norm(b, x, "ln1", weights)

    x = linear(b, attn_out, "ffn_in", weights)
    erf = b.op("Erf", [b.op("Div", [x, b.const("gelu.sqrt2", 1.4142135)], "gelu_div")], "gelu_erf")
    erf_plus_one = b.op("Add", [erf, b.const("gelu.one", 1.0)], "gelu_add_one")
    x = b.op("Mul", [x, erf_plus_one], "gelu_mul_x")
    x = b.op("Mul", [x, b.const("gelu.half", 0.5)], "gelu_mul_half")
    x = b.op("Add", [linear(b, x, "ffn_out", weights), attn_out], "ffn_residual_add")
    layer_norm(b, x, "ln2", weights, output="output")

    norm = "decomposed LayerNorm" if opset < 17 else "LayerNormalization"
    return b.model(
        f"transformer_block_opset{opset}",
        f"BERT-style post-LN encoder block (hidden {HIDDEN}, {HEADS} heads, FFN {FFN}), {norm}, Erf GELU.",
        opset,
        [float_tensor("hidden", ["batch", "sequence", HIDDEN])],
        [float_tensor("output", ["batch", "sequence", HIDDEN])],
    )


# --- checks and main -------------------------------------------------------------------------


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    bindings = {"batch": 2, "sequence": 7}
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else bindings[d.dim_param]
                for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def run_once(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    # Unoptimized, so the opset 14/17 comparison in main() runs the decomposed LayerNorm as written
    # instead of the LayerNormalization onnxruntime would fuse it into.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    for array in outputs:
        if not np.all(np.isfinite(array)):
            raise RuntimeError(f"{path.name}: non-finite output")
    return outputs


def main() -> None:
    weights = draw_block_weights(np.random.default_rng(SEED + 1))
    models = {
        "cnn_bn_relu.onnx": build_cnn(np.random.default_rng(SEED)),
        "mlp.onnx": build_mlp(np.random.default_rng(SEED)),
        "transformer_block_opset14.onnx": build_transformer(weights, 14),
        "transformer_block_opset17.onnx": build_transformer(weights, 17),
    }
    outputs = {}
    for file_name, model in models.items():
        path = OUT_DIR / file_name
        onnx.checker.check_model(model, full_check=True)
        data = model.SerializeToString()
        if len(data) > MAX_BYTES:
            raise RuntimeError(f"{file_name} is {len(data)} bytes, over the {MAX_BYTES}-byte limit")
        path.write_bytes(data)
        outputs[file_name] = run_once(path, random_feeds(model, np.random.default_rng(SEED)))
        digest = hashlib.sha256(data).hexdigest()[:12]
        print(f"{file_name:34s} {len(model.graph.node):3d} nodes {len(data):8d} bytes  sha256 {digest}")

    # Both variants share weights and input seed, so they must compute the same function.
    (out14,), (out17,) = outputs["transformer_block_opset14.onnx"], outputs["transformer_block_opset17.onnx"]
    np.testing.assert_allclose(out14, out17, rtol=1e-4, atol=1e-4)
    print(f"transformer opset 14 vs 17: max abs diff {np.abs(out14 - out17).max():.2e}")


if __name__ == "__main__":
    main()
