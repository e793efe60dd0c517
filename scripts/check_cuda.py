"""The CUDA half of the runtime-target check (see scripts/check_cuda.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = {"cnn_bn_relu.onnx": {"batch": 4}, "mlp.onnx": {"batch": 4},
           "transformer_block_opset14.onnx": {"batch": 2, "sequence": 64},
           "transformer_block_opset17.onnx": {"batch": 2, "sequence": 64}}
# one run as well: a session is created before any kernel loads, so a build without machine code
# for this GPU ("no kernel image is available") shows only when something runs
PROBE = """
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
o = ort.SessionOptions(); o.log_severity_level = 4
s = ort.InferenceSession(m.SerializeToString(), o, providers=["CUDAExecutionProvider"])
s.run(None, {"x": np.ones(1, np.float32)})
print(",".join(s.get_providers()))
"""


def cuda_library_dirs() -> list[str]:
    """The folders of the CUDA libraries that pip's nvidia-* packages installed (torch's, on the GPU
    machine: nvidia/cu13/lib, nvidia/cudnn/lib, ...). onnxruntime-gpu looks for libcublas.so.13 and
    libcudnn.so.9 through the loader's search path, which those folders are not on."""
    found = []
    for entry in map(Path, sys.path):
        root = entry / "nvidia"
        if root.is_dir():
            found += sorted(str(lib) for lib in root.glob("**/lib") if any(lib.glob("lib*.so*")))
    return found


def with_cuda_libraries(environ: dict[str, str]) -> dict[str, str] | None:
    """`environ` with the CUDA library folders first on LD_LIBRARY_PATH, None if it has them: the
    loader reads the variable once, at process start, so a process that needs it must be re-run."""
    current = [d for d in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    missing = [d for d in cuda_library_dirs() if d not in current]
    if not missing:
        return None
    return {**environ, "LD_LIBRARY_PATH": os.pathsep.join(missing + current)}


def rerun_with_cuda_libraries() -> None:
    """Replaces this process by itself with the CUDA library folders on LD_LIBRARY_PATH, unless
    it has them already."""
    environ = with_cuda_libraries(dict(os.environ))
    if environ is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], environ)


def cuda_loads() -> tuple[bool, str]:
    """Ask in a child process: listing CUDAExecutionProvider is not proof that its libraries load,
    and a failed load prints loud errors we keep out of this script's output."""
    environ = with_cuda_libraries(dict(os.environ)) or dict(os.environ)
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=environ)
    providers = probe.stdout.strip().split(",")
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        return False, f"onnxruntime could not run a CUDA session: {why}"
    if "CUDAExecutionProvider" not in providers:
        return False, f"a session asking for CUDA got {providers}: the CUDA libraries do not load here"
    return True, ""


def main() -> int:
    rerun_with_cuda_libraries()
    ok, reason = cuda_loads()
    if not ok:
        print(f"SKIPPED: CUDA check not run: {reason}")
        return 0
    sys.path.insert(0, str(REPO))
    import onnxruntime as ort

    from fuse_cli import api
    from fuse_cli.config import FuseConfig
    from fuse_cli.verify import compare_outputs, random_inputs, run

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in SAMPLES.items():
            source = REPO / "sample_models" / name
            result = api.optimize(source, FuseConfig(target="ort-cuda", dims=dims, verify=False), Path(tmp) / name)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            cpu = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
            # TF32 off: on Ampere and later onnxruntime's CUDA MatMuls default to it, a 1e-3 error in
            # any fp32 model (the unfused MLP sample too), which would hide the fusions' own error
            cuda = [("CUDAExecutionProvider", {"use_tf32": "0"})]
            gpu = ort.InferenceSession(result.model.SerializeToString(), options, providers=cuda)
            gpu.disable_fallback()
            feeds = random_inputs(cpu, dims=dims)
            # GPU kernels accumulate in other orders: a looser fp32 tolerance than verification's
            comparison = compare_outputs(run(cpu, feeds), run(gpu, feeds), rtol=1e-4, atol=1e-4)
            contrib = sorted({n.op_type for n in result.model.graph.node if n.domain == "com.microsoft"})
            status = "ok" if comparison.passed else "MISMATCH"
            worst = max(o.max_abs_diff for o in comparison.outputs)
            print(f"{status:8} {name:34} contrib ops {contrib}  max abs diff {worst:.3g}")
            failures += not comparison.passed
    print(f"{len(SAMPLES) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
