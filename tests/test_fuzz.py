"""Fuzzing: random graphs from the operators the passes know must keep their outputs, and mutated
model files must give a clear error (exit 2, one line), never a traceback.

`make test` runs a bounded number of examples; `make fuzz` sets FUSE_FUZZ_EXAMPLES higher.
"""

from __future__ import annotations

import os
import random

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuse_cli.cli import cli
from fuse_cli.errors import FuseError
from tests.conftest import SAMPLES, assert_equivalent, optimize_model
from tests.graphs import GraphBuilder

EXAMPLES = int(os.environ.get("FUSE_FUZZ_EXAMPLES", "25"))
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="FUSE_FUZZ_EXAMPLES" not in os.environ,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BLOCKS = ("conv", "conv_bn", "bn", "relu", "clip", "identity", "transpose_pair", "channel_mul", "channel_add",
          "residual", "side_output", "dropout", "pad_conv")


def random_cnn(blocks: list[str], seed: int, channels: int, eps: float, opset: int):
    """A chain over an [batch, C, 6, 6] activation; each block keeps the shape."""
    b = GraphBuilder(opset=opset, seed=seed)
    rng = np.random.default_rng(seed)
    y = b.input("x", ["batch", channels, 6, 6])
    history, side_outputs = [y], []

    def conv(t, bias=True, pads=(1, 1, 1, 1)):
        group = channels if rng.random() < 0.3 else 1
        weight = b.const(b.rand(channels, channels // group, 3, 3))
        inputs = [t, weight] + ([b.const(b.rand(channels))] if bias else [])
        return b.op("Conv", *inputs, pads=list(pads), group=group)

    def bn(t):
        return b.op("BatchNormalization", t, b.const(b.rand(channels, low=0.5, high=1.5)), b.const(b.rand(channels)),
                    b.const(b.rand(channels)), b.const(b.rand(channels, low=0.05, high=2.0)), epsilon=eps)

    for block in blocks:
        if block == "conv":
            y = conv(y, bias=bool(rng.integers(2)))
        elif block == "conv_bn":
            y = bn(conv(y, bias=bool(rng.integers(2))))
        elif block == "bn":
            y = bn(y)
        elif block == "relu":
            y = b.op("Relu", y)
        elif block == "clip":
            y = b.op("Clip", y, b.const(np.float32(0.0)), b.const(np.float32(6.0)))
        elif block == "identity":
            y = b.op("Identity", y)
        elif block == "transpose_pair":
            y = b.op("Transpose", b.op("Transpose", y, perm=[0, 2, 3, 1]), perm=[0, 3, 1, 2])
        elif block == "channel_mul":
            y = b.op("Mul", y, b.const(b.rand(1, channels, 1, 1)))
        elif block == "channel_add":
            y = b.op("Add", b.const(b.rand(channels, 1, 1)), y)
        elif block == "residual":
            y = b.op("Add", y, history[int(rng.integers(len(history)))])
        elif block == "side_output" and y != "x":
            side_outputs.append(y)  # a shared consumer: this intermediate is also a graph output
        elif block == "dropout":
            y = b.op("Dropout", y)
        elif block == "pad_conv":
            padded = b.op("Pad", y, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), mode="constant")
            y = conv(padded, pads=(0, 0, 0, 0))
        history.append(y)
    head = b.op("Flatten", b.op("GlobalAveragePool", y))
    logits = b.op("Add", b.op("MatMul", head, b.const(b.rand(channels, 5))), b.const(b.rand(5)))
    outputs = [logits] + list(dict.fromkeys(side_outputs))
    return b.build(*outputs, output_names=["logits"] + [f"side{i}" for i in range(len(outputs) - 1)])


@FUZZ_SETTINGS
@given(
    blocks=st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
    channels=st.sampled_from([2, 4]),
    eps=st.sampled_from([1e-5, 1e-3, 0.1]),
    opset=st.sampled_from([13, 17]),
    target=st.sampled_from(["onnx", "ort-cpu"]),
)
def test_random_graphs_keep_their_outputs(tmp_path_factory, blocks, seed, channels, eps, opset, target):
    assert_fuse_keeps_outputs(random_cnn(blocks, seed, channels, eps, opset), tmp_path_factory, target,
                              {"batch": 2}, seed)


def assert_fuse_keeps_outputs(model, tmp_path_factory, target: str, dims: dict[str, int], seed: int) -> None:
    """fuse either refuses with its own clear error, or writes a model no larger that computes the
    same outputs under the same names."""
    try:
        result = optimize_model(model, tmp_path_factory.mktemp("fuzz"), target=target)
    except FuseError:
        return  # a clear, user-facing refusal is allowed; anything else fails the test
    assert_equivalent(model, result.model, dims=dims, seeds=(seed,))
    assert len(result.model.graph.node) <= len(model.graph.node)
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]


SEQUENCE_BLOCKS = ("linear", "layer_norm", "layer_norm_no_affine", "rms_norm", "gelu_erf", "gelu_tanh", "relu",
                   "residual", "side_output", "transpose_pair", "reshape_pair", "scale", "softmax", "hard_swish",
                   "identity", "attention")


def random_sequence_model(blocks: list[str], seed: int, hidden: int, eps: float, opset: int):
    """A chain over a [batch, sequence, hidden] activation from the transformer-side patterns:
    bias Adds on either side, decomposed LayerNorm / RMSNorm / GELU with random eps and forms,
    self-attention, shared consumers. Each block keeps the shape."""
    b = GraphBuilder(opset=opset, seed=seed)
    rng = np.random.default_rng(seed)
    y = b.input("x", ["batch", "sequence", hidden])
    history, side_outputs = [y], []
    heads = 2

    def reduce_mean(t):
        if opset >= 18:  # axes became an input
            return b.op("ReduceMean", t, b.const(np.array([-1], np.int64)), keepdims=1)
        return b.op("ReduceMean", t, axes=[-1], keepdims=1)

    def bias_add(t, n):
        bias = b.const(b.rand(n))
        return b.op("Add", t, bias) if rng.random() < 0.5 else b.op("Add", bias, t)

    def linear(t, n_in, n_out):
        return bias_add(b.op("MatMul", t, b.const(b.rand(n_in, n_out))), n_out)

    def layer_norm(t, affine=True):
        centered = b.op("Sub", t, reduce_mean(t))
        variance = reduce_mean(b.op("Pow", centered, b.const(np.float32(2.0))))
        out = b.op("Div", centered, b.op("Sqrt", b.op("Add", variance, b.const(np.float32(eps)))))
        if affine:
            out = b.op("Add", b.op("Mul", out, b.const(b.rand(hidden, low=0.5, high=1.5))), b.const(b.rand(hidden)))
        return out

    def split_heads(t):
        shaped = b.op("Reshape", t, b.const(np.array([0, 0, heads, hidden // heads], np.int64)))
        return b.op("Transpose", shaped, perm=[0, 2, 1, 3])

    for block in blocks:
        if block == "linear":
            y = linear(y, hidden, hidden)
        elif block in ("layer_norm", "layer_norm_no_affine"):
            y = layer_norm(y, affine=block == "layer_norm")
        elif block == "rms_norm":
            rms = b.op("Sqrt", b.op("Add", reduce_mean(b.op("Pow", y, b.const(np.float32(2.0)))),
                                    b.const(np.float32(eps))))
            y = b.op("Mul", b.op("Div", y, rms), b.const(b.rand(hidden, low=0.5, high=1.5)))
        elif block == "gelu_erf":
            erf = b.op("Erf", b.op("Div", y, b.const(np.float32(np.sqrt(2.0)))))
            y = b.op("Mul", b.op("Mul", y, b.op("Add", erf, b.const(np.float32(1.0)))), b.const(np.float32(0.5)))
        elif block == "gelu_tanh":
            cube = b.op("Mul", b.op("Pow", y, b.const(np.float32(3.0))), b.const(np.float32(0.044715)))
            inner = b.op("Mul", b.op("Add", y, cube), b.const(np.float32(np.sqrt(2.0 / np.pi))))
            y = b.op("Mul", b.op("Mul", b.const(np.float32(0.5)), y),
                     b.op("Add", b.const(np.float32(1.0)), b.op("Tanh", inner)))
        elif block == "relu":
            y = b.op("Relu", y)
        elif block == "residual":
            y = b.op("Add", y, history[int(rng.integers(len(history)))])
        elif block == "side_output" and y != "x":
            side_outputs.append(y)
        elif block == "transpose_pair":
            y = b.op("Transpose", b.op("Transpose", y, perm=[0, 2, 1]), perm=[0, 2, 1])
        elif block == "reshape_pair":
            y = b.op("Reshape", b.op("Reshape", y, b.const(np.array([0, -1], np.int64))),
                     b.const(np.array([0, -1, hidden], np.int64)))
        elif block == "scale":
            y = b.op("Mul", y, b.const(np.float32(rng.uniform(0.5, 2.0))))
        elif block == "softmax":
            y = b.op("Softmax", y, axis=-1)
        elif block == "hard_swish":
            y = b.op("Mul", y, b.op("HardSigmoid", y, alpha=1.0 / 6, beta=0.5))
        elif block == "identity":
            y = b.op("Identity", y)
        elif block == "attention":
            q, k, v = (split_heads(linear(y, hidden, hidden)) for _ in range(3))
            scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
            probs = b.op("Softmax", b.op("Div", scores, b.const(np.float32(np.sqrt(hidden // heads)))), axis=-1)
            context = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
            y = linear(b.op("Reshape", context, b.const(np.array([0, 0, hidden], np.int64))), hidden, hidden)
        history.append(y)
    outputs = [y] + list(dict.fromkeys(o for o in side_outputs if o != y))
    return b.build(*outputs, output_names=["y"] + [f"side{i}" for i in range(len(outputs) - 1)])


@FUZZ_SETTINGS
@given(
    blocks=st.lists(st.sampled_from(SEQUENCE_BLOCKS), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
    hidden=st.sampled_from([4, 8]),
    eps=st.sampled_from([1e-12, 1e-5, 1e-2]),
    opset=st.sampled_from([14, 17, 18, 20]),
    target=st.sampled_from(["onnx", "ort-cpu", "ort"]),
)
def test_random_sequence_graphs_keep_their_outputs(tmp_path_factory, blocks, seed, hidden, eps, opset, target):
    assert_fuse_keeps_outputs(random_sequence_model(blocks, seed, hidden, eps, opset), tmp_path_factory, target,
                              {"batch": 2, "sequence": 3}, seed)


def _mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        kind = rng.choice(["flip", "truncate", "splice", "zero"])
        buf = bytearray(data)
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            buf = buf[: rng.randrange(1, len(buf))]
        elif kind == "splice":
            start = rng.randrange(len(buf))
            buf[start:start] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        else:
            start = rng.randrange(len(buf))
            buf[start:start + 16] = bytes(min(16, len(buf) - start))
        out.append(bytes(buf))
    return out


def _field_mutations(model: onnx.ModelProto, rng: random.Random, count: int) -> list[bytes]:
    """Structurally valid protobufs with semantically broken fields."""
    out = []
    for _ in range(count):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        node = m.graph.node[rng.randrange(len(m.graph.node))]
        kind = rng.choice(["op", "input", "output", "attr", "dims", "opset", "init_type"])
        if kind == "op":
            node.op_type = rng.choice(["Conv", "Nope", "", "BatchNormalization", "Gemm"])
        elif kind == "input" and node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "missing_tensor", node.output[0]])
        elif kind == "output":
            node.output[0] = m.graph.node[0].output[0]
        elif kind == "attr" and node.attribute:
            node.attribute[0].type = onnx.AttributeProto.STRING
        elif kind == "dims" and m.graph.initializer:
            init = m.graph.initializer[rng.randrange(len(m.graph.initializer))]
            if init.dims:
                init.dims[0] = rng.choice([0, 7, 10**6])
        elif kind == "opset":
            m.opset_import[0].version = rng.choice([1, 5, 99])
        elif kind == "init_type" and m.graph.initializer:
            m.graph.initializer[0].data_type = rng.choice([0, 8, 99])
        out.append(m.SerializeToString())
    return out


@pytest.mark.parametrize("sample", ["cnn_bn_relu.onnx", "mlp.onnx", "transformer_block_opset14.onnx"])
def test_mutated_files_fail_cleanly(tmp_path, sample):
    rng = random.Random(sample)
    data = (SAMPLES / sample).read_bytes()
    count = max(4, EXAMPLES // 3)
    cases = _mutations(data, rng, count) + _field_mutations(onnx.load(SAMPLES / sample), rng, count)
    runner = CliRunner()
    for i, blob in enumerate(cases):
        path = tmp_path / f"m{i}.onnx"
        path.write_bytes(blob)
        result = runner.invoke(cli, ["report", str(path), "--no-verify"])
        assert result.exit_code in (0, 1, 2), f"case {i}: exit {result.exit_code}: {result.stderr[-500:]}"
        assert "Traceback" not in result.stderr and result.exception is None or isinstance(result.exception, SystemExit)
        if result.exit_code == 2:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("fuse: error:"), f"case {i}: {result.stderr}"
        assert path.read_bytes() == blob, "the input must never be modified"
