"""The summary's upgrade line: how many fusions wait for an opset upgrade, and which unlocks them."""

from __future__ import annotations

import dataclasses


from fuse_cli.pipeline.records import NearMiss
from fuse_cli.report.upgrade_hint import upgrade_hint_lines
from tests.conftest import optimize_model
from tests.test_pass_layer_norm import decomposed_layer_norm


def _miss(pattern: str, reason: str) -> NearMiss:
    return NearMiss("p", pattern, ("n",), reason)


def _engine_reason(needed: int, has: int) -> str:
    return (f"the fused operator needs opset {needed}, the model has opset {has}: "
            f"pass --upgrade-opset {needed} to convert the model first")


def test_one_line_names_the_opset_that_unlocks_all(tmp_path):
    report = optimize_model(decomposed_layer_norm(opset=14), tmp_path, passes=("layer-norm",)).report
    misses = (_miss("LayerNorm", _engine_reason(17, 14)), _miss("LayerNorm", _engine_reason(17, 14)),
              _miss("Gelu", _engine_reason(20, 14)), _miss("Conv + BN", "bn's scale is a graph input"))
    (line,) = upgrade_hint_lines(dataclasses.replace(report, near_misses=misses))
    assert line == "3 fusion(s) wait for a newer opset (2 x LayerNorm, 1 x Gelu): --upgrade-opset 20 unlocks all 3"


def test_real_run_and_no_line_without_such_misses(tmp_path):
    report = optimize_model(decomposed_layer_norm(opset=14), tmp_path, passes=("layer-norm",)).report
    (line,) = upgrade_hint_lines(report)
    assert "--upgrade-opset 17 unlocks it" in line
    assert upgrade_hint_lines(dataclasses.replace(report, near_misses=())) == []
