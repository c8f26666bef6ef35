"""The tensor-core attention's per-lane code on the CPU (tools/cuda_attention_tc_check.cu): att_tc_scores
and att_tc_values on 32 host threads per warp with an emulated m16n8k8 tf32 MMA, against plain loops
of the 3xTF32 arithmetic that attention_tensor_cores.cuh defines, bit for bit; --self-test plants a
fault in the emulated MMA's rows and one in its k-slots and fails unless both are caught. It needs
nvcc (CI has it), no GPU: the fragment indices, the head-dim permutation, the clamped rows and where
each C element lands are checked on every submission, before any device time."""

from __future__ import annotations

import shutil

import pytest

from nvcc_host_check import run_host_check


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build tools/cuda_attention_tc_check.cu")
def test_tensor_core_attention_lanes_match_their_arithmetic_with_planted_faults(tmp_path):
    output = run_host_check(tmp_path, "cuda_attention_tc_check.cu", "--self-test")
    assert "PASSED: 0 failure(s), every planted fault caught" in output, output[-3000:]
    first = output.split("-- planted fault")[0]
    assert first.count(" ok ") >= 30 and "FAIL" not in first, first
