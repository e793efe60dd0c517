"""scripts/gpu_check.py (`make gpu-check`), its models (gpu_models.py) and its packing of
onnxruntime-gpu (pack_cuda_runtime.py): what can be checked without a GPU."""

import struct
import subprocess
import sys
import tarfile
import zipfile
from datetime import datetime, timezone
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gpu_check  # noqa: E402
import gpu_models  # noqa: E402
import pack_cuda_runtime  # noqa: E402

TINY = {
    "cnn": partial(gpu_models.build_cnn, width=4, image=32, classes=10),
    "bert": partial(gpu_models.build_bert, layers=1, hidden=32, heads=2, vocab=50, positions=16),
    "vit": partial(gpu_models.build_vit, layers=1, hidden=32, heads=2, patch=8, image=16, classes=10),
    "llm-prefill": partial(gpu_models.build_llm, layers=1, hidden=32, heads=2, ffn=48, vocab=50, positions=16),
    "llm-decode": partial(gpu_models.build_llm, with_past=True, layers=1, hidden=32, heads=2, ffn=48, vocab=50,
                          positions=16),
}
TINY_DIMS = {"batch": 2, "sequence": 5, "past_sequence": 4, "total_sequence": 9}


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu.md"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if "not run" not in result.stdout:
        pytest.skip("onnxruntime's CUDA provider loads here: the no-CUDA path is not this machine's")
    assert result.stdout.count("\n") == 1 and result.stdout.startswith("gpu-check: not run: ")
    assert not out.exists()


def _fake_rows() -> list:
    measured = gpu_check.Row("bert", "float16", "batch=8, sequence=128",
                             contrib_ops="Attention, SkipLayerNormalization",
                             nodes_before=149, nodes_after=61, fused_diff=3e-3, original_diff=2e-3, verified=True,
                             original_ms=2.0, fused_ms=1.5, measured_before=96 * 2**20, measured_after=64 * 2**20,
                             estimate_before=90 * 2**20, estimate_after=60 * 2**20)
    slower = gpu_check.Row("cnn", "float32", "batch=8", nodes_before=70, nodes_after=49, fused_diff=1e-2,
                           original_diff=1e-6, verified=False, original_ms=1.0, fused_ms=1.25, note="a | b")
    skipped = gpu_check.Row("vit", "float32", "", note="not run: 12 s of the budget left")
    return [measured, slower, skipped]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_report_renders_every_column_for_every_row():
    rows = _fake_rows()
    text = gpu_check.render(rows, "NVIDIA H100, driver 580", 312.0, datetime(2026, 12, 6, tzinfo=timezone.utc),
                            floor_bytes=5 * 2**20)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert _cells(table[0]) == list(gpu_check.COLUMNS)
    body = [dict(zip(gpu_check.COLUMNS, _cells(line))) for line in table[2:]]
    assert len(body) == len(rows) and all(len(_cells(line)) == len(gpu_check.COLUMNS) for line in table[2:])
    bert, cnn, vit = body
    assert bert["fused / original"] == f"{rows[0].fused_ms / rows[0].original_ms:.2f}"
    assert bert["measured MiB before / after"] == "96.0 / 64.0"
    assert bert["estimate / measured after"] == f"{rows[0].estimate_after / rows[0].measured_after:.2f}"
    assert bert["verified"] == "yes" and cnn["verified"] == "NO" and vit["verified"] == "n/a"
    assert cnn["measured MiB before / after"] == "n/a" and cnn["note"] == "a / b"  # a | would split the cell
    assert vit["ms fused"] == "n/a" and vit["note"].startswith("not run")
    assert "Device: NVIDIA H100, driver 580" in text and "2026-12-06" in text
    assert "A one-MatMul model adds 5.0 MiB" in text
    assert "NOT verified: cnn float32" in text and "slower than the original on CUDA: cnn float32." in text


def _feeds(session, dims: dict, vocab: int = 50, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        shape = [dims[d] if isinstance(d, str) else d for d in i.shape]
        if i.type == "tensor(int64)":
            feeds[i.name] = rng.integers(0, 2 if "mask" in i.name else vocab if "ids" in i.name else 1, shape)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float16 if "float16" in i.type else np.float32)
    if "position_ids" in feeds:
        start = dims.get("past_sequence", 0) if "past_key.0" in feeds else 0
        positions = np.arange(start, start + dims["sequence"])
        feeds["position_ids"] = np.broadcast_to(positions, feeds["input_ids"].shape).copy()
    return feeds


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(TINY))
def test_each_model_is_valid_onnx_and_runs_with_the_declared_output_shapes(name, dtype):
    model = TINY[name](dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = session.run(None, _feeds(session, TINY_DIMS))
    for declared, value in zip(session.get_outputs(), outputs):
        assert list(value.shape) == [TINY_DIMS[d] if isinstance(d, str) else d for d in declared.shape], declared.name
        assert value.dtype == np.dtype(dtype) and np.isfinite(value).all(), declared.name


def test_decode_step_with_the_prefill_cache_gives_the_full_prefill_last_logits():
    """Rotary positions, the KV cache and the causal slice of the decode graph agree with a prefill
    over all tokens: what makes the LLM pair one model at two steps."""
    prefill = ort.InferenceSession(TINY["llm-prefill"]().SerializeToString(), providers=["CPUExecutionProvider"])
    decode = ort.InferenceSession(TINY["llm-decode"]().SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = np.random.default_rng(3).integers(0, 50, (2, 7))
    names = [o.name for o in prefill.get_outputs()]

    def run_prefill(ids):
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        return dict(zip(names, prefill.run(None, {"input_ids": ids, "position_ids": positions})))

    full, head = run_prefill(tokens), run_prefill(tokens[:, :-1])
    step = decode.run(["logits"], {"input_ids": tokens[:, -1:], "position_ids": np.full((2, 1), 6),
                                   "past_key.0": head["present_key.0"], "past_value.0": head["present_value.0"]})[0]
    np.testing.assert_allclose(step[:, 0], full["logits"][:, -1], rtol=1e-4, atol=1e-5)


def test_subset_is_the_issue_list_in_both_dtypes():
    names = {(c.name, c.dtype) for c in gpu_models.SUBSET}
    assert names == {(n, d) for n in TINY for d in ("float32", "float16")}


def _fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """One fatbin container: (arch, payload) entries with 64-byte headers, then 8 bytes of padding."""
    body = b""
    for arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload))
        struct.pack_into("<I", header, pack_cuda_runtime.ENTRY_ARCH_OFFSET, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", pack_cuda_runtime.FATBIN_MAGIC, 1, 16, len(body)) + body + bytes(8)


def test_keep_only_arch_zeroes_the_other_architectures_code_and_nothing_else():
    section = _fatbin([(80, b"A" * 24), (90, b"B" * 16)]) + _fatbin([(120, b"C" * 8), (90, b"D" * 32)])
    data = bytearray(b"head" + section + b"tail")
    zeroed = pack_cuda_runtime.keep_only_arch(data, 4, len(section), frozenset({90}))
    assert zeroed == {80: 24, 120: 8}
    assert len(data) == len(section) + 8 and data.startswith(b"head") and data.endswith(b"tail")
    assert b"A" not in data and b"C" not in data
    assert b"B" * 16 in data and b"D" * 32 in data


def _elf_with_section(name: bytes, content: bytes) -> bytes:
    """A minimal 64-bit little-endian ELF file: the content, a section-name table, and section
    headers for the null section, `name` and the name table."""
    names = b"\0" + name + b"\0.shstrtab\0"
    content_at, names_at = 64, 64 + len(content)
    headers_at = names_at + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, headers_at)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)

    def section(name_at: int, offset: int, size: int) -> bytes:
        entry = bytearray(64)
        struct.pack_into("<I", entry, 0, name_at)
        struct.pack_into("<QQ", entry, 0x18, offset, size)
        return bytes(entry)

    return (bytes(header) + content + names + section(0, 0, 0) + section(1, content_at, len(content))
            + section(len(name) + 2, names_at, len(names)))


def test_pack_keeps_sm90_code_and_leaves_out_what_fuse_never_loads(tmp_path):
    fatbin = _fatbin([(86, b"x" * 40), (90, b"y" * 40)])
    wheel = tmp_path / "onnxruntime_gpu.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(pack_cuda_runtime.CUDA_PROVIDER, _elf_with_section(b".nv_fatbin", fatbin))
        z.writestr("onnxruntime/__init__.py", "version = 1\n")
        z.writestr("onnxruntime/capi/libonnxruntime.so.1.31.1", b"c api")
        z.writestr("onnxruntime/transformers/optimizer.py", "")
    out = tmp_path / "packed.tar.xz"
    assert pack_cuda_runtime.pack(wheel, out, frozenset({90})) == {86: 40}
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == sorted([pack_cuda_runtime.CUDA_PROVIDER, "onnxruntime/__init__.py"])
        provider = tar.extractfile(pack_cuda_runtime.CUDA_PROVIDER).read()
        assert tar.getmember(pack_cuda_runtime.CUDA_PROVIDER).mode & 0o111  # a library the loader maps
    assert b"y" * 40 in provider and b"x" not in provider


def test_pack_refuses_a_provider_without_gpu_code(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(pack_cuda_runtime.CUDA_PROVIDER, _elf_with_section(b".text", b"\x90" * 8))
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "pack_cuda_runtime.py"), str(wheel),
                             str(tmp_path / "o.tar.xz")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no .nv_fatbin" in result.stderr


def test_each_case_is_fused_verified_timed_and_written_with_the_cpu_standing_in_for_cuda(tmp_path, monkeypatch):
    """The glue between fuse, the runs and the table, run where there is no GPU: the CPU provider
    in CUDA's place, device memory reported as not measured."""
    monkeypatch.setattr(gpu_check, "CUDA", ["CPUExecutionProvider"])
    monkeypatch.setattr(gpu_check, "device_run", lambda session, feeds: lambda: session.run(None, feeds))
    monkeypatch.setattr(gpu_check, "measured_growth", lambda feeds, *paths: [None] * len(paths))
    cases = [gpu_models.Case("bert", TINY["bert"], {"batch": 2, "sequence": 8},
                             {"input_ids": (0, 50), "attention_mask": (0, 2)}),
             gpu_models.Case("llm-decode", TINY["llm-decode"], {"batch": 1, "sequence": 1, "past_sequence": 7,
                                                                "total_sequence": 8},
                             {"input_ids": (0, 50), "position_ids": (7, 8)}, "float16")]
    out = tmp_path / "gpu.md"
    rows = gpu_check.run_subset(cases, budget_s=600, out=out)
    assert [(r.model, r.dtype) for r in rows] == [("bert", "float32"), ("llm-decode", "float16")]
    for row in rows:
        assert row.verified, row
        assert row.nodes_after < row.nodes_before and row.contrib_ops
        assert row.original_ms > 0 and row.fused_ms > 0
        assert row.estimate_before > 0 and row.estimate_after > 0 and row.measured_after is None
    text = out.read_text()
    assert "| bert | float32 | batch=2, sequence=8 |" in text and "| llm-decode | float16 |" in text


def test_no_case_starts_without_the_time_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "run_case", lambda case, scratch: pytest.fail("a case started"))
    rows = gpu_check.run_subset(list(gpu_models.SUBSET[:2]), budget_s=gpu_check.CASE_SECONDS - 1,
                                out=tmp_path / "gpu.md")
    assert [r.note.startswith("not run:") for r in rows] == [True, True]
    assert (tmp_path / "gpu.md").read_text().count("not run:") == 2


def test_an_unknown_model_name_is_a_one_line_usage_error():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--only", "cnn,gpt9"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr == "gpu-check: no model named gpt9 (--only)\n"


def test_device_memory_not_measurable_is_none_per_model_with_the_reason_on_stderr(tmp_path, capsys):
    model, feeds = gpu_check.one_matmul(tmp_path)
    if gpu_check.cuda_loads()[0]:
        pytest.skip("CUDA loads here: the figures are measured")
    assert gpu_check.measured_growth(feeds, model, model) == [None, None]
    err = capsys.readouterr().err
    assert err.startswith("gpu-check: device memory of one_matmul.onnx, one_matmul.onnx not measured: ")
    assert err.count("\n") == 1
