"""Progress and timings (issue 36): a live status line on a terminal's stderr, never on stdout,
gone when the run ends; timings in every JSON report that account for the run's wall time."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from fuse_cli import progress
from fuse_cli.cli import cli
from fuse_cli.progress import BESIDE, Steps
from fuse_cli.report.status_line import status_text
from tests.conftest import SAMPLES, benchmark_script

SAMPLE = SAMPLES / "transformer_block_opset14.onnx"
STATUS_MARK = "(run "  # every status line shows the run's clock so


@pytest.fixture(scope="module")
def deep_stack(tmp_path_factory) -> Path:
    """Twelve encoder blocks (~600 nodes): a run of a few seconds, mostly in steps that matter."""
    path = tmp_path_factory.mktemp("deep") / "deep12.onnx"
    onnx.save(benchmark_script("big_models").build_deep_stack(12), path)
    return path


# --- the recorder ------------------------------------------------------------------------------


def test_steps_nest_and_a_thread_of_the_run_is_beside_it():
    steps = Steps()
    with steps.recording():
        with progress.step("pipeline"):
            with progress.step("passes"):
                progress.update("pass 3 of 40: conv-bn")
                assert status_text(steps).startswith("pipeline · passes: pass 3 of 40: conv-bn")
        inside, release = threading.Event(), threading.Event()

        def beside():
            with progress.step("verification"):
                progress.update("original: setting 1 of 2")
                inside.set()
                release.wait(10)
        worker = threading.Thread(target=progress.carried(beside))
        worker.start()
        inside.wait(10)
        assert status_text(steps).endswith("beside it: verification: original: setting 1 of 2")
        release.set()
        worker.join()
    timings = steps.timings()
    where = {(s.within, s.name): s.count for s in timings.steps}
    assert where == {("pipeline", "passes"): 1, (None, "pipeline"): 1, (BESIDE, "verification"): 1}
    assert timings.wall_seconds >= timings.steps[1].seconds >= timings.steps[0].seconds


def test_a_step_on_another_thread_is_recorded_beside_the_run():
    steps = Steps()
    with steps.recording():
        def beside():
            with progress.step("verification"):
                time.sleep(0.01)
        worker = threading.Thread(target=progress.carried(beside))
        worker.start()
        worker.join()
    (step,) = steps.timings().steps
    assert step.within == BESIDE and step.seconds >= 0.01


def test_without_a_recording_the_library_calls_do_nothing():
    with progress.step("load"):
        progress.update("anything")
        progress.pass_ran("conv-bn", 0.1, 0.05)
    assert progress._CURRENT.get() is None


# --- the command line: stdout, a terminal, a log -----------------------------------------------


def test_the_status_never_reaches_stdout_in_process(tmp_path):
    result = CliRunner().invoke(cli, ["optimize", str(SAMPLE), "-o", str(tmp_path / "out.onnx"), "--json", "-",
                                      "--verbose"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)  # stdout is the JSON and nothing else
    assert document["timings"]["steps"] and STATUS_MARK not in result.stdout
    # stderr is no terminal here: with --verbose one line per step as it ends, nothing live
    logged = [line for line in result.stderr.splitlines() if line.startswith("fuse: ")]
    assert any(line.startswith("fuse: shape tables: ") for line in logged)
    assert STATUS_MARK not in result.stderr
    # every step of the library's run once a line (the command line's own, reading the options and
    # showing the report, come before and after the log)
    ran = sum(step["count"] for step in document["timings"]["steps"]
              if step["name"] not in ("options", "show the report"))
    assert len(logged) == ran


def test_a_log_gets_no_step_lines_without_verbose(tmp_path):
    result = CliRunner().invoke(cli, ["optimize", str(SAMPLE), "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("fuse: ")]


def test_timings_print_a_table_and_take_one_model(tmp_path):
    result = CliRunner().invoke(cli, ["report", str(SAMPLE), "--timings"])
    assert result.exit_code == 0, result.stderr
    assert "Steps (the top level adds up to the wall time)" in result.stdout and "shape tables" in result.stdout
    batch = CliRunner().invoke(cli, ["report", str(SAMPLE), str(SAMPLES / "mlp.onnx"), "--timings"])
    assert batch.exit_code == 2 and "take one model" in batch.stderr


def _run_on_a_terminal(args: list[str], tmp_path: Path) -> tuple[str, str, int]:
    """fuse with stderr a pseudo-terminal (120 columns) and stdout a pipe: (what the terminal
    received, stdout, exit code)."""
    import fcntl
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "NO_COLOR", "FORCE_TERMINAL")}
    env.update(TERM="xterm-256color", COLUMNS="120")
    process = subprocess.Popen([sys.executable, "-m", "fuse_cli", *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=follower, cwd=tmp_path, env=env)
    os.close(follower)
    received = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                return
            if not chunk:
                return
            received.extend(chunk)
    reader = threading.Thread(target=read)
    reader.start()
    stdout, _ = process.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(leader)
    return received.decode("utf-8", "replace"), stdout.decode(), process.returncode


def _screen(raw: str) -> list[str]:
    """What a terminal shows after `raw`: enough of one to follow rich's live display (carriage
    return, new line, cursor up, erase line, colours and cursor visibility ignored)."""
    lines, row, col = [""], 0, 0
    for token in re.finditer(r"\x1b\[\??[0-9;]*[A-Za-z]|\r|\n|[^\x1b\r\n]+|\x1b", raw):
        text = token.group()
        if text == "\r":
            col = 0
        elif text == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif text.startswith("\x1b["):
            count = int(re.sub(r"\D", "", text[2:-1]) or 1)
            if text.endswith("A"):
                row = max(0, row - count)
            elif text.endswith("K"):
                lines[row] = lines[row][:col] if count != 2 else ""
        elif not text.startswith("\x1b"):
            line = lines[row].ljust(col)
            lines[row] = line[:col] + text + line[col + len(text):]
            col += len(text)
    return [line.rstrip() for line in lines if line.strip()]


def test_on_a_terminal_the_status_shows_on_stderr_and_is_gone_at_the_end(deep_stack, tmp_path):
    raw, stdout, code = _run_on_a_terminal(["optimize", str(deep_stack), "-o", str(tmp_path / "out.onnx"),
                                            "--json", "-"], tmp_path)
    assert code == 0, raw[-2000:]
    assert STATUS_MARK in raw and "pipeline" in raw  # it was drawn while the run went on
    json.loads(stdout)  # and stdout, a pipe, is only the JSON
    assert STATUS_MARK not in stdout
    screen = _screen(raw)
    assert not [line for line in screen if STATUS_MARK in line], screen[-5:]
    assert any("fuse optimize" in line for line in screen)  # the report table (on stderr with --json -) stays


def test_quiet_shows_nothing_of_the_status(tmp_path):
    raw, stdout, code = _run_on_a_terminal(["optimize", str(SAMPLE), "-o", str(tmp_path / "out.onnx"), "--quiet",
                                            "--json", "-"], tmp_path)
    assert code == 0, raw[-2000:]
    # the terminal gets the report table (stdout has the JSON), and nothing of the status
    assert "fuse optimize" in raw and STATUS_MARK not in raw
    json.loads(stdout)


# --- the timings ---------------------------------------------------------------------------------


def test_timings_add_up_to_the_wall_time_and_every_pass_is_timed(deep_stack, tmp_path):
    report_path = tmp_path / "report.json"
    started = time.perf_counter()
    result = CliRunner().invoke(cli, ["optimize", str(deep_stack), "-o", str(tmp_path / "out.onnx"),
                                      "--dim", "batch=2", "--dim", "sequence=16", "--json", str(report_path)])
    wall = time.perf_counter() - started
    assert result.exit_code == 0, result.stderr
    document = json.loads(report_path.read_text())
    timings = document["timings"]
    top_level = sum(step["seconds"] for step in timings["steps"] if step["within"] is None)
    assert abs(top_level - wall) <= 0.05 * wall, (top_level, wall, timings["steps"])
    assert top_level <= timings["wall_seconds"] <= wall

    passes = {p["name"]: p for p in timings["passes"]}
    assert set(document["passes"]) <= set(passes)  # every pass of the pipeline ran and was timed
    for p in passes.values():
        assert p["runs"] >= 1 and p["seconds"] >= 0
        if p["matching_seconds"] is not None:  # a pattern pass: the two parts make its time
            assert p["matching_seconds"] + p["rewriting_seconds"] == pytest.approx(p["seconds"], abs=2e-4)
    for fusion in document["fusions"]:
        if passes[fusion["pass"]]["rewriting_seconds"] is not None:
            assert passes[fusion["pass"]]["rewriting_seconds"] > 0  # it rewrote something: that took time

    verified = {(run["model"], tuple(sorted(run["setting"].items()))) for run in timings["verification"]}
    settings = {tuple(sorted(s.items())) for s in document["verification"]["settings"]}
    assert verified >= {(model, s) for model in ("original", "candidate") for s in settings}
    assert timings["peak_rss_bytes"] > 0 and timings["worker_peak_rss_bytes"] > 0


def test_timings_of_a_dry_run_without_verification(tmp_path):
    from fuse_cli import api
    from fuse_cli.config import FuseConfig

    started = time.perf_counter()
    report = api.optimize(SAMPLE, FuseConfig(verify=False), dry_run=True).report
    wall = time.perf_counter() - started
    names = [s.name for s in report.timings.steps if s.within is None]
    assert names[:2] == ["load", "shape tables"] and "verification" not in names
    assert report.timings.verification == ()
    assert report.timings.wall_seconds <= wall


def test_a_terminal_sees_a_line_from_the_first_moment_and_it_is_erased(tmp_path):
    """Importing the command line takes seconds: fuse_cli.launch says so on the terminal before it
    imports anything heavy, and erases the line before the command's own status and output."""
    from fuse_cli.launch import ERASE_LINE, LOADING

    shutil.copy(SAMPLE, tmp_path / "model.onnx")
    raw, stdout, code = _run_on_a_terminal(["report", "model.onnx"], tmp_path)
    assert code == 0
    assert raw.startswith(LOADING) and raw.index(ERASE_LINE) == len(LOADING)
    assert all(LOADING not in line for line in _screen(raw)) and LOADING not in stdout
    quiet, _, code = _run_on_a_terminal(["report", "model.onnx", "--quiet"], tmp_path)
    assert code == 0 and LOADING not in quiet


def test_no_loading_line_where_stderr_is_no_terminal_or_the_command_shows_no_status():
    import io

    from fuse_cli.launch import shows_loading

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert shows_loading(["optimize", "m.onnx"], Terminal())
    assert not shows_loading(["optimize", "m.onnx"], io.StringIO())
    assert not shows_loading(["optimize", "m.onnx", "-q"], Terminal())
    assert not shows_loading(["verify", "a.onnx", "b.onnx"], Terminal()) and not shows_loading([], Terminal())
