"""The record of one operator: what fuse knows about it, in one place.

An `Operator` holds an operator's facts for every part of fuse that needs them:
- support: which onnxruntime provider runs it at which dtype (targets.py's table), the
  measurements that make a kernel that runs not worth emitting (`Slower`), and the forms checked
  on some providers only (`Unchecked`);
- kernel contracts: the one-node probe (`Spec`) and the forms of the node the passes write
  (`Contract`), each checked against the installed onnxruntime (kernel_contracts.py);
- its shape rule: standard nodes that infer its output's shape where onnx has no inference for
  it (analysis/shapes.py);
- its memory rules: the kernel's scratch while it runs (workspace), whether its output is a view
  of its input or may be written into an input's buffer (analysis/planner.py).
The rows keep the table forms targets.py and kernel_contracts.py print and test, operator name
included, so a row reads the same wherever it is quoted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import onnx
from onnx import TensorProto

MS = "com.microsoft"
FLOAT_ONLY = frozenset({TensorProto.FLOAT})


# ---- support (targets.py) ----

@dataclass(frozen=True)
class Capability:
    op: str
    domain: str  # "com.microsoft", or "" for the few operators onnxruntime registers in the default domain
    cpu: frozenset[str]  # dtype names it has a kernel for on onnxruntime's CPU provider
    cuda: frozenset[str]
    notes: str = ""  # constraints beyond the dtype, in plain words

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def dtypes(self, provider: str) -> frozenset[str]:
        return getattr(self, provider)


def kernels(op: str, cpu: str, cuda: str, notes: str = "", domain: str = MS) -> Capability:
    """A Capability from space-separated dtype names."""
    return Capability(op, domain, frozenset(cpu.split()), frozenset(cuda.split()), notes)


@dataclass(frozen=True)
class Slower:
    """A kernel a provider runs, measured slower than the operators it would replace. `op` names
    an operator, or one form of it as `op:attribute` (the pass that emits the form asks).

    `reason` is the near-miss text ({target} is the target's name). With `leaves_pipeline` the
    passes emitting `op` are not in the pipelines of targets that use `provider` at all (nothing
    to report: the unfused form is simply what that target runs)."""

    op: str
    provider: str
    reason: str
    evidence: str
    leaves_pipeline: bool = False


@dataclass(frozen=True)
class Unchecked:
    """A kernel a provider has, for a form fuse emits that was checked on other providers only
    (no machine with that provider at hand): declined there until someone checks it."""

    op: str
    provider: str
    reason: str
    domain: str = MS  # "" for a standard operator


# ---- kernel contracts (kernel_contracts.py) ----

@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    optional: bool = False
    integers: tuple[int, int] | None = None  # integer values in [low, high); None: the float dtype
    integer_dtype: str = "int64"


def scalar(name: str, value: int, dtype: str = "float32") -> Input:
    """A one-value input holding the whole number `value` (a scale, a zero point), as a 0-d array:
    a random scalar would reach onnxruntime as a numpy scalar, which it refuses."""
    return Input(name, (), integers=(value, value + 1), integer_dtype=dtype)


@dataclass(frozen=True)
class Spec:
    """A one-node probe of `op`: its inputs in order (an optional one may be left empty) and attributes."""

    op: str
    domain: str
    inputs: tuple[Input, ...]
    attrs: dict = field(default_factory=dict)
    opset: int = 17  # the default domain's
    output_dtype: str | None = None  # the output's element type where it is not the form's (a quantized one)


@dataclass(frozen=True)
class Contract:
    op: str
    domain: str  # "" for the default domain
    dtype: str
    absent: tuple[str, ...] = ()  # optional inputs left empty
    emitted_by: tuple[str, ...] = ()  # the passes that write this form
    refused: str | None = None  # None: runs and agrees with the reference; else what the probe found

    @property
    def label(self) -> str:
        where = f"{self.domain}::{self.op}" if self.domain else self.op
        return f"{where} {self.dtype}" + (f" without {', '.join(self.absent)}" if self.absent else "")


class Probe:
    """The probes' sizes: batch 2, sequence 3, 2 heads of 4; X3 is the [B, S, H*D] activation."""

    B, S, H, D = 2, 3, 2, 4
    X3 = (B, S, H * D)


# ---- shape and memory rules (analysis/) ----

class TensorFacts(Protocol):
    name: str
    elem_type: int
    shape: tuple | None


class Shapes(Protocol):
    """What a memory rule reads of a shape table (analysis.shapes.ShapeTable)."""

    def get(self, name: str) -> TensorFacts | None: ...

    def nbytes(self, name: str) -> int | None: ...


# Standard nodes that write `node`'s first output with its shape and type ([] when none), at the
# model's default-domain opset.
ShapeRule = Callable[[onnx.NodeProto, int], list[onnx.NodeProto]]
# The kernel's scratch in bytes while it runs, at these shapes and opset; 0 when none or unknown.
WorkspaceRule = Callable[[onnx.NodeProto, Shapes, int], int]


@dataclass(frozen=True)
class Operator:
    """Everything fuse knows about one operator. `domain` "" is the default domain."""

    op: str
    domain: str = ""
    # onnxruntime's kernels of it (targets.CAPABILITIES); for a standard operator (`standard`)
    # newer than onnxruntime's fused ones, what the CPU provider runs (targets.STANDARD)
    support: Capability | None = None
    standard: bool = False
    slower: tuple[Slower, ...] = ()
    unchecked: tuple[Unchecked, ...] = ()
    probe: Spec | None = None
    contracts: tuple[Contract, ...] = ()
    stand_in: ShapeRule | None = None
    workspace: WorkspaceRule | None = None
    # the scratch where the planner writes the output into a buffer held before, when that differs
    held_workspace: WorkspaceRule | None = None
    view_opsets: tuple[int, int] | None = None  # output 0 is a view of input 0 (an Alias kernel) at these opsets
    # input whose buffer a MayInplace kernel may write output 0 into, and the element types it is
    # registered for (None: every type the op has a kernel for)
    in_place: tuple[int, frozenset[int] | None] | None = None
    # the CPU provider has no kernel for it and inlines its ONNX function body, whose nodes
    # onnxruntime's graph numbers after every stored node: that steers its execution order
    # (core/order.runtime_indices)
    function_body: bool = False
    # float16 on the CPU provider: no kernel, and it inlines the function body (the elementwise
    # nodes a fusion would replace) instead of casting around the float32 kernel
    float16_body_on_cpu: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)
