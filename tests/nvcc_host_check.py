"""Builds and runs a host check of CUDA device code (tools/cuda_*_check.cu) with nvcc, no GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_host_check(tmp_path: Path, source: str, *args: str, nvcc_flags: tuple[str, ...] = ()) -> str:
    """Compiles tools/<source> against native/backends/cuda, runs it with `args`, asserts exit status
    0 and returns its output."""
    binary = tmp_path / Path(source).stem
    build = subprocess.run(["nvcc", "-O2", "-std=c++20", *nvcc_flags, "-I", str(ROOT / "native" / "backends" / "cuda"),
                            str(ROOT / "tools" / source), "-o", str(binary)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    run = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    return output
