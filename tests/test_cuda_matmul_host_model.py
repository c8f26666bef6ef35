"""The CUDA matmul's host model on the CPU (tools/cuda_matmul_check.cu --host-model): the GPU kernels'
plan, layout and per-block arithmetic, and the tensor-core kernels' per-lane code with emulated MMAs
and barriers, against the CPU oracle and each other, bit for bit; --self-test plants a fault in each
check and fails unless every one is caught. It needs nvcc (CI has it), no GPU: a change to the
matmul's arithmetic or plan is checked on every submission, before any device time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build tools/cuda_matmul_check.cu")
def test_cuda_matmul_host_model_quick_with_planted_faults(tmp_path):
    build = subprocess.run(["bash", str(ROOT / "tools" / "device" / "build_cuda_checks.sh"), str(tmp_path), "90"],
                           capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    run = subprocess.run([str(tmp_path / "cuda_matmul_check"), "--host-model", "--quick", "--self-test"],
                         capture_output=True, text=True, timeout=2400, cwd=ROOT)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "PASSED: 0 failure(s)" in output, output[-3000:]
