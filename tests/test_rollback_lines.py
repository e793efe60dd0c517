"""Rolled-back passes are said once per distinct reason, not once per pass and again as FAILED."""

import dataclasses

import onnx

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.passes import REGISTRY
from fuse_cli.report.model import RolledBack, describe_rolled_back
from fuse_cli.report.render import summary_lines
from tests.test_verification_promises import DropsEveryFlatten, flatten_axis_2_model

LOAD_ERROR = "the optimized model fails at batch=3 where the original runs: onnxruntime cannot load it: bad"


def test_passes_rolled_back_for_one_reason_share_one_line():
    same = tuple(RolledBack(f"pass-{i}", None, None, LOAD_ERROR) for i in range(44))
    assert describe_rolled_back(same) == [
        f"44 passes (pass-0, pass-1, pass-2, pass-3 and 40 more) broke the model ({LOAD_ERROR}); "
        "their rewrites were rolled back"]
    mixed = same[:2] + (RolledBack("conv-bn", "y", 0.25),)
    assert describe_rolled_back(mixed) == [
        f"passes pass-0 and pass-1 broke the model ({LOAD_ERROR}); their rewrites were rolled back",
        "pass conv-bn changed output 'y' by up to 0.25; its rewrites were rolled back"]


def test_a_rolled_back_pass_is_one_line_of_the_summary(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, DropsEveryFlatten.name, DropsEveryFlatten())
    path = tmp_path / "m.onnx"
    onnx.save(flatten_axis_2_model(), path)
    report = api.optimize(path, FuseConfig(passes=("eliminate-identity", DropsEveryFlatten.name)),
                          tmp_path / "o.onnx").report
    mentions = [line for line in summary_lines(report) if DropsEveryFlatten.name in line]
    assert len(mentions) == 1 and mentions[0].startswith("FAILED: pass ") and "rolled back" in mentions[0]
    allowed = summary_lines(dataclasses.replace(report, allow_mismatch=True))
    mentions = [line for line in allowed if DropsEveryFlatten.name in line]
    assert len(mentions) == 1 and mentions[0].startswith("Rolled back: pass "), "exit 0, but still said"
