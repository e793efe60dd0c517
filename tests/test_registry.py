"""The registry and pipelines: every pipeline name exists, names are validated, order is explicit."""

import pytest

from fuse_cli.errors import UsageError
from fuse_cli.passes import REGISTRY, TARGETS, pipeline_for, resolve
from fuse_cli.passes import PIPELINES
from fuse_cli.pipeline.base import ALL_TARGETS, GraphPass, ModelPass, PatternPass


@pytest.mark.parametrize("target", TARGETS)
def test_every_pipeline_pass_is_registered(target):
    missing = [name for name in PIPELINES[target] if name not in REGISTRY]
    assert not missing, f"the {target} pipeline names passes that do not exist: {missing}"


def test_every_registered_pass_is_in_a_pipeline():
    in_pipelines = {name for pipeline in PIPELINES.values() for name in pipeline}
    assert set(REGISTRY) <= in_pipelines


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_pass_declares_itself(name):
    p = REGISTRY[name]
    assert p.name == name and name == name.lower() and " " not in name
    assert p.description and len(p.description.splitlines()) == 1
    assert p.targets and p.targets <= ALL_TARGETS
    assert p.min_opset >= 1
    assert p.explanation.strip() != p.description.strip(), "docstring with the math and picture expected"
    assert isinstance(p, (PatternPass, GraphPass, ModelPass))


def test_onnx_target_emits_only_standard_passes():
    assert set(pipeline_for("onnx")) <= {n for n, p in REGISTRY.items() if "onnx" in p.targets}


def test_resolve_keeps_pipeline_order_whatever_the_order_given():
    names = [p.name for p in resolve("onnx", ["matmul-add", "fold-constants", "conv-bn"])]
    assert names == ["fold-constants", "conv-bn", "matmul-add"]


def test_disable_removes_a_pass():
    names = [p.name for p in resolve("onnx", None, ["conv-bn"])]
    assert "conv-bn" not in names and "fold-constants" in names


@pytest.mark.parametrize("typo, suggestion", [("conv_bn", "conv-bn"), ("matmul-ad", "matmul-add")])
def test_unknown_pass_is_a_usage_error_with_a_suggestion(typo, suggestion):
    with pytest.raises(UsageError, match=f"unknown pass '{typo}'; did you mean '{suggestion}'"):
        resolve("onnx", [typo])
    with pytest.raises(UsageError, match="did you mean"):
        resolve("onnx", None, [typo])


def test_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown target 'onx'.*did you mean 'onnx'"):
        resolve("onx")
    assert set(TARGETS) == ALL_TARGETS


def test_pattern_passes_declare_their_requirements_instead_of_overriding_matches():
    """One way to decline (issue 33): a near-miss from `check`, and conditions a pattern cannot
    state declared as `requires`, which `fuse passes --explain` lists; no pass hides its own."""
    from fuse_cli.pipeline.base import PatternPass

    overriding = [name for name, p in REGISTRY.items()
                  if isinstance(p, PatternPass) and type(p).matches is not PatternPass.matches]
    assert not overriding
    declared = [name for name, p in REGISTRY.items() if getattr(p, "requires", ())]
    assert len(declared) >= 18 and all(r.says and callable(r.holds) for name in declared
                                       for r in REGISTRY[name].requires)
