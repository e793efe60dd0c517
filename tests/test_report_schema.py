"""The JSON report validates against its published schema (a CI job parses it)."""

import json
from pathlib import Path

import jsonschema
import pytest

from fuse_cli import __version__, api
from fuse_cli.config import FuseConfig
from fuse_cli.report.render import memory_lines, render_json
from tests.conftest import SAMPLES

SCHEMA = json.loads((Path(api.__file__).parent / "report" / "report.schema.json").read_text())


@pytest.mark.parametrize("sample, config", [
    ("cnn_bn_relu.onnx", FuseConfig(dims={"batch": 8})),
    ("transformer_block_opset14.onnx", FuseConfig(target="ort-cpu")),
    ("mlp.onnx", FuseConfig(verify=False, fail_on_fusable=True)),
])
def test_reports_validate(tmp_path, sample, config):
    report = api.optimize(SAMPLES / sample, config, tmp_path / "out.onnx").report
    document = json.loads(render_json(report))
    jsonschema.validate(document, SCHEMA)
    assert document["memory"]["peak_bytes"]["before"] > 0 and document["fusions"]
    assert document["fuse_version"] == __version__
    assert document["schema_version"] == SCHEMA["properties"]["schema_version"]["const"]


def test_the_schema_rejects_a_report_missing_a_required_field(tmp_path):
    report = api.optimize(SAMPLES / "mlp.onnx", FuseConfig(verify=False), dry_run=True).report
    document = json.loads(render_json(report))
    del document["memory"]["peak_bytes"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, SCHEMA)


def test_the_schema_names_the_release_that_wrote_a_document():
    report = api.optimize(SAMPLES / "mlp.onnx", FuseConfig(verify=False), dry_run=True).report
    document = json.loads(render_json(report))
    for version in (None, "next"):
        if version is None:
            del document["fuse_version"]
        else:
            document["fuse_version"] = version
        with pytest.raises(jsonschema.ValidationError, match="fuse_version|next"):
            jsonschema.validate(document, SCHEMA)


def test_measured_fields_with_measure():
    # at batch 8192 (11 MB) the activations are mmapped buffers; at 64 they fit in freed heap blocks (0 measured)
    report = api.optimize(SAMPLES / "mlp.onnx", FuseConfig(verify=False, measure=True, dims={"batch": 8192}),
                          dry_run=True).report
    document = json.loads(render_json(report))
    jsonschema.validate(document, SCHEMA)
    measured = document["measured"]
    assert measured["method"] and set(measured["peak_bytes"]) == {"before", "after", "after_input_order"}
    if measured["peak_bytes"]["before"] is None:
        pytest.skip(f"peak not measurable here: {measured['reason']}")
    assert measured["peak_bytes"]["before"] > 0
    # the exact figure (memray is in the test extra) sits within 2% of the estimate here
    allocated = measured["allocated_bytes"]
    assert set(allocated) == {"before", "after", "after_input_order"}
    for side in ("before", "after"):
        estimate = document["memory"]["peak_bytes"][side]
        assert abs(allocated[side] - estimate) <= 0.02 * allocated[side], (side, estimate, allocated[side])
    assert any("allocated" in line for line in memory_lines(report))
