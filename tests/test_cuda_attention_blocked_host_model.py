"""The register-blocked attention walk on the CPU (tools/cuda_attention_blocked_check.cu): the phases of
attention_blocked.cuh (staging q, the transposed and swizzled K, V as stored; the scores with their
lane sums folded into the butterfly's tree; the weighted V sums) run for every thread index of a block
against plain loops of the fp32 path's arithmetic, bit for bit, at head_dim 256, 128, 64 and 32 and
1 to 32 pairs; --self-test plants three faults (K staged without the swizzle, the lane sums added in
lane order, a V row read one row late) and fails unless each is caught. It needs nvcc (CI has it), no
GPU: which thread owns which pairs, rows and dims, and the order of the fold, are checked on every
submission, before any device time."""

from __future__ import annotations

import shutil

import pytest

from nvcc_host_check import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build tools/cuda_attention_blocked_check.cu")
def test_blocked_attention_phases_match_the_fp32_arithmetic_with_planted_faults(tmp_path):
    output = run_host_check(tmp_path, "cuda_attention_blocked_check.cu", "--self-test",
                            nvcc_flags=("-Xcompiler", "-ffp-contract=off"))
    assert "PASSED: 0 failure(s), every planted fault caught" in output, output[-3000:]
    first, planted = output.split("-- planted faults")
    assert first.count(" ok ") == 32 and "FAIL" not in first, first
    assert planted.count(" ok ") == 5, planted
