"""Kernel contracts: which forms of the operators fuse emits the pinned onnxruntime runs correctly.

targets.py says which operator has a kernel at which dtype; a kernel can still crash or compute
something else for one form of the node: onnxruntime-gpu 1.31.1's CPU com.microsoft Attention
segfaults without its bias input, at every shape. A form here is an operator at a dtype with
some of its optional inputs left empty, as a pass may write it. Each was probed with one-node
models in the worker process (core/isolation.py, so a crash is a finding), against a reference:
- an optional input left empty against the same node given that input's neutral value (zeros for
  a bias, an added residual or an additive mask): "absent" must mean "neutral";
- float16 against the same node in float32 on the same values, at float16's tolerance.
What a form computes with every input present, at float32, each pass's own tests check against
the unfused original. tests/test_kernel_contracts.py probes every row against the installed
runtime. A row with `refused` is a form the passes must not emit (the reason, as measured).
"""

from __future__ import annotations

from fuse_cli.ops import OPERATORS
from fuse_cli.ops.record import MS, Contract, Input, Spec

__all__ = ("MS", "Contract", "Input", "Spec", "SPECS", "CONTRACTS", "refused_forms")

# The rows live in the operators' records (fuse_cli/ops/): each operator's probe and the forms
# its passes write, next to its support and its shape and memory rules.
SPECS: dict[tuple[str, str], Spec] = {(r.probe.op, r.probe.domain): r.probe for r in OPERATORS if r.probe}
CONTRACTS: tuple[Contract, ...] = tuple(c for r in OPERATORS for c in r.contracts)


def refused_forms(op: str, domain: str) -> tuple[Contract, ...]:
    """The probed forms of `op` the passes must not write, with what the probe found."""
    return tuple(c for c in CONTRACTS if (c.op, c.domain) == (op, domain) and c.refused)
