"""The fixed subset that `make gpu-check` runs on CUDA, built in code (the GPU machine reaches no
network and gets only the working tree): onnx.helper graphs in the decomposed forms
torch.onnx.export writes at opset 17, random weights from a seeded generator, float32 or float16.

- cnn: a ResNet-18 (Conv + BatchNormalization + Relu, residual Adds, MaxPool, pooled classifier)
- bert: a 4-layer BERT-base encoder (post-LN LayerNormalization, erf GELU, additive padding mask)
- vit: a 4-layer ViT-B/16 (patch Conv, class token, pre-LN blocks, attention scaled by a Div)
- llm-prefill / llm-decode: a 4-layer Llama-like decoder (RMSNorm as Pow/ReduceMean/Sqrt/
  Reciprocal, rotary embedding from cos/sin caches, SiLU MLP, GPT-2's causal slice of a constant
  buffer); the prefill graph has no past inputs, the decode graph reads past_key_*/past_value_* and
  returns the present ones, as optimum's decoder and decoder-with-past exports do.

Weights are perturbed away from the 0 biases and unit gammas of a fresh transformers model, so an
Add(x, 0) or Mul(x, 1) cannot stand in for a trained model's (see /work/shared/FACTS.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by default
OPSET = 17


class Net:
    """Nodes and initializers of one graph in one float dtype; each node's output is named after it."""

    def __init__(self, dtype: np.dtype, seed: int) -> None:
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()

    def _unique(self, name: str) -> str:
        stem, n = name, 1
        while name in self._names:
            n += 1
            name = f"{stem}_{n}"
        self._names.add(name)
        return name

    def input(self, name: str, shape: list[int | str], elem: int | None = None) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem or self.elem, shape))
        return name

    def output(self, value: str, name: str, shape: list[int | str]) -> None:
        """Renames the producing node's output to the graph output's name."""
        for node in self.nodes:
            node.output[:] = [name if o == value else o for o in node.output]
            node.input[:] = [name if i == value else i for i in node.input]
        self.outputs.append(helper.make_tensor_value_info(name, self.elem, shape))

    def const(self, value, name: str = "c", dtype=None) -> str:
        name = self._unique(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), "shape", np.int64)

    def weight(self, name: str, *shape: int, scale: float | None = None) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        values = self.rng.standard_normal(shape, dtype=np.float32) * (scale if scale is not None else fan_in ** -0.5)
        return self.const(values, name)

    def near(self, name: str, center: float, n: int) -> str:
        """A gamma near 1 or a bias near 0: what training leaves, not transformers' exact init."""
        return self.const(center + 0.05 * self.rng.standard_normal(n, dtype=np.float32), name)

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs) -> str:
        name = self._unique(name or op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                 producer_name="fuse-gpu-check")


def linear(net: Net, x: str, name: str, n_in: int, n_out: int, bias: bool = True) -> str:
    """torch's nn.Linear: MatMul, then Add(bias, product) with the bias first."""
    y = net.op("MatMul", x, net.weight(f"{name}.weight", n_in, n_out), name=f"{name}_matmul")
    return net.op("Add", net.near(f"{name}.bias", 0.0, n_out), y, name=f"{name}_add") if bias else y


def layer_norm(net: Net, x: str, name: str, n: int) -> str:
    return net.op("LayerNormalization", x, net.near(f"{name}.weight", 1.0, n), net.near(f"{name}.bias", 0.0, n),
                  axis=-1, epsilon=1e-12 if name.startswith("bert") else 1e-6, name=name)


def gelu(net: Net, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), in the order torch writes it."""
    erf = net.op("Erf", net.op("Div", x, net.const(np.sqrt(2.0))))
    return net.op("Mul", net.op("Mul", x, net.op("Add", erf, net.const(1.0))), net.const(0.5))


def split_heads(net: Net, x: str, heads: int, head_size: int, perm: list[int]) -> str:
    return net.op("Transpose", net.op("Reshape", x, net.ints(0, -1, heads, head_size)), perm=perm)


def merge_heads(net: Net, context: str, hidden: int) -> str:
    return net.op("Reshape", net.op("Transpose", context, perm=[0, 2, 1, 3]), net.ints(0, -1, hidden))


def encoder_attention(net: Net, x: str, name: str, hidden: int, heads: int, mask: str | None) -> str:
    head_size = hidden // heads
    q = split_heads(net, linear(net, x, f"{name}.query", hidden, hidden), heads, head_size, [0, 2, 1, 3])
    k = split_heads(net, linear(net, x, f"{name}.key", hidden, hidden), heads, head_size, [0, 2, 3, 1])
    v = split_heads(net, linear(net, x, f"{name}.value", hidden, hidden), heads, head_size, [0, 2, 1, 3])
    scores = net.op("Div", net.op("MatMul", q, k), net.const(np.sqrt(head_size)))
    if mask is not None:
        scores = net.op("Add", scores, mask)
    context = net.op("MatMul", net.op("Softmax", scores, axis=-1), v)
    return linear(net, merge_heads(net, context, hidden), f"{name}.output", hidden, hidden)


def build_cnn(dtype=np.float32, seed: int = 0, width: int = 64, image: int = 224,
              classes: int = 1000) -> onnx.ModelProto:
    net = Net(dtype, seed)
    x = net.input("pixel_values", ["batch", 3, image, image])

    def conv_bn(t: str, name: str, c_in: int, c_out: int, kernel: int, stride: int, relu: bool) -> str:
        conv = net.op("Conv", t, net.weight(f"{name}.weight", c_out, c_in, kernel, kernel), kernel_shape=[kernel] * 2,
                      strides=[stride] * 2, pads=[kernel // 2] * 4, name=name)
        bn = net.op("BatchNormalization", conv, net.near(f"{name}.bn.weight", 1.0, c_out),
                    net.near(f"{name}.bn.bias", 0.0, c_out), net.near(f"{name}.bn.mean", 0.0, c_out),
                    net.const(1.0 + 0.1 * net.rng.random(c_out, dtype=np.float32), f"{name}.bn.var"),
                    epsilon=1e-5, name=f"{name}_bn")
        return net.op("Relu", bn) if relu else bn

    t = conv_bn(x, "stem", 3, width, 7, 2, relu=True)
    t = net.op("MaxPool", t, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = width
    for stage, c_out in enumerate((width, 2 * width, 4 * width, 8 * width)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}.{block}"
            y = conv_bn(t, f"{name}.conv1", c_in, c_out, 3, stride, relu=True)
            y = conv_bn(y, f"{name}.conv2", c_out, c_out, 3, 1, relu=False)
            shortcut = conv_bn(t, f"{name}.downsample", c_in, c_out, 1, stride, relu=False) if stride > 1 else t
            t = net.op("Relu", net.op("Add", y, shortcut))
            c_in = c_out
    pooled = net.op("Flatten", net.op("GlobalAveragePool", t), axis=1)
    net.output(linear(net, pooled, "fc", c_in, classes), "logits", ["batch", classes])
    return net.model("resnet18")


def build_bert(dtype=np.float32, seed: int = 0, layers: int = 4, hidden: int = 768, heads: int = 12,
               vocab: int = 8192, positions: int = 512) -> onnx.ModelProto:
    net = Net(dtype, seed)
    ids = net.input("input_ids", ["batch", "sequence"], TensorProto.INT64)
    mask = net.input("attention_mask", ["batch", "sequence"], TensorProto.INT64)
    words = net.op("Gather", net.weight("bert.embeddings.word", vocab, hidden, scale=0.02), ids)
    length = net.op("Slice", net.op("Shape", ids), net.ints(1), net.ints(2))
    position_ids = net.op("Unsqueeze", net.op("Range", net.const(0, "zero", np.int64),
                                              net.op("Squeeze", length, net.ints(0)),
                                              net.const(1, "one", np.int64)), net.ints(0))
    where = net.op("Gather", net.weight("bert.embeddings.position", positions, hidden, scale=0.02), position_ids)
    x = layer_norm(net, net.op("Add", words, where), "bert.embeddings.norm", hidden)
    # (1 - mask) * finfo.min, broadcast over heads and query positions
    additive = net.op("Mul", net.op("Sub", net.const(1.0), net.op("Cast", net.op("Unsqueeze", mask, net.ints(1, 2)),
                                                                  to=net.elem)),
                      net.const(np.finfo(net.dtype).min))
    for i in range(layers):
        p = f"bert.layer{i}"
        x = layer_norm(net, net.op("Add", encoder_attention(net, x, f"{p}.attention", hidden, heads, additive), x),
                       f"{p}.attention_norm", hidden)
        h = linear(net, gelu(net, linear(net, x, f"{p}.intermediate", hidden, 4 * hidden)), f"{p}.output",
                   4 * hidden, hidden)
        x = layer_norm(net, net.op("Add", h, x), f"{p}.output_norm", hidden)
    net.output(x, "last_hidden_state", ["batch", "sequence", hidden])
    return net.model("bert")


def build_vit(dtype=np.float32, seed: int = 0, layers: int = 4, hidden: int = 768, heads: int = 12,
              patch: int = 16, image: int = 224, classes: int = 1000) -> onnx.ModelProto:
    net = Net(dtype, seed)
    pixels = net.input("pixel_values", ["batch", 3, image, image])
    tokens = (image // patch) ** 2
    patches = net.op("Conv", pixels, net.weight("vit.patch.weight", hidden, 3, patch, patch),
                     net.near("vit.patch.bias", 0.0, hidden), kernel_shape=[patch, patch], strides=[patch, patch])
    patches = net.op("Transpose", net.op("Reshape", patches, net.ints(0, hidden, tokens)), perm=[0, 2, 1])
    batch = net.op("Slice", net.op("Shape", pixels), net.ints(0), net.ints(1))
    cls = net.op("Expand", net.weight("vit.cls_token", 1, 1, hidden, scale=0.02),
                 net.op("Concat", batch, net.ints(1, hidden), axis=0))
    position = net.weight("vit.position", 1, tokens + 1, hidden, scale=0.02)
    x = net.op("Add", net.op("Concat", cls, patches, axis=1), position)
    for i in range(layers):
        p = f"vit.layer{i}"
        x = net.op("Add", x, encoder_attention(net, layer_norm(net, x, f"{p}.norm1", hidden), f"{p}.attention",
                                               hidden, heads, None))
        h = gelu(net, linear(net, layer_norm(net, x, f"{p}.norm2", hidden), f"{p}.fc1", hidden, 4 * hidden))
        x = net.op("Add", x, linear(net, h, f"{p}.fc2", 4 * hidden, hidden))
    first = net.op("Gather", layer_norm(net, x, "vit.norm", hidden), net.const(0, "first", np.int64), axis=1)
    net.output(linear(net, first, "vit.head", hidden, classes), "logits", ["batch", classes])
    return net.model("vit")


def build_llm(dtype=np.float32, seed: int = 0, with_past: bool = False, layers: int = 4, hidden: int = 1024,
              heads: int = 16, ffn: int = 2816, vocab: int = 8192, positions: int = 1024) -> onnx.ModelProto:
    net = Net(dtype, seed)
    head_size = hidden // heads
    ids = net.input("input_ids", ["batch", "sequence"], TensorProto.INT64)
    position_ids = net.input("position_ids", ["batch", "sequence"], TensorProto.INT64)
    inverse = 1.0 / 10000 ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    angles = np.outer(np.arange(positions), inverse)
    angles = np.concatenate([angles, angles], axis=1)
    cos = net.op("Unsqueeze", net.op("Gather", net.const(np.cos(angles), "cos_cache"), position_ids), net.ints(1))
    sin = net.op("Unsqueeze", net.op("Gather", net.const(np.sin(angles), "sin_cache"), position_ids), net.ints(1))
    causal = net.const(np.tril(np.ones((1, 1, positions, positions), bool)), "causal_buffer", bool)
    fill = net.const(np.finfo(net.dtype).min)
    two, epsilon = net.const(2.0), net.const(1e-6)

    def rms_norm(t: str, name: str) -> str:
        variance = net.op("ReduceMean", net.op("Pow", t, two), axes=[-1], keepdims=1)
        inverse_root = net.op("Reciprocal", net.op("Sqrt", net.op("Add", variance, epsilon)))
        return net.op("Mul", net.near(f"{name}.weight", 1.0, hidden), net.op("Mul", t, inverse_root), name=name)

    def rotary(t: str) -> str:
        half = head_size // 2
        first = net.op("Slice", t, net.ints(0), net.ints(half), net.ints(3))
        second = net.op("Slice", t, net.ints(half), net.ints(np.iinfo(np.int64).max), net.ints(3))
        rotated = net.op("Concat", net.op("Neg", second), first, axis=-1)
        return net.op("Add", net.op("Mul", t, cos), net.op("Mul", rotated, sin))

    x = net.op("Gather", net.weight("embed_tokens", vocab, hidden, scale=0.02), ids)
    for i in range(layers):
        p = f"layers.{i}"
        h = rms_norm(x, f"{p}.input_norm")
        q, k, v = (split_heads(net, linear(net, h, f"{p}.{kind}_proj", hidden, hidden, bias=False), heads, head_size,
                               [0, 2, 1, 3]) for kind in ("q", "k", "v"))
        q, k = rotary(q), rotary(k)
        if with_past:
            past = ["batch", heads, "past_sequence", head_size]
            k = net.op("Concat", net.input(f"past_key.{i}", past), k, axis=2)
            v = net.op("Concat", net.input(f"past_value.{i}", past), v, axis=2)
        present = ["batch", heads, "total_sequence" if with_past else "sequence", head_size]
        net.output(k, f"present_key.{i}", present)
        net.output(v, f"present_value.{i}", present)
        k, v = f"present_key.{i}", f"present_value.{i}"
        scores = net.op("Div", net.op("MatMul", q, net.op("Transpose", k, perm=[0, 1, 3, 2])),
                        net.const(np.sqrt(head_size)))
        # rows total - sequence .. total, columns 0 .. total of the lower-triangular buffer
        query_length = net.op("Slice", net.op("Shape", q), net.ints(2), net.ints(3))
        total = net.op("Slice", net.op("Shape", k), net.ints(2), net.ints(3))
        allowed = net.op("Slice", causal, net.op("Concat", net.op("Sub", total, query_length), net.ints(0), axis=0),
                         net.op("Concat", total, total, axis=0), net.ints(2, 3))
        probs = net.op("Softmax", net.op("Where", allowed, scores, fill), axis=-1)
        attention = linear(net, merge_heads(net, net.op("MatMul", probs, v), hidden), f"{p}.o_proj", hidden, hidden,
                           bias=False)
        x = net.op("Add", x, attention)
        h = rms_norm(x, f"{p}.post_norm")
        gate = linear(net, h, f"{p}.gate_proj", hidden, ffn, bias=False)
        up = linear(net, h, f"{p}.up_proj", hidden, ffn, bias=False)
        silu = net.op("Mul", gate, net.op("Sigmoid", gate))
        x = net.op("Add", x, linear(net, net.op("Mul", silu, up), f"{p}.down_proj", ffn, hidden, bias=False))
    logits = linear(net, rms_norm(x, "final_norm"), "lm_head", hidden, vocab, bias=False)
    net.output(logits, "logits", ["batch", "sequence", vocab])
    return net.model("llm_decode" if with_past else "llm_prefill")


@dataclass(frozen=True)
class Case:
    """One model of the subset at the dims it is run, timed and measured at."""

    name: str
    build: Callable[..., onnx.ModelProto]
    dims: dict[str, int]
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    dtype: str = "float32"

    def model(self) -> onnx.ModelProto:
        return self.build(dtype=np.dtype(self.dtype))


def _decode(**kw) -> onnx.ModelProto:
    return build_llm(with_past=True, **kw)


_BASE = (
    Case("cnn", build_cnn, {"batch": 8}),
    Case("bert", build_bert, {"batch": 8, "sequence": 128}, {"input_ids": (0, 8192), "attention_mask": (0, 2)}),
    Case("vit", build_vit, {"batch": 8}),
    Case("llm-prefill", build_llm, {"batch": 1, "sequence": 512}, {"input_ids": (0, 8192), "position_ids": (0, 512)}),
    # one new token after 511: position 511, the causal slice's last row
    Case("llm-decode", _decode, {"batch": 1, "sequence": 1, "past_sequence": 511, "total_sequence": 512},
         {"input_ids": (0, 8192), "position_ids": (511, 512)}),
)
SUBSET = tuple(Case(c.name, c.build, c.dims, c.int_ranges, dtype) for dtype in ("float32", "float16") for c in _BASE)
