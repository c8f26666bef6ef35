"""A short forward workload for Nsight Compute: loads a model on the CUDA backend, runs one decode
token, then one forward of --batch tokens. The decode comes first so that the first launches of a
kernel that only one-token calls use (the dp4a matmul, ^mm_kernel) and of one that only batches use
(the staged tensor-core matmul, ^mm_tile) are both the first layers' matrices:

    ncu --clock-control none -k regex:^mm_tile -c 6 --section SpeedOfLight \\
        python3 tools/device/ncu_step.py --model 27b.gguf --batch 23

The stall reasons (results/ncu-stalls-61ccb2f.log), in warp cycles per issued instruction:

    ncu --clock-control none -k regex:^mm_kernel -c 2 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats \\
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio' \\
        python3 tools/device/ncu_step.py --model 27b.gguf --batch 23"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pyspecla import Model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=23)
    args = parser.parse_args(argv)
    model = Model.load(args.model, device="cuda")
    ctx = model.new_context(n_ctx=256, max_batch=max(16, args.batch), recorded_steps=False)
    ctx.eval_argmax([9])
    ctx.eval_argmax([300 + i for i in range(args.batch)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
