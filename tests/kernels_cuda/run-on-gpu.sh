#!/bin/sh
# Build atlas with the CUDA backend and run the gpu suite (every op of the
# cuda backend against the cpu backend). Run from anywhere on a machine with
# an NVIDIA GPU and nvcc:  sh tests/kernels_cuda/run-on-gpu.sh [build-dir]
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
# The GPU machine lacks Debian's -dev packages; the lead carries them here.
[ -f "$src/.devdeps/activate.sh" ] && . "$src/.devdeps/activate.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
[ -d "$build" ] || meson setup "$build" "$src" -Dcuda=enabled
# Only the gpu suite's targets: unrelated modules cannot stop the run.
ninja -C "$build" tests/kernels_cuda/test_cuda_ops tests/kernels_cuda/test_cuda_attention \
	tests/kernels_cuda/test_cuda_sample
rc=0
meson test -C "$build" --no-rebuild --suite gpu --print-errorlogs --num-processes 1 || rc=$?
tail -n 200 "$build/meson-logs/testlog.txt"
exit $rc
