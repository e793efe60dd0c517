"""The notes a report carries: what the run changed besides fusions, and how to run the output."""

from __future__ import annotations

import onnx

from fuse_cli.analysis.shapes import ShapeTable
from fuse_cli.graph.opset import default_opset
from fuse_cli.toolkit.residual_norms import fused_by_onnxruntime


def opset_note(before: int, model: onnx.ModelProto) -> tuple[str, ...]:
    after = default_opset(model)
    return (f"converted from opset {before} to {after} (IR version {model.ir_version})",) if after != before else ()


def shape_notes(table: ShapeTable) -> tuple[str, ...]:
    notes = [f"--dim {name} matches no dimension of this model" for name in table.unused_dims]
    return tuple(notes + list(table.warnings))


def run_level_note(target: str, model: onnx.ModelProto) -> tuple[str, ...]:
    """onnxruntime's own optimizer (on by default, level all) fuses Add + LayerNormalization into
    SkipLayerNormalization wherever its shapes of the two Add operands are the same, which the
    contrib operators' shape inference gives it. Its CPU kernel is slow in onnxruntime 1.31 (6.6x
    the unfused pair, see targets.py): the transformer sample ran 1.41x slower at level all than
    at disabled. pin-residual-dims tells the operands apart where the peak allows; the note is for
    the residuals it left. Runs of an offline-optimized model need no online optimizer."""
    if target != "ort-cpu":
        return ()
    if not fused_by_onnxruntime(model):
        return ()
    return ("run this model in onnxruntime with graph optimizations at basic or disabled: at the default level "
            "(all) onnxruntime 1.31 fuses Add + LayerNormalization into its slow CPU SkipLayerNormalization "
            "(measured 1.4x slower on a transformer block)",)
