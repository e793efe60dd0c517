"""com.microsoft Gelu, BiasGelu, FastGelu and QuickGelu (contrib-gelu, bias-gelu, fast-gelu, quick-gelu).

Memory: BiasGelu, and FastGelu given a bias, write input + bias into a temporary the size of
the output before the Erf/Tanh pass (BiasGelu::Compute, contrib_ops/cpu/bert/bias_gelu.cc);
measured: one output's worth. Gelu and FastGelu without a bias measured none.
"""

from __future__ import annotations

import onnx

from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Shapes, Slower, Spec, kernels
from fuse_cli.ops.rules import output_sized, same_as_input_0

_FAMILY = "at other dtypes the CPU provider expands it back into elementwise ops: nothing is fused"
_CUDA = "float32 float16 bfloat16 float64"
_HIDDEN = (Probe.H * Probe.D,)


def _biased_workspace(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    return output_sized(node, shapes, opset) if len(node.input) > 1 and node.input[1] else 0


RECORDS = (
    Operator("Gelu", MS, support=kernels("Gelu", "float32", _CUDA, _FAMILY),
             probe=Spec("Gelu", MS, (Input("X", Probe.X3),)),
             contracts=(Contract("Gelu", MS, "float32", (), ("contrib-gelu",)),),
             stand_in=same_as_input_0, float16_body_on_cpu=True),
    Operator("BiasGelu", MS, support=kernels("BiasGelu", "float32", _CUDA),
             slower=(Slower(
                 "BiasGelu", "cpu",
                 "onnxruntime's CPU BiasGelu measured 1.04-1.28x slower than the Add + Gelu it would replace, so the "
                 "bias Add stays (target {target}; --target ort-cuda fuses it)",
                 "onnxruntime 1.31, profiler kernel time, one thread, fp32, graph optimizations off. After a MatMul, "
                 "200 runs: [1, 128, 3072] 262-272 vs 210-216 us, [1, 197, 3072] 417 vs 333-352 us, [1, 1024, 3072] "
                 "2205-2214 vs 1866-1960 us. Its 12 nodes in real exports, us a run: bert-base dynamo 2988-3423 vs "
                 "2445-2796, vit-base dynamo 4650-4768 vs 3894-3966, vit-base opset 17 4558-4798 vs 3622-3844, "
                 "bert-base opset 17 2410-2513 vs 2321-2400."),),
             probe=Spec("BiasGelu", MS, (Input("A", Probe.X3), Input("bias", _HIDDEN))),
             contracts=(Contract("BiasGelu", MS, "float32", (), ("bias-gelu",)),),
             stand_in=same_as_input_0, workspace=output_sized),
    Operator("FastGelu", MS, support=kernels("FastGelu", "float32", _CUDA, _FAMILY),
             probe=Spec("FastGelu", MS, (Input("X", Probe.X3), Input("bias", _HIDDEN, True))),
             contracts=(Contract("FastGelu", MS, "float32", (), ("fast-gelu",)),
                        Contract("FastGelu", MS, "float32", ("bias",), ("fast-gelu",))),
             stand_in=same_as_input_0, workspace=_biased_workspace, float16_body_on_cpu=True),
    Operator("QuickGelu", MS, support=kernels("QuickGelu", "float32", _CUDA, _FAMILY),
             probe=Spec("QuickGelu", MS, (Input("X", Probe.X3),), {"alpha": 1.702}),
             contracts=(Contract("QuickGelu", MS, "float32", (), ("quick-gelu",)),),
             stand_in=same_as_input_0, float16_body_on_cpu=True),
)
