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
