"""The leaves a function body onnxruntime inlines adds to the graph it runs, which steer its
execution order: what the memory walk must start its reverse depth-first order from.

onnxruntime's CPU provider inlines a node it has no kernel for at the node's types, where the
operator has an ONNX function body: a float16 standard Attention whose attn_mask is float32 (its
float16 kernel takes a float16 or boolean mask; fuse widens a float16 mask,
toolkit/standard_attention.py), Softmax-13 at float16. Nothing removes the body's nodes whose
outputs nothing reads at ORT_DISABLE_ALL (the Attention body's AttnBiasShape where a mask is given,
its CalculatedScale where `scale` is): they are leaves of the graph, numbered when the node is
inlined, after every stored node and before the Casts inserted later, and onnxruntime's default
order, a reverse depth-first walk from the leaves highest index first (core/order.py), starts
from them. Everything upstream of what they read runs before the graph outputs' ancestry: in a
float16 decoder the weights' Casts of the later layers no longer run first. Measured on a float16
Phi-3 prefill at opset 23 with its two Attentions inlined, batch 1 x 1: estimated 1.51 MiB with one
Attention node, 0.945 with its body's leaves, 0.960 allocated (memray); onnxruntime's profile runs
its nodes in the order the leaves give.

Which nodes are inlined, and which of a node's inputs each leaf reads, is what onnxruntime does
with a one-node model of the node's types and attributes, loaded in the isolation worker and
saved (core.model_runs.saved_as_run): probed once per operator, types and attributes. Only nodes
with a float16 input whose operator has an ONNX function body are probed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from fuse_cli.core import isolation, model_runs

FLOAT16 = onnx.TensorProto.FLOAT16


@dataclass(frozen=True)
class InlinedBodies:
    """`inlined`: the stored positions of the nodes onnxruntime inlines; `leaves`: each leaf of
    their bodies, in the order onnxruntime numbers them, as (the node's stored position, the names
    of the node's inputs the leaf reads, in the order its walk reaches them)."""

    inlined: tuple[int, ...] = ()
    leaves: tuple[tuple[int, tuple[str, ...]], ...] = ()


def inlined_bodies(nodes: Sequence[onnx.NodeProto], elem_type: Callable[[str], int | None],
                   rank: Callable[[str], int | None], opset_imports: Sequence[tuple[str, int]],
                   ir_version: int) -> InlinedBodies:
    """What onnxruntime's CPU provider inlines of `nodes` (the main graph's, stored order)."""
    opsets = dict(opset_imports)
    inlined: list[int] = []
    leaves: list[tuple[int, tuple[str, ...]]] = []
    for position, node in enumerate(nodes):
        if not any(name and elem_type(name) == FLOAT16 for name in node.input):
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = opsets.get(domain, opsets.get("ai.onnx") if domain == "" else None)
        if opset is None or not _has_function_body(node.op_type, domain, opset):
            continue
        signature = (tuple((elem_type(n), rank(n)) if n else None for n in node.input),
                     tuple(elem_type(n) for n in node.output))
        if any(t is not None and None in t for t in signature[0]) or None in signature[1]:
            continue  # a type or rank unknown: not probed
        bare = onnx.NodeProto()
        bare.CopyFrom(node)
        del bare.input[:], bare.output[:]
        bare.name = bare.doc_string = ""
        bare.domain = domain
        del bare.metadata_props[:]
        probed = _probe(bare.SerializeToString(), signature, tuple(sorted(opsets.items())), ir_version)
        if probed is None:
            continue
        inlined.append(position)
        leaves.extend((position, tuple(node.input[k] for k in reads)) for reads in probed)
    return InlinedBodies(tuple(inlined), tuple(leaves))


@functools.cache
def _has_function_body(op_type: str, domain: str, opset: int) -> bool:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain or "")
    except onnx.defs.SchemaError:
        return False
    return schema.has_function or schema.has_context_dependent_function


@functools.lru_cache(maxsize=256)
def _probe(node_bytes: bytes, signature: tuple, opsets: tuple[tuple[str, int], ...],
           ir_version: int) -> tuple[tuple[int, ...], ...] | None:
    """None where onnxruntime runs the node as a kernel (or the probe fails); else, per leaf of the
    body it inlines, the positions of the node's inputs that leaf reads (numbering order)."""
    (inputs, outputs) = signature
    node = onnx.NodeProto()
    node.ParseFromString(node_bytes)
    names = [f"in{k}" if t is not None else "" for k, t in enumerate(inputs)]
    node.input.extend(names)
    node.output.extend(f"out{k}" for k in range(len(outputs)))
    graph_inputs = [onnx.helper.make_tensor_value_info(name, elem, [f"d{k}_{j}" for j in range(dims)])
                    for k, (name, t) in enumerate(zip(names, inputs)) if t is not None for elem, dims in [t]]
    graph_outputs = [onnx.helper.make_tensor_value_info(f"out{k}", elem, None) for k, elem in enumerate(outputs)]
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "probe", graph_inputs, graph_outputs),
                                   opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = ir_version
    try:
        saved = onnx.load_from_string(isolation.call_aside(model_runs.saved_as_run, model.SerializeToString()))
    except Exception:  # noqa: BLE001 - a probe that fails (FuseError: the worker crashed) tells nothing
        return None
    if any(n.op_type == node.op_type and (n.domain or "") == (node.domain or "") for n in saved.graph.node):
        return None
    return _leaves(saved.graph, names)


def _leaves(graph: onnx.GraphProto, names: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each node whose outputs no node reads and no graph output is, in onnxruntime's numbering
    order, with the graph inputs (positions in `names`) it depends on, in the order its walk
    reaches them. The saved graph is in onnxruntime's execution order, which starts from the
    highest-numbered leaf: the leaves come in reverse, and of a leaf's inputs the one its walk
    reached first is read first there."""
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    read = {name for n in graph.node for name in n.input}
    outputs = {vi.name for vi in graph.output}
    position = {name: k for k, name in enumerate(names) if name}

    def first_reads(leaf: int) -> tuple[int, ...]:
        """The inputs the leaf's ancestry reads, by the first node (execution order) reading each."""
        first: dict[int, int] = {}
        stack, seen = [leaf], set()
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            for name in graph.node[i].input:
                if name in position:
                    first[position[name]] = min(first.get(position[name], i), i)
                elif name in producer:
                    stack.append(producer[name])
        return tuple(sorted(first, key=first.__getitem__))

    leaves = [i for i, n in enumerate(graph.node) if not any(out in read or out in outputs for out in n.output if out)]
    return tuple(first_reads(i) for i in reversed(leaves))
