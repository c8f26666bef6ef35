"""Stage 1 of docs/persistent-step.md: a chain of one-token matmuls in one persistent kernel
(cuda_matmul_chain_*, native/backends/cuda/matmul_chain.cuh) gives, for every link, the bits of the
same chain of cuda_matmul calls (the op path), on fresh random inputs with every output poisoned
before each run (tools/cuda_chain_check.cu --no-bench). The GPU tests are marked gpu and skip with a
reason where no device is visible; the build and the argument checks need nvcc only (CI has it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import seeded_rng

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "native" / "backends" / "cuda"


@pytest.fixture(scope="module")
def chain_check(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to build tools/cuda_chain_check.cu")
    binary = tmp_path_factory.mktemp("chain-check") / "cuda_chain_check"
    build = subprocess.run(
        ["nvcc", "-O3", "-std=c++20", "-arch=sm_90", "-Xcompiler", "-ffp-contract=off", f"-I{CUDA}",
         f"-I{ROOT / 'native' / 'common'}", f"-I{ROOT / 'native' / 'include'}",
         str(ROOT / "tools" / "cuda_chain_check.cu"), str(CUDA / "matmul.cu"), "-o", str(binary)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    return binary


@pytest.mark.parametrize("args, message", [
    (["--type", "q5_k"], "--type must be q4_k or q6_k (got 'q5_k')"),
    (["--links", "0"], "--links 1..64"),
    (["--shapes", "5120x1000"], "--shapes wants NE0xNE1 pairs, multiples of 256 (got '5120x1000')"),
    (["--shapes", "5120x1024,2048x5120"], "--shapes must chain"),
    (["--frobnicate"], "unknown argument '--frobnicate'"),
])
def test_bad_arguments_are_named(chain_check, args, message):
    run = subprocess.run([str(chain_check), *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("chain_args", [
    ["--links", "6"],                                           # the 27B FFN's shapes, Q4_K
    ["--links", "12", "--shapes", "5120x1024,1024x5120"],       # small matrices: waits dominate
    ["--links", "4", "--type", "q6_k"],
], ids=["ffn-q4_k", "small-q4_k", "ffn-q6_k"])
def test_the_persistent_chain_is_the_op_path_bit_for_bit(chain_check, chain_args):
    _, seed = seeded_rng()
    run = subprocess.run([str(chain_check), *chain_args, "--no-bench", "--check-runs", "2", "--seed", str(seed)],
                         capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "check: PASSED" in output, output[-4000:]
    assert output.count("PASSED (0 of") >= 24, output[-4000:]  # 6-7 chain forms x 4 flag sets
