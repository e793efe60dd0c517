"""Hostile input (issue 31): each attack builds its file here, runs the CLI in a child process under
an address-space cap and a timeout, and asserts the exit code, the one-line message, and that
nothing outside the test's folder was written (the test's own home, temp and working folders are
inside it; the folders around it and the repository are compared before and after)."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.conftest import REPO, SAMPLES

# A normal run of a small model reserves ~600 MB of address space (onnxruntime's thread pools and
# glibc's arenas); 4 GiB leaves room for that and stops any attack that allocates gigabytes.
ADDRESS_SPACE_CAP = 4 * 2**30
TIMEOUT_S = 120
vi = h.make_tensor_value_info


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def _listing(folder: Path, skip: Path | None = None) -> dict[str, tuple[int, int]]:
    return {p.name: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in folder.iterdir() if p != skip}


def _names(folder: Path) -> set[str]:
    """What a run could add to a source folder (an engineer may edit files meanwhile; Python
    writes its bytecode caches)."""
    return {p.name for p in folder.iterdir() if p.name != "__pycache__"}


class Sandbox:
    """A test folder with the run's home, temp and working folders inside it."""

    def __init__(self, root: Path):
        self.root = root
        for name in ("home", "tmp", "work"):
            (root / name).mkdir()
        self.work = root / "work"

    def model(self, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
        path = self.work / name
        onnx.save(model, path)
        return path

    def start(self, *args: str | Path) -> subprocess.Popen:
        env = {**os.environ, "HOME": str(self.root / "home"), "TMPDIR": str(self.root / "tmp"), "COLUMNS": "120",
               "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.Popen([sys.executable, "-m", "fuse_cli", *map(str, args)], cwd=self.work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_cap_memory)

    def run(self, *args: str | Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        sources = (REPO, REPO / "fuse_cli", REPO / "tests", SAMPLES)
        before = _listing(self.root.parent, self.root), [_names(folder) for folder in sources]
        process = self.start(*args)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        after = _listing(self.root.parent, self.root), [_names(folder) for folder in sources]
        assert after == before, "wrote outside its folder"
        assert "Traceback" not in err, err
        return subprocess.CompletedProcess(args, process.returncode, out, err)


@pytest.fixture
def box(tmp_path) -> Sandbox:
    return Sandbox(tmp_path)


def refused(done: subprocess.CompletedProcess, words: str) -> None:
    """Exit 2 and exactly one line on stderr, saying `words`."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("fuse: error: ") and words in lines[0], done.stderr


def model_of(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=9)


def const(name: str, values, dtype=np.int64) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(values, dtype), name))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- item 2: limits before allocation ------------------------------------------------------------

def computed_constant_of_shape(log2: int, dtype=T.FLOAT) -> onnx.ModelProto:
    """~180 bytes: ConstantOfShape of a shape computed as 2**a * 2**b, read by an Add."""
    half = log2 // 2
    value = h.make_tensor("v", dtype, [1], [1])
    nodes = [const("a", [2**half]), const("b", [2**(log2 - half)]), h.make_node("Mul", ["a", "b"], ["s"]),
             h.make_node("ConstantOfShape", ["s"], ["c"], value=value), h.make_node("Add", ["x", "c"], ["y"])]
    return model_of(nodes, [vi("x", dtype, [1])], [vi("y", dtype, None)])


@pytest.mark.parametrize("dtype", [T.FLOAT, T.INT64], ids=["float-onnx-data-propagation", "int64-symbolic-inference"])
def test_a_tiny_model_with_a_computed_huge_constant_of_shape(box, dtype):
    path = box.model(computed_constant_of_shape(28, dtype))
    assert path.stat().st_size < 250
    started = time.monotonic()
    done = box.run("report", path, "--no-verify")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60


def test_a_declared_long_vector_into_data_propagation(box):
    """onnx's data propagation held a 1-D input of 2**22 elements as 2**22 protobuf dims (665 MB)."""
    nodes = [h.make_node("Add", ["x", "z"], ["y"])]
    path = box.model(model_of(nodes, [vi("x", T.INT64, [1]), vi("z", T.INT64, [2**24])], [vi("y", T.INT64, None)]))
    done = box.run("report", path, "--no-verify")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("builder", [
    lambda: [const("s", [2**28]), h.make_node("ConstantOfShape", ["s"], ["c"]), h.make_node("Add", ["x", "c"], ["y"])],
    lambda: [const("lo", 0.0, np.float32), const("hi", 2.0**28, np.float32), const("d", 1.0, np.float32),
             h.make_node("Range", ["lo", "hi", "d"], ["c"]), h.make_node("Add", ["x", "c"], ["y"])],
    lambda: [const("k", [1.0], np.float32), const("s", [2**28]), h.make_node("Expand", ["k", "s"], ["c"]),
             h.make_node("Add", ["x", "c"], ["y"])],
    lambda: [const("k", [1.0], np.float32), const("r", [2**28]), h.make_node("Tile", ["k", "r"], ["c"]),
             h.make_node("Add", ["x", "c"], ["y"])],
], ids=["constant-of-shape", "range", "expand", "tile"])
def test_fold_limit_is_judged_before_computing(box, builder):
    """A 1 GB constant a node would compute stays a node at --fold-limit 1, and is never computed."""
    path = box.model(model_of(builder(), [vi("x", T.FLOAT, [1])], [vi("y", T.FLOAT, None)]))
    out = box.work / "out.onnx"
    done = box.run("optimize", path, "-o", out, "--fold-limit", "1", "--no-verify")
    assert done.returncode == 0, done.stderr
    written = onnx.load(out)
    assert sum(t.ByteSize() for t in written.graph.initializer) < 2**20
    assert {"ConstantOfShape", "Range", "Expand", "Tile"} & {n.op_type for n in written.graph.node}


def test_max_memory_stops_the_run_with_exit_2(box):
    """Verification runs the model, whose tensor is 1 GB: the cap stops it with one line."""
    path = box.model(computed_constant_of_shape(28))
    refused(box.run("report", path, "--max-memory", "600"), "memory use reached --max-memory (600 MB)")


# ---- item 4: names are data in every renderer -----------------------------------------------------

HOSTILE_NAMES = {
    "markup-close": "[/]",
    "hyperlink": "[link=file:///etc/passwd]click[/link]",
    "escape-sequence": "\x1b[31mred\x1b]8;;file:///etc/passwd\x07",
    "newline-heading": "a\n## Verified: safe to merge\n",
    "control-characters": "nul\x00bell\x07\x0bvt",
    "html": "<script>alert(1)</script>&amp;",
    "bidi-override": "abc\u202efdp.exe",
    "markdown-table": "a | b ` * _",
}


def named_model(name: str) -> onnx.ModelProto:
    """Every node and tensor name is hostile; an Identity and a Dropout for passes to report."""
    nodes = [h.make_node("Identity", ["x"], [f"{name}_t"], name=f"{name}_id"),
             h.make_node("Relu", [f"{name}_t"], [f"{name}_y"], name=name)]
    return model_of(nodes, [vi("x", T.FLOAT, [2, 3])], [vi(f"{name}_y", T.FLOAT, [2, 3])])


def assert_inert(text: str, name: str) -> None:
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text
    assert "\n## Verified" not in text


@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES.keys())
def test_hostile_names_in_every_renderer(box, name):
    path = box.model(named_model(name))
    outputs = {kind: box.work / f"r.{kind}" for kind in ("json", "html", "svg", "md")}
    done = box.run("optimize", path, "-o", box.work / "out.onnx", "--json", outputs["json"],
                   "--html", outputs["html"], "--plot", outputs["svg"], "--markdown", outputs["md"])
    assert done.returncode == 0, done.stderr
    assert_inert(done.stdout + done.stderr, name)
    report = json.loads(outputs["json"].read_text())
    assert f"{name}_y" in [t["name"] for t in report["memory"]["before"]["largest"]]  # JSON keeps the name
    ElementTree.fromstring(outputs["svg"].read_text())  # parses: no control character left in it
    html = outputs["html"].read_text()
    assert "<script>" not in html and "\x00" not in html
    markdown = outputs["md"].read_text()
    assert_inert(markdown, name)
    assert "<script>" not in markdown
    assert all(line.count("|") - line.count("\\|") in (4, 8) for line in markdown.splitlines() if line.startswith("|"))


def test_a_hostile_model_file_name_and_a_dry_run(box):
    path = box.model(named_model("[/]"), name="[link=x]\x1b[2J[red].onnx")
    done = box.run("report", path, "--markdown", "-")
    assert done.returncode == 0, done.stderr
    assert_inert(done.stdout + done.stderr, "")
    assert "[link=x]\\x1b[2J[red].onnx" in done.stderr  # the name, shown as text by rich
    assert "\\[link=x\\]" in done.stdout  # and escaped in Markdown


def test_hostile_names_in_a_batch(box):
    models = box.work / "models"
    models.mkdir()
    for i, name in enumerate(("[/]", "[link=x]y")):
        onnx.save(named_model(name), models / f"{i}.onnx")
    done = box.run("report", models, "--json", box.work / "batch.json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads((box.work / "batch.json").read_text())["models"]) == 2
    assert "2 of 2 models ok" in done.stdout


def test_hostile_output_names_in_verify(box):
    path = box.model(named_model("[/]\x1b[1m"))
    done = box.run("verify", path, path)
    assert done.returncode == 0, done.stderr
    assert_inert(done.stdout, "")


def test_a_one_line_error_with_a_hostile_name(box):
    nodes = [h.make_node("Relu", ["nobody\n[/]\x1b"], ["y"])]
    path = box.model(model_of(nodes, [vi("x", T.FLOAT, [1])], [vi("y", T.FLOAT, [1])]))
    done = box.run("optimize", path)
    refused(done, "nothing produces")
    assert "\x1b" not in done.stderr


# ---- item 5: a dead worker ------------------------------------------------------------------------

def slow_model() -> onnx.ModelProto:
    value = h.make_tensor("v", T.FLOAT, [1], [0.5])
    nodes = [const("s", [2**24]), h.make_node("ConstantOfShape", ["s"], ["z"], value=value)]
    for i in range(12):
        nodes.append(h.make_node("Sin", [nodes[-1].output[0]], [f"t{i}"]))
    nodes.append(h.make_node("Add", ["x", "t11"], ["y"]))
    return model_of(nodes, [vi("x", T.FLOAT, [1])], [vi("y", T.FLOAT, [2**24])])


def _workers(parent: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"spawn_main" in command:
            found.append(int(pid))
    return found


def test_a_batch_survives_a_killed_worker(box):
    models = box.work / "models"
    models.mkdir()
    shutil_copy(SAMPLES / "mlp.onnx", models / "a.onnx")
    onnx.save(slow_model(), models / "b_slow.onnx")
    out = box.work / "out"
    out.mkdir()
    process = box.start("optimize", models, "--out-dir", out, "-j", "2", "--json", box.work / "batch.json")
    deadline = time.monotonic() + 90
    killed = None
    while killed is None and time.monotonic() < deadline:
        if (out / "a.fused.onnx").exists() and len(_workers(process.pid)) == 1:
            time.sleep(0.3)
            workers = _workers(process.pid)
            if len(workers) == 1:
                os.kill(workers[0], signal.SIGKILL)  # what the OOM killer does
                killed = workers[0]
        time.sleep(0.1)
    _, err = process.communicate(timeout=TIMEOUT_S)
    assert killed is not None and process.returncode == 1, err
    records = json.loads((box.work / "batch.json").read_text())["models"]
    assert [r["exit_code"] for r in records] == [0, 128 + signal.SIGKILL]
    assert "killed by SIGKILL" in records[1]["error"]
    assert "Traceback" not in err


def test_corrupt_files_in_a_batch(box):
    models = box.work / "models"
    models.mkdir()
    shutil_copy(SAMPLES / "mlp.onnx", models / "a.onnx")
    (models / "b.onnx").write_bytes(b"\x08\x07garbage" * 10)
    (models / "c.onnx").write_bytes(b"")
    done = box.run("optimize", models, "--no-verify", "--json", box.work / "batch.json")
    assert done.returncode == 1, done.stderr
    codes = [r["exit_code"] for r in json.loads((box.work / "batch.json").read_text())["models"]]
    assert codes == [0, 2, 2]


def shutil_copy(source: Path, target: Path) -> None:
    target.write_bytes(source.read_bytes())


# ---- item 6: gates fail closed --------------------------------------------------------------------

def unverifiable_model() -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Mystery", ["a"], ["y"], domain="ex.custom")]
    model = model_of(nodes, [vi("x", T.FLOAT, [2, 3])], [vi("y", T.FLOAT, [2, 3])])
    model.opset_import.append(h.make_opsetid("ex.custom", 1))
    return model


@pytest.mark.parametrize("command", ["report", "optimize"])
def test_require_verified_fails_on_an_unverifiable_model(box, command):
    path = box.model(unverifiable_model())
    done = box.run(command, path, "--require-verified")
    assert done.returncode == 1, done.stderr
    assert "FAILED: --require-verified" in done.stdout and "unverifiable" in done.stdout


def test_max_peak_refuses_tensors_of_unknown_size(box):
    nodes = [h.make_node("NonZero", ["x"], ["i"]), h.make_node("Cast", ["i"], ["y"], to=T.FLOAT)]
    path = box.model(model_of(nodes, [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, None)]))
    done = box.run("report", path, "--max-peak", "1000")
    assert done.returncode == 1, done.stderr
    assert "--max-peak:" in done.stdout and "unknown size" in done.stdout


def test_report_max_peak_judges_the_model_as_it_is(box):
    """mlp's peak is 1.4 KiB as committed and 1.2 KiB fused: a 1.3 KiB budget fails `report` (the
    committed model is over it) and passes `optimize` (the written one is under)."""
    path = box.model(onnx.load(SAMPLES / "mlp.onnx"))
    budget = str(1.3 / 1024)
    assert box.run("report", path, "--max-peak", budget).returncode == 1
    assert box.run("optimize", path, "--max-peak", budget).returncode == 0


# ---- item 7: reports never over a model -----------------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--html", "--plot", "--markdown"])
def test_a_report_over_the_input_is_refused(box, option):
    path = box.model(onnx.load(SAMPLES / "mlp.onnx"))
    before = digest(path)
    refused(box.run("optimize", path, option, path), "a report cannot be written over a model")
    assert digest(path) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink", "output"])
def test_a_report_over_a_model_by_another_name_is_refused(box, link):
    path = box.model(onnx.load(SAMPLES / "mlp.onnx"))
    other = box.work / "other.onnx"
    if link == "symlink":
        other.symlink_to(path.name)
    elif link == "hardlink":
        os.link(path, other)
    command = (("optimize", path, "-o", other, "--json", other) if link == "output"
               else ("report", path, "--json", other))
    before = digest(path)
    refused(box.run(*command), "a report cannot be written over a model")
    assert digest(path) == before


def test_report_files_replace_the_old_ones_whole(box):
    path = box.model(onnx.load(SAMPLES / "mlp.onnx"))
    report = box.work / "r.json"
    report.write_text("old")
    done = box.run("report", path, "--json", report)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["tool"] == "fuse"
    assert sorted(p.name for p in box.work.iterdir()) == ["m.onnx", "r.json"]  # no temp file left


# ---- item 8: impossible shapes, cycles, self-reads, sparse constants, inf -------------------------

@pytest.mark.parametrize("shape, words", [
    ([2**40, 2**40], "cannot be held (above 1 PiB)"),
    ([2**62], "cannot be held (above 1 PiB)"),
    ([1] * 300, "has rank 300; fuse handles at most 64"),
], ids=["huge-dims", "dim-2**62", "rank-300"])
def test_impossible_declared_shapes(box, shape, words):
    path = box.model(model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", T.FLOAT, shape)], [vi("y", T.FLOAT, None)]))
    refused(box.run("optimize", path), words)


def test_a_computed_shape_of_2_62_values(box):
    nodes = [h.make_node("Reshape", ["x", "s"], ["y"])]
    model = model_of(nodes, [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, None)], [nh.from_array(np.array([2**62]), "s")])
    refused(box.run("report", box.model(model)), "tensor 'y' of shape 4611686018427387904 cannot be held")


def test_a_node_reading_its_own_output(box):
    nodes = [h.make_node("Add", ["x", "a"], ["a"], name="loop"), h.make_node("Relu", ["a"], ["y"])]
    path = box.model(model_of(nodes, [vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])]))
    refused(box.run("optimize", path), "node 'loop' reads its own output 'a'")
    assert not (box.work / "m.fused.onnx").exists()


def test_a_cycle(box):
    nodes = [h.make_node("Add", ["x", "b"], ["a"]), h.make_node("Relu", ["a"], ["b"]), h.make_node("Neg", ["b"], ["y"])]
    path = box.model(model_of(nodes, [vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])]))
    refused(box.run("optimize", path), "has a cycle")


def sparse_constant_model(dims, indices, values) -> onnx.ModelProto:
    sparse = h.make_sparse_tensor(nh.from_array(np.asarray(values, np.float32), "v"),
                                  nh.from_array(np.asarray(indices, np.int64), "i"), dims)
    nodes = [h.make_node("Constant", [], ["c"], sparse_value=sparse), h.make_node("Add", ["x", "c"], ["y"])]
    return model_of(nodes, [vi("x", T.FLOAT, dims)], [vi("y", T.FLOAT, dims)])


def test_a_sparse_constant_is_densified(box):
    path = box.model(sparse_constant_model([4], [0, 3], [1.0, 2.0]))
    out = box.work / "out.onnx"
    done = box.run("optimize", path, "-o", out)
    assert done.returncode == 0, done.stderr
    x = np.arange(4, dtype=np.float32)
    (y,) = onnxruntime.InferenceSession(str(out)).run(None, {"x": x})
    np.testing.assert_array_equal(y, x + np.array([1, 0, 0, 2], np.float32))


@pytest.mark.parametrize("dims, indices, words", [
    ([2**40], [0], "sparse value is 4194304 MB dense"),
    ([4], [9], "malformed sparse value"),
], ids=["huge", "index-out-of-range"])
def test_a_sparse_constant_that_cannot_be_densified(box, dims, indices, words):
    path = box.model(sparse_constant_model(dims, indices, [1.0]))
    refused(box.run("optimize", path), words)


def test_a_huge_sparse_initializer(box):
    """One value in a [2**40] sparse initializer: densifying it cannot be held."""
    sparse = h.make_sparse_tensor(nh.from_array(np.array([1.0], np.float32), "w"), nh.from_array(np.array([5]), "i"),
                                  [2**40])
    graph = h.make_graph([h.make_node("Add", ["x", "w"], ["y"])], "g", [vi("x", T.FLOAT, [1])],
                         [vi("y", T.FLOAT, None)],
                         sparse_initializer=[sparse])
    path = box.model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9))
    refused(box.run("report", path), "sparse initializer 'w' is 4096.0 GB dense")


def test_fold_scale_chains_keeps_an_overflow(box):
    nodes = [h.make_node("Mul", ["x", "a"], ["t"]), h.make_node("Mul", ["t", "b"], ["y"])]
    weights = [nh.from_array(np.array([3e38], np.float32), "a"), nh.from_array(np.array([0.5], np.float32), "b")]
    path = box.model(model_of(nodes, [vi("x", T.FLOAT, [3])], [vi("y", T.FLOAT, [3])], weights))
    out = box.work / "out.onnx"
    done = box.run("optimize", path, "-o", out)
    assert done.returncode == 0, done.stderr
    x = np.array([2.0, 1.0, -2.0], np.float32)
    (y,) = onnxruntime.InferenceSession(str(out)).run(None, {"x": x})
    assert np.isinf(y[0]) and np.isinf(y[2]) and y[1] == np.float32(3e38) * np.float32(0.5)


# ---- held, keep them ------------------------------------------------------------------------------

def external_model(location: str) -> onnx.ModelProto:
    weight = nh.from_array(np.ones(4, np.float32), "w")
    weight.data_location = T.EXTERNAL
    weight.ClearField("raw_data")
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    return model_of([h.make_node("Add", ["x", "w"], ["y"])], [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, [4])], [weight])


@pytest.mark.parametrize("location, setup, words", [
    ("../secret.bin", None, "points outside the model's folder"),
    ("/etc/hostname", None, "absolute or empty location"),
    ("link.bin", "symlink", "points outside the model's folder"),
    ("zero.bin", "dev", "points outside the model's folder"),
    ("fifo.bin", "fifo", "fifo.bin"),
], ids=["dotdot", "absolute", "symlink-out", "dev-zero", "fifo"])
def test_external_data_from_outside_is_refused(box, location, setup, words):
    secret = box.root / "secret.bin"
    secret.write_bytes(b"s" * 16)
    if setup == "symlink":
        (box.work / "link.bin").symlink_to(secret)
    elif setup == "dev":
        (box.work / "zero.bin").symlink_to("/dev/zero")
    elif setup == "fifo":
        os.mkfifo(box.work / "fifo.bin")
    path = box.model(external_model(location))
    refused(box.run("optimize", path, timeout=60), words)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_output_over_the_input_by_another_name_is_refused(box, link):
    path = box.model(onnx.load(SAMPLES / "mlp.onnx"))
    other = box.work / "other.onnx"
    other.symlink_to(path.name) if link == "symlink" else os.link(path, other)
    before = digest(path)
    done = box.run("optimize", path, "-o", other)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert digest(path) == before


def test_sigint_ends_the_run_without_a_traceback_or_an_output(box):
    path = box.model(slow_model())
    process = box.start("optimize", path, "-o", box.work / "out.onnx")
    deadline = time.monotonic() + 90
    # interrupted mid-run: once the run's scratch file for new weights is beside the output
    while not any(p.name.startswith(".fuse-weights-") for p in box.work.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode not in (0, 3) and "Traceback" not in err, err
    assert [p.name for p in box.work.iterdir()] == ["m.onnx"]  # no output, no scratch file left


def test_deep_nesting(box):
    """If inside If, 30 deep: parsed and run, or refused in one line; never a crash."""
    leaf = h.make_graph([h.make_node("Relu", ["x"], ["y0"])], "leaf", [], [vi("y0", T.FLOAT, [1])])
    body = leaf
    for level in range(1, 31):
        node = h.make_node("If", ["c"], [f"y{level}"], then_branch=body, else_branch=leaf)
        body = h.make_graph([node], f"b{level}", [], [vi(f"y{level}", T.FLOAT, [1])])
    model = model_of(list(body.node), [vi("x", T.FLOAT, [1]), vi("c", T.BOOL, [])], [vi("y30", T.FLOAT, [1])])
    done = box.run("optimize", box.model(model), "-o", box.work / "out.onnx")
    assert done.returncode in (0, 1, 2) and len(done.stderr.strip().splitlines()) <= 1, done.stderr


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_nesting_past_protobufs_limit(box):
    """Written byte by byte (onnx's helpers cannot build it): graph > node > attribute > graph ...
    1,000 deep. protobuf refuses to parse it; fuse says so in one line."""
    graph = b""
    for _ in range(1000):
        attribute = _field(1, b"then_branch") + _varint(20 << 3) + _varint(5) + _field(6, graph)
        graph = _field(1, _field(5, attribute) + _field(4, b"If"))
    path = box.work / "deep.onnx"
    path.write_bytes(_varint(1 << 3) + _varint(9) + _field(7, graph))
    refused(box.run("optimize", path), "not a readable ONNX model")
