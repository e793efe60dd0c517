"""The SVG timeline and the HTML page: well-formed, complete, and escaped."""

from __future__ import annotations

import dataclasses
import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from fuse_cli import api
from fuse_cli.analysis.memory import LiveTensor
from fuse_cli.config import FuseConfig
from fuse_cli.errors import UsageError
from fuse_cli.report.html import render_html, write_html
from fuse_cli.pipeline.records import NearMiss
from fuse_cli.report.model import Report
from fuse_cli.report.plot import render_timeline_svg, write_plot
from fuse_cli.report.render import human_bytes, savings_rows
from tests.conftest import SAMPLES

SVG = "{http://www.w3.org/2000/svg}"
NASTY = 'x<b>&amp;"&'  # must come back as written: no tag, no double decoding


@pytest.fixture(scope="module", params=[("cnn_bn_relu.onnx", {"batch": 8}), ("transformer_block_opset14.onnx", {})],
                ids=["cnn", "transformer"])
def report(request) -> Report:
    name, dims = request.param
    return api.optimize(SAMPLES / name, FuseConfig(dims=dims), dry_run=True).report


@pytest.fixture(scope="module")
def nasty_report() -> Report:
    """The CNN report with tensor, node and model names that must be escaped everywhere."""
    base = api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(dims={"batch": 8}), dry_run=True).report
    after = dataclasses.replace(base.memory.after, peak_node=f"node {NASTY}",
                                live_at_peak=(LiveTensor(f"t {NASTY}", 64, f"producer {NASTY}"),))
    miss = NearMiss("conv-bn", f"pattern {NASTY}", (f"bn {NASTY}",), f"its scale {NASTY} is a graph input")
    return dataclasses.replace(base, model_path=f"dir/{NASTY}.onnx", near_misses=(miss,),
                               memory=dataclasses.replace(base.memory, after=after))


def svg_texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{SVG}text")]


def test_svg_is_xml_with_two_lines_and_both_peaks(report):
    svg = render_timeline_svg(report)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert len(root.findall(f"{SVG}polyline")) == 2
    texts = svg_texts(svg)
    for profile in (report.memory.before, report.memory.after):
        assert f"peak {human_bytes(profile.peak_bytes)} at {profile.peak_node}" in texts
    assert any("normalized 0 to 1" in t for t in texts)
    assert any(f"{k}={v}" in texts[0] for k, v in report.dims)


def test_both_step_lines_span_the_same_normalized_axis(report):
    lines = ET.fromstring(render_timeline_svg(report, width=500, height=300)).findall(f"{SVG}polyline")
    spans = []
    for line, profile in zip(lines, (report.memory.before, report.memory.after)):
        points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
        assert len(points) == 2 * len(profile.timeline)  # two corners per step
        xs = [x for x, _ in points]
        assert xs == sorted(xs)
        assert min(y for _, y in points) == points[2 * profile.peak_step][1]  # highest corner = peak step
        spans.append((xs[0], xs[-1]))
    assert spans[0] == spans[1]


def test_html_holds_every_row_line_and_near_miss(report):
    page = render_html(report)
    text = parse_html(page)
    for row in savings_rows(report):
        assert row[0] in text
    for miss in report.near_misses:
        assert miss.reason in text and miss.pattern in text
    assert "<svg" in page
    assert not re.search(r"<script|<link|src=|href=|url\(", page)  # self-contained
    for op in report.memory.before.by_op_type:
        assert op in text


def test_html_escapes_names(nasty_report):
    page = render_html(nasty_report)
    text = parse_html(page)
    assert "<b>" not in page
    for expected in (f"t {NASTY}", f"producer {NASTY}", f"its scale {NASTY} is a graph input", f"bn {NASTY}",
                     f"pattern {NASTY}", f"node {NASTY}"):
        assert expected in text


def test_html_prints_each_note_once(nasty_report):
    """The run-level note (onnxruntime's default level) once, with the summary, not again after it."""
    note = "run this model in onnxruntime with graph optimizations at basic or disabled"
    page = render_html(dataclasses.replace(nasty_report, notes=(note,)))
    assert page.count(note) == 1


def test_svg_escapes_names(nasty_report):
    texts = svg_texts(render_timeline_svg(nasty_report))
    assert f"peak {human_bytes(nasty_report.memory.after.peak_bytes)} at node {NASTY}" in texts
    assert NASTY in texts[0]


def test_report_without_memory_audit_still_renders(nasty_report):
    bare = dataclasses.replace(nasty_report, memory=None)
    assert "no memory audit" in " ".join(svg_texts(render_timeline_svg(bare)))
    assert "<svg" not in render_html(bare)
    parse_html(render_html(bare))


def test_write_files(report, tmp_path):
    write_plot(report, tmp_path / "timeline.svg")
    write_html(report, tmp_path / "report.html")
    ET.parse(tmp_path / "timeline.svg")
    assert parse_html((tmp_path / "report.html").read_text(encoding="utf-8"))


def test_png_without_matplotlib_is_a_usage_error(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(UsageError, match="PNG needs matplotlib"):
        write_plot(report, tmp_path / "timeline.png")
    assert not (tmp_path / "timeline.png").exists()


def test_png_with_matplotlib(report, tmp_path):
    pytest.importorskip("matplotlib")
    write_plot(report, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")


def test_png_takes_dollar_signs_as_text(nasty_report, tmp_path):
    pytest.importorskip("matplotlib")
    write_plot(dataclasses.replace(nasty_report, model_path=r"cost$\frac{$.onnx"), tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size


VOID = {"meta", "br", "hr", "img", "link"}  # HTML elements without an end tag


def parse_html(page: str) -> str:
    """The page's text with entities decoded; fails on unbalanced tags."""

    class Checker(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.open: list[str] = []
            self.text: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag not in VOID:
                self.open.append(tag)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            assert self.open and self.open.pop() == tag, f"unbalanced </{tag}>"

        def handle_data(self, data):
            self.text.append(data)

    checker = Checker()
    checker.feed(page)
    checker.close()
    assert not checker.open, checker.open
    assert page.startswith("<!DOCTYPE html>")
    return "".join(checker.text)
