"""Opset conversion on request (`--upgrade-opset N`), with onnx's own version converter."""

from __future__ import annotations

import onnx
from onnx import version_converter

from fuse_cli.core.domains import default_opset_or_none, is_default_domain
from fuse_cli.errors import FuseError


def default_opset(model: onnx.ModelProto) -> int:
    opset = default_opset_or_none(model)
    if opset is None:
        raise FuseError("model imports no default-domain (ai.onnx) opset")
    return opset


def minimum_ir_version(opset: int) -> int:
    """The oldest IR version that may carry `opset` (onnx.helper.VERSION_TABLE)."""
    candidates = [ir for _, ir, ai_onnx, *_ in onnx.helper.VERSION_TABLE if ai_onnx >= opset]
    if not candidates:
        raise FuseError(f"opset {opset} is unknown to the installed onnx {onnx.__version__}")
    return min(candidates)


def upgrade_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Convert to `target`. The IR version moves only as far as the new opset requires, so a
    model stays loadable by runtimes that cap the IR version (onnxruntime 1.31: IR <= 13)."""
    current = default_opset(model)
    if target < current:
        raise FuseError(f"--upgrade-opset {target} is older than the model's opset {current}; fuse only upgrades")
    if target == current:
        return model
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises RuntimeError or its own C++ exceptions
        raise FuseError(f"cannot convert the model to opset {target}: {str(exc).splitlines()[0][:200]}") from exc
    converted.ir_version = max(model.ir_version, minimum_ir_version(target))
    # The converter runs onnx's shape inference and stores what it found, over the shapes the model
    # declared too: its placeholders (unk__N for a dim it could not name) would then read as
    # symbols of the model, each grown on its own at the guard's larger setting (an Expand sized
    # [64, 64, 64, 64] for [64, 1, 1, 64]), and hide the dims fuse's own inference proves (a
    # rotary table's sequence length). Keep the shapes the model gave, as it gave them.
    present = {name for node in converted.graph.node for name in node.output}
    del converted.graph.value_info[:]
    converted.graph.value_info.extend(vi for vi in model.graph.value_info if vi.name in present)
    return converted


CONTRIB_DOMAIN_VERSIONS = {"com.microsoft": 1}


def ensure_domain_imports(model: onnx.ModelProto) -> None:
    """Fused operators from onnxruntime's contrib domain need that domain imported, or the model
    does not load; add the imports the rewrites made necessary, and only those."""
    imported = {o.domain for o in model.opset_import}
    used = {n.domain for n in model.graph.node if not is_default_domain(n.domain)}
    for domain in sorted(used - imported):
        if domain in CONTRIB_DOMAIN_VERSIONS:
            model.opset_import.append(onnx.helper.make_opsetid(domain, CONTRIB_DOMAIN_VERSIONS[domain]))
