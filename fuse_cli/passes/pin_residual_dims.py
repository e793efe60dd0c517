"""A residual Add's operand declared with fresh dims, so that onnxruntime does not make its slower
CPU SkipLayerNormalization of the Add + LayerNormalization."""

from __future__ import annotations

import onnx

from fuse_cli.analysis.planner_shapes import planner_shapes
from fuse_cli.pipeline.base import Estimates, ModelPass, never_higher, peak_change
from fuse_cli.pipeline.records import FusionRecord
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.declared_dims import Declared, declare_as, declare_fresh_dims, undeclare
from fuse_cli.toolkit.residual_norms import Residual, residuals, same_shape


@register
class PinResidualDims(ModelPass):
    """x ── Add(r) ── LayerNormalization   =>   the same nodes; one operand of the Add declared
                                                 (value_info) with fresh names for its symbolic dims

    onnxruntime's level-2 optimizer (on at its default level, all, and at extended) fuses a
    residual Add + LayerNormalization into com.microsoft SkipLayerNormalization wherever its shapes
    of the two operands are the same dim for dim (SkipLayerNormFusion), and that CPU kernel is
    slower than the pair (targets.SLOWER: 6.6x at [1, 128, 768]). The original often escapes it,
    its shapes unknown to onnxruntime behind a Reshape to a Shape-computed target; fuse's outputs
    tell onnxruntime the shapes (constant Reshape targets, the contrib operators' inference), and
    the transformer sample's `--target ort-cpu` output ran 1.41x slower at level all than at
    disabled before this pass. A dim declared with a fresh name (unfused_N) is one onnxruntime's
    inference keeps (unhold-buffers relies on the same), so the operands' shapes differ by name
    and the fusion declines; no node and no value changes. The sum is declared with the dims it had
    (onnxruntime's broadcast of two differently named dims knows no name), so every tensor after
    it keeps its names and the planner shares their buffers as before; and the operand renamed is
    one whose names do not reach the other operand (renaming a post-norm stack's previous layer
    output renames the branch that reads it too: the two stay alike, and nothing is kept).

    Only where the two operands have one shape, every dim known, as onnxruntime's inference leaves
    them (the planner's shapes, toolkit/residual_norms.py): elsewhere it fuses nothing. Each
    declaration is judged by the peak guard's estimate, since a declared name is also what
    onnxruntime's planner compares: kept where the peak is never higher at any setting under any
    rule. An operand whose dims are all values cannot be renamed (onnxruntime infers the values);
    a graph input or output keeps the interface's shape. On --target ort-cpu only: CUDA's
    SkipLayerNormalization is faster (the skip-layer-norm pass emits it there), and a
    `--target onnx` output keeps the original's shapes unknown to onnxruntime where its Reshapes
    read them at run time.
    """

    name = "pin-residual-dims"
    description = ("Declare fresh dims on a residual Add's operand, so onnxruntime does not make its slower CPU "
                   "SkipLayerNormalization of Add + LayerNormalization")
    label = "Add + LayerNormalization -> operand's dims declared afresh"
    for_provider = "cpu"  # the slower kernel is the CPU's; CUDA's is faster (skip-layer-norm emits it there)

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> tuple[FusionRecord, ...]:
        graph = model.graph
        fixed = {v.name for v in (*graph.input, *graph.output, *graph.initializer)}
        fixed |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
        planner = planner_shapes(model)
        pending = [r for r in residuals(graph) if same_shape(planner, r)]
        if not pending:
            return ()
        try:
            current = estimates.peaks_by_rule(model)
        except ValueError:  # a stored order that is not topological (the memory model's check): as it is
            return ()
        records: list[FusionRecord] = []
        for residual in pending:
            if not same_shape(planner, residual):  # told apart by a declaration kept before
                continue
            for operand in (name for name in residual.operands if name not in fixed):
                declared = _pin(model, residual, operand, planner)
                if declared is None:
                    continue
                after_shapes = planner_shapes(model)
                # the other operand may read the renamed one (a previous layer's output): still alike
                if not same_shape(after_shapes, residual):
                    after = estimates.peaks_by_rule(model)
                    if never_higher(current, after):
                        records.append(FusionRecord(self.name, self.label, (), (), (),
                                                    peak_delta=peak_change(current, after)))
                        current, planner = after, after_shapes
                        break
                for d in reversed(declared):
                    undeclare(model, d)
        return tuple(records)


def _pin(model: onnx.ModelProto, residual: Residual, operand: str, planner) -> list[Declared] | None:
    """`operand` declared with fresh dims, and the sum with the dims it had: onnxruntime's
    broadcast of two differently named dims knows no name, and the sum's declaration keeps the
    names it had for every tensor after it (so the planner shares their buffers as before)."""
    renamed = declare_fresh_dims(model, operand, planner, prefix="unfused")
    if renamed is None:
        return None
    kept = declare_as(model, residual.sum, planner)
    return [renamed] + ([kept] if kept else [])
