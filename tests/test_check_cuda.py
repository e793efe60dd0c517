"""scripts/check_cuda.sh: runs the ort-cuda outputs on a GPU, or says plainly why it cannot."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_cuda_check_runs_or_skips_with_a_reason():
    # where the CUDA libraries or onnxruntime-gpu come from a path given in the environment
    passed_on = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "PYTHONPATH") if k in os.environ}
    result = subprocess.run(["bash", str(REPO / "scripts" / "check_cuda.sh")], capture_output=True, text=True,
                            env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", **passed_on}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("SKIPPED:"):
        pytest.skip(result.stdout.strip())
    assert result.stdout.strip().endswith("4 passed, 0 failed")


def test_cuda_libraries_of_pip_packages_go_first_on_the_loader_path(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    import check_cuda

    for folder in ("nvidia/cu13/lib", "nvidia/cudnn/lib", "nvidia/empty/lib"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "nvidia/cu13/lib/libcublas.so.13").write_bytes(b"")
    (tmp_path / "nvidia/cudnn/lib/libcudnn.so.9").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    environ = check_cuda.with_cuda_libraries({"LD_LIBRARY_PATH": "/usr/local/lib", "HOME": "/root"})
    path = environ["LD_LIBRARY_PATH"].split(os.pathsep)
    # this machine's own nvidia packages, where it has some, may follow ours
    assert path[:2] == [str(tmp_path / "nvidia/cu13/lib"), str(tmp_path / "nvidia/cudnn/lib")]
    assert path[-1] == "/usr/local/lib" and str(tmp_path / "nvidia/empty/lib") not in path
    assert environ["HOME"] == "/root"
    assert check_cuda.with_cuda_libraries(environ) is None  # already there: no second re-run
