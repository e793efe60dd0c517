#!/usr/bin/env bash
# Here, once, before `make gpu-check` runs on a lent GPU machine (bare, no network): puts in .whl/
# what fuse needs there and the image lacks (see scripts/gpu_check.py's docstring for the run call):
# - onnxruntime-gpu, packed by scripts/pack_cuda_runtime.py to sm_90 code only: the wheel is 256 MB
#   and a call carries at most 64 MiB with the working tree; packed, 55.9 MiB for 1.31.1;
# - onnx-graphsurgeon (pure Python). click, rich, onnx, numpy, sympy and nvidia-ml-py are in the image.
# .whl/ is git-ignored (.gitignore). Prints the size that will travel against the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/.."
ORT_VERSION=${ORT_VERSION:-1.31.1}
GS_VERSION=${GS_VERSION:-0.6.1}
CACHE=${GPU_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fuse-gpu-wheels}
PACKED=.whl/onnxruntime-gpu-sm90.tar.xz
mkdir -p "$CACHE" .whl
download() {  # cp312 manylinux x86_64: the GPU machine's python 3.12
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$1" "$2"
}
download "$CACHE" "onnxruntime-gpu==$ORT_VERSION"
download .whl "onnx-graphsurgeon==$GS_VERSION"
wheel=$(ls "$CACHE"/onnxruntime_gpu-"$ORT_VERSION"-cp312-*.whl)
if [ ! -f "$PACKED" ] || [ "$wheel" -nt "$PACKED" ]; then
    python3 scripts/pack_cuda_runtime.py "$wheel" "$PACKED.partial" && mv "$PACKED.partial" "$PACKED"
fi
# what a call sends besides carried paths: tracked files and untracked ones git does not ignore
tracked=$(git ls-files -z --cached --others --exclude-standard | python3 -c \
    "import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split(chr(0)) if os.path.isfile(p)))")
carried=$(cat .whl/* | wc -c)
echo "gpu-prepare: .whl/ $((carried / 1048576)) MiB + working tree $((tracked / 1048576)) MiB" \
     "= $(((carried + tracked) / 1048576)) MiB of the 64 MiB a call may carry"
[ $((carried + tracked)) -le $((64 * 1048576)) ] || { echo "gpu-prepare: over the limit" >&2; exit 1; }
