"""benchmarks/llm_bench.py's tables from made-up rows: no model is run and no timing is asserted."""

from __future__ import annotations

from tests.conftest import benchmark_script

llm_bench = benchmark_script("llm_bench")


def row(fuse_all: float, anchor_all: float, anchor_peak: int) -> "llm_bench.ModelRow":
    tools = [llm_bench.ToolRow("original", nodes=100, attentions=0, latency_ms={"disabled": 1.0, "all": 1.0},
                               peak_bytes=8 << 20, session_ms=20.0)]
    for name, ratio, peak, attn in (("fuse", fuse_all, 6 << 20, 2), ("onnxscript", anchor_all, anchor_peak, 2),
                                    ("ort-transformers", 1.0, 8 << 20, 0), ("ort-extended", 1.0, 8 << 20, 0)):
        tools.append(llm_bench.ToolRow(name, nodes=50, attentions=attn, max_abs_diff=1e-6,
                                       latency_ratio={"disabled": 0.9, "all": ratio}, peak_bytes=peak, session_ms=10.0))
    return llm_bench.ModelRow("llama-prefill", {"batch": 1, "sequence": 128}, {"disabled": 1.01, "all": 0.98}, tools)


def test_an_anchor_ahead_beyond_the_noise_is_listed():
    text = llm_bench.markdown([row(fuse_all=0.9, anchor_all=0.8, anchor_peak=4 << 20)], quick=True)
    assert "- llama-prefill, all: onnxscript 0.80 vs fuse 0.90 (noise 0.02)" in text
    assert "- llama-prefill, peak: onnxscript 4.00 MiB vs fuse 6.00 MiB" in text
    assert "| fuse | 1 | 0.900 | 0.900 |" in text


def test_within_the_noise_nothing_is_listed():
    text = llm_bench.markdown([row(fuse_all=0.9, anchor_all=0.89, anchor_peak=6 << 20)], quick=True)
    assert text.rstrip().endswith("None.")


def test_fuse_onnx23_is_a_row_of_its_own_never_an_anchor():
    model = row(fuse_all=0.9, anchor_all=0.9, anchor_peak=6 << 20)
    model.tools.append(llm_bench.ToolRow("fuse-onnx23", nodes=40, attentions=2, max_abs_diff=1e-6,
                                         latency_ratio={"disabled": 0.5, "all": 0.5}, peak_bytes=2 << 20))
    text = llm_bench.markdown([model], quick=True)
    assert "| fuse-onnx23 | 1 | 0.500 | 0.500 |" in text
    assert text.rstrip().endswith("None.")


def test_runs_side_by_side_render_as_one_table(tmp_path):
    import dataclasses
    import json
    first, second = row(0.9, 0.8, 4 << 20), row(0.9, 0.9, 6 << 20)
    second.name = "qwen-prefill"
    for name, r in (("a", first), ("b", second)):
        (tmp_path / f"{name}.json").write_text(json.dumps([dataclasses.asdict(r)]))
    rows = llm_bench.rows_from_json(tmp_path / "a.json") + llm_bench.rows_from_json(tmp_path / "b.json")
    assert rows == [first, second]
    assert "| fuse | 2 | 0.900 | 0.900 |" in llm_bench.markdown(rows, quick=False)
