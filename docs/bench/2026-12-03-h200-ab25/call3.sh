#!/bin/sh
# Call 3 (2026-12-03, H200): the grid-barrier lab alone.
set -u
out=$OUT
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/grid_barrier_lab.cu -o /tmp/grid_barrier_lab || exit 99
timeout 90 /tmp/grid_barrier_lab > $out/lab-grid-barrier.txt 2>&1; echo "rc $?"
timeout 60 /tmp/grid_barrier_lab 500 > $out/lab-grid-barrier-r500.txt 2>&1; echo "rc $?"
cat $out/lab-grid-barrier.txt $out/lab-grid-barrier-r500.txt
