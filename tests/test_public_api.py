"""The Python API as a user calls it: `import fuse_cli`, a ModelProto or a path in, a model and its
report out, nothing written until `save`, one exception type per exit code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import fuse_cli
from fuse_cli.cli import cli
from fuse_cli.graph.weights import reference
from fuse_cli.passes import REGISTRY
from fuse_cli.public import IN_MEMORY
from tests.conftest import SAMPLES, assert_equivalent
from tests.graphs import GraphBuilder, op_counts, signature
from tests.mutations import MUTATIONS

SCHEMA = json.loads((Path(fuse_cli.__file__).parent / "report" / "report.schema.json").read_text())
# what differs between two runs of one model apart from the results: where it was read and
# written, how long steps took (the schedule pass's search time; step timings)
RUN_SPECIFIC = ("model", "output", "written_files", "timings")


def conv_bn(channels: int = 48) -> onnx.ModelProto:
    """Conv + BatchNormalization + Relu with a weight big enough (81 KB) to be held by reference."""
    b = GraphBuilder()
    x = b.input("x", ["batch", channels, 8, 8])
    y = b.op("Conv", x, b.const(b.rand(channels, channels, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", y, *(b.const(b.rand(channels, low=0.5, high=1.5)) for _ in range(4)))
    return b.build(b.op("Relu", y), output_names=["y"])


def with_a_kept_weight(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` plus z = v + kept: a 64 KB weight (held by reference) that no pass rewrites."""
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.full((128, 128), 0.5, np.float32), "kept"))
    model.graph.input.append(onnx.helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [128, 128]))
    model.graph.node.append(onnx.helper.make_node("Add", ["v", "kept"], ["z"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [128, 128]))
    return model


def kept_weight(result: fuse_cli.FuseResult) -> onnx.TensorProto:
    return next(t for t in result.model_by_reference.graph.initializer if t.name == "kept")


def with_external_data(model: onnx.ModelProto, folder: Path, name: str = "model.onnx") -> Path:
    path = folder / name
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.data",
              size_threshold=0)
    return path


def cli_json(*args) -> dict:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code in (0, 1), result.output
    return result


def without_run_specifics(document: dict) -> dict:
    kept = {k: v for k, v in document.items() if k not in RUN_SPECIFIC}
    kept["schedule"] = [{k: v for k, v in entry.items() if k != "seconds"} for entry in document.get("schedule", [])]
    return kept


def test_an_in_memory_proto_is_optimized_without_writing_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = conv_bn()
    before = model.SerializeToString()
    with fuse_cli.optimize(model, dims={"batch": 2}) as result:
        assert op_counts(result.model) == {"Conv": 1, "Relu": 1}
        assert result.verification.status == "match" and result.exit_code == 0 and result.check() is result
        assert result.report.model_path == IN_MEMORY and result.report.output_path is None
        assert result.report.dims == (("batch", 2),)
        assert_equivalent(model, result.model, dims={"batch": 3})
    assert model.SerializeToString() == before, "the caller's proto is left as it was"
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_new_weights_are_referenced_in_the_results_scratch_until_it_closes(tmp_path):
    result = fuse_cli.optimize(conv_bn(), verify=False)
    (folded,) = [t for t in result.model_by_reference.graph.initializer if reference(t) is not None]
    scratch_file = reference(folded)[0]
    assert scratch_file.is_file() and folded.name not in {t.name for t in conv_bn().graph.initializer}
    whole = result.model  # read in before closing: stays whole
    result.close()
    assert not scratch_file.exists() and not scratch_file.parent.parent.exists()
    assert reference(whole.graph.initializer[0]) is None and onnx.checker.check_model(whole) is None
    closed = fuse_cli.optimize(conv_bn(), verify=False)
    closed.close()
    for use in (lambda: closed.model, lambda: closed.save(tmp_path / "out.onnx")):
        with pytest.raises(fuse_cli.InputError, match="the result is closed"):
            use()
    assert list(tmp_path.iterdir()) == []


def test_a_protos_weights_are_referenced_in_its_scratch_copy_not_read_into_memory_again():
    with fuse_cli.optimize(with_a_kept_weight(conv_bn()), verify=False) as result:
        file = reference(kept_weight(result))[0]
        assert file.name == "model.onnx" and file.parent.name.startswith("fuse-")


def test_a_path_with_external_data_keeps_its_weights_where_they_are(tmp_path):
    model = with_a_kept_weight(conv_bn())
    path = with_external_data(model, tmp_path)
    listing = sorted(tmp_path.iterdir())
    with fuse_cli.optimize(path, verify=False) as result:
        assert reference(kept_weight(result))[0] == (tmp_path / "model.onnx.data").resolve(), (
            "referenced where it lives, not copied")
        assert sorted(tmp_path.iterdir()) == listing
        written = result.save(tmp_path / "out.onnx")
    assert written == [tmp_path / "out.onnx", tmp_path / "out.onnx.data"], "external data, as the input had"
    assert_equivalent(onnx.load(path), onnx.load(tmp_path / "out.onnx"), dims={"batch": 2})


def test_base_dir_resolves_a_protos_external_data(tmp_path):
    path = with_external_data(conv_bn(), tmp_path)
    proto = onnx.load(path, load_external_data=False)
    before = proto.SerializeToString()
    with pytest.raises(fuse_cli.InputError, match="base_dir"):
        fuse_cli.optimize(proto)
    from_proto = fuse_cli.optimize(proto, base_dir=tmp_path, dims={"batch": 2})
    from_path = fuse_cli.optimize(path, dims={"batch": 2})
    assert signature(from_proto.model) == signature(from_path.model)
    assert without_run_specifics(from_proto.to_dict()) == without_run_specifics(from_path.to_dict())
    assert proto.SerializeToString() == before
    outside = onnx.load(path, load_external_data=False)
    for entry in outside.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../model.onnx.data"
    with pytest.raises(fuse_cli.InputError, match="not a file inside base_dir"):
        fuse_cli.optimize(outside, base_dir=tmp_path)


def test_a_proto_over_the_inline_limit_goes_through_external_data(tmp_path, monkeypatch):
    # the 2 GB limit, scaled down: the model is written and saved the way a 3 GB one would be
    monkeypatch.setattr("fuse_cli.graph.io.INLINE_SAVE_LIMIT_BYTES", 50_000)
    model = conv_bn()
    with fuse_cli.optimize(model, verify=False) as result:
        written = result.save(tmp_path / "big.onnx")
        assert written == [tmp_path / "big.onnx", tmp_path / "big.onnx.data"]
    assert_equivalent(model, onnx.load(tmp_path / "big.onnx"), dims={"batch": 2})


def test_save_refuses_the_input_and_its_weights(tmp_path):
    path = with_external_data(conv_bn(), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with fuse_cli.optimize(path, verify=False) as result:
        for target in (path, tmp_path / "model.onnx.data"):
            with pytest.raises(fuse_cli.InputError, match="overwrite the input"):
                result.save(target)
        with pytest.raises(fuse_cli.InputError, match="does not exist"):
            result.save(tmp_path / "missing" / "out.onnx")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_save_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"the previous output")
    with fuse_cli.optimize(conv_bn(), verify=False) as result:
        def interrupted(model, model_file):
            Path(model_file).write_bytes(b"half a model")
            raise OSError("disk full")
        monkeypatch.setattr("fuse_cli.graph.save._write_streamed", interrupted)
        with pytest.raises(fuse_cli.InputError, match="disk full"):
            result.save(out)
        assert out.read_bytes() == b"the previous output" and sorted(tmp_path.iterdir()) == [out]
        monkeypatch.undo()
        assert result.save(out) == [out]
    assert sorted(tmp_path.iterdir()) == [out] and op_counts(onnx.load(out))["Conv"] == 1


@pytest.mark.parametrize("call, message", [
    (lambda: fuse_cli.optimize("no/such/model.onnx"), "no such file"),
    (lambda: fuse_cli.optimize(conv_bn(), passes=["conv-bm"]), "did you mean"),
    (lambda: fuse_cli.optimize(conv_bn(), dims={"batch": 0}), "not a positive integer"),
    (lambda: fuse_cli.optimize(conv_bn(), target="tensorrt"), "tensorrt"),
    (lambda: fuse_cli.optimize(42), "expected an onnx.ModelProto or a path"),
    (lambda: fuse_cli.optimize(onnx.ModelProto()), IN_MEMORY),
    (lambda: fuse_cli.audit_model(conv_bn(), input_shapes={"x": "1x48x8x8"}), "sequence of positive integers"),
    (lambda: fuse_cli.compare_models(conv_bn(), "no/such/model.onnx"), "no such file"),
])
def test_bad_input_raises_input_error(call, message):
    with pytest.raises(fuse_cli.InputError, match=message) as caught:
        call()
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    assert os.path.join(tempfile.gettempdir(), "fuse-") not in str(caught.value), "no scratch path in the message"


def test_a_bug_in_fuse_raises_internal_error_with_its_cause(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a node that is not there")
    monkeypatch.setattr("fuse_cli.api.fuse", broken)
    with pytest.raises(fuse_cli.InternalError, match="KeyError") as caught:
        fuse_cli.optimize(conv_bn(), verify=False)
    assert caught.value.exit_code == 3 and isinstance(caught.value.__cause__, KeyError)


def test_a_rolled_back_pass_is_exit_code_1_and_check_raises_check_failed(monkeypatch):
    mutation = next(m for m in MUTATIONS if m.name == "conv-bn-bias-twice")
    mutant = mutation.make_pass()
    monkeypatch.setitem(REGISTRY, mutant.name, mutant)
    result = fuse_cli.optimize(SAMPLES / "cnn_bn_relu.onnx", passes=[mutant.name], allow_peak_growth=True)
    assert result.exit_code == 1 and [r.pass_name for r in result.report.rolled_back] == [mutant.name]
    with pytest.raises(fuse_cli.CheckFailed, match=mutant.name) as caught:
        result.check()
    assert caught.value.exit_code == 1 and caught.value.result is result
    assert result.verification.passed, "the model without the broken pass is still there, verified"


@pytest.mark.parametrize("sample, options, flags", [
    ("cnn_bn_relu.onnx", {"dims": {"batch": 4}}, ["--dim", "batch=4"]),
    ("mlp.onnx", {}, []),
    ("transformer_block_opset14.onnx", {"target": "ort-cpu"}, ["--target", "ort-cpu"]),
    ("transformer_block_opset17.onnx", {"disable": ["layer-norm"]}, ["--disable", "layer-norm"]),
])
def test_results_equal_the_clis(tmp_path, sample, options, flags):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    cli_run = cli_json("optimize", SAMPLES / sample, "-o", out, "--json", report, *flags)
    with fuse_cli.optimize(SAMPLES / sample, **options) as result:
        assert signature(result.model) == signature(onnx.load(out))
        cli_document = json.loads(report.read_text())
        assert without_run_specifics(result.to_dict()) == without_run_specifics(cli_document)
        assert result.exit_code == cli_run.exit_code
        jsonschema.validate(result.to_dict(), SCHEMA)


def test_audit_model_equals_fuse_report(tmp_path):
    sample = SAMPLES / "transformer_block_opset17.onnx"
    cli_json("report", sample, "--json", tmp_path / "report.json")
    with fuse_cli.audit_model(onnx.load(sample)) as audit:
        assert audit.report.dry_run and audit.report.output_path is None
        assert without_run_specifics(audit.to_dict()) == without_run_specifics(
            json.loads((tmp_path / "report.json").read_text()))


def test_compare_models_equals_fuse_verify(tmp_path):
    original = SAMPLES / "cnn_bn_relu.onnx"
    with fuse_cli.optimize(original, verify=False) as result:
        result.save(tmp_path / "fused.onnx")
        comparison = fuse_cli.compare_models(onnx.load(original), result, dims={"batch": 3})
    cli_run = cli_json("verify", original, tmp_path / "fused.onnx", "--dim", "batch=3", "--json", tmp_path / "v.json")
    assert comparison.passed and comparison.exit_code == cli_run.exit_code == 0
    assert comparison.to_dict() == json.loads((tmp_path / "v.json").read_text())
    assert comparison.to_dict()["fuse_version"] == fuse_cli.__version__
    assert comparison.check() is comparison


def test_compare_models_reports_a_mismatch_and_check_raises():
    original = conv_bn()
    changed = onnx.ModelProto()
    changed.CopyFrom(original)
    changed.graph.node[-1].op_type = "Sigmoid"
    comparison = fuse_cli.compare_models(original, changed, dims={"batch": 2})
    assert not comparison.passed and comparison.exit_code == 1
    assert comparison.to_dict()["status"] == "mismatch"
    with pytest.raises(fuse_cli.CheckFailed, match="output 'y' differs"):
        comparison.check()


def test_the_version_is_semantic_and_in_the_json():
    assert fuse_cli.__version__.count(".") == 2 and all(p.isdigit() for p in fuse_cli.__version__.split("."))
    with fuse_cli.audit_model(conv_bn(), verify=False) as audit:
        document = audit.to_dict()
    assert document["fuse_version"] == fuse_cli.__version__ and document["schema_version"] == 2


def test_importing_fuse_cli_does_not_import_onnx():
    # the onnxruntime worker process imports the package: onnx's import alone takes seconds
    code = "import sys, fuse_cli; assert 'onnx' not in sys.modules; print(fuse_cli.optimize.__module__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert run.returncode == 0 and run.stdout.strip() == "fuse_cli.public", run.stderr


def test_the_readmes_python_example_prints_what_the_readme_shows(tmp_path):
    """The README's "Python API" section: its ```python block, run, prints its next ``` block."""
    readme = (Path(fuse_cli.__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    if "## Python API" not in readme:
        pytest.skip("the README has no Python API section")
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    code, shown = re.search(r"```python\n(.*?)```\s*```(?:text)?\n(.*?)```", section, re.S).groups()
    (tmp_path / "sample_models").mkdir()
    shutil.copy(SAMPLES / "cnn_bn_relu.onnx", tmp_path / "sample_models")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == shown
