"""scripts/check_cuda.sh: runs the ort-cuda outputs on a GPU, or says plainly why it cannot."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_cuda_check_runs_or_skips_with_a_reason():
    result = subprocess.run(["bash", str(REPO / "scripts" / "check_cuda.sh")], capture_output=True, text=True,
                            env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("SKIPPED:"):
        pytest.skip(result.stdout.strip())
    assert result.stdout.strip().endswith("4 passed, 0 failed")
