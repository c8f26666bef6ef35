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
        python3 tools/device/ncu_step.py --model 27b.gguf --batch 23

--tree-nodes N then verifies a tree of N nodes (a spine with a leaf off every other spine node, a
DDTree's shape) and accepts its spine, twice (the second verify folds the first one's path): the
SpecLA chain kernel's launches for `-k regex:^gdn_tree`. SchedulerStats' issue-slot use and the
stall reasons say whether its walk is latency- or issue-bound (latency-bound at 6c6e248:
docs/specla.md).

--depth N first fills the cache with N tokens (in chunks of the context's max_batch), then opens the profiler's range
(cuProfilerStart) for the decode token and the batch only, so that with `--profile-from-start off`
the prefill's launches are not profiled: the attention kernels of a batch at depth,

    ncu --clock-control none --profile-from-start off -k regex:^attention_tile -c 2 --set full \\
        python3 tools/device/ncu_step.py --model 27b.gguf --batch 23 --depth 4096"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pyspecla import Model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=23)
    parser.add_argument("--tree-nodes", type=int, default=0, help="then verify a tree of this many nodes, twice")
    parser.add_argument("--depth", type=int, default=0,
                        help="cache rows filled before the profiled part (which then starts at cuProfilerStart)")
    args = parser.parse_args(argv)
    if args.tree_nodes < 0 or args.tree_nodes == 1:
        parser.error(f"--tree-nodes takes 0 (none) or 2 or more, got {args.tree_nodes}")
    if args.depth < 0:
        parser.error(f"--depth takes 0 or more cache rows, got {args.depth}")
    model = Model.load(args.model, device="cuda")
    max_batch = max(16, args.batch)
    ctx = model.new_context(n_ctx=args.depth + 256, max_batch=max_batch, max_tree_nodes=args.tree_nodes,
                            recorded_steps=False)
    for start in range(0, args.depth, max_batch):
        ctx.eval_argmax([1000 + (i % 5000) for i in range(start, min(args.depth, start + max_batch))])
    if args.depth:
        # the driver API's range start (libcuda is loaded: the model is on the GPU)
        ctypes.CDLL("libcuda.so.1").cuProfilerStart()
    ctx.eval_argmax([9])
    ctx.eval_argmax([300 + i for i in range(args.batch)])
    if args.tree_nodes:
        parents, spine = spine_tree(args.tree_nodes)
        for step in range(2):
            ctx.verify_tree([500 + 7 * step + i for i in range(args.tree_nodes)], parents)
            ctx.accept(spine)
    return 0


def spine_tree(n: int) -> tuple[list[int], list[int]]:
    """parents of an n-node tree, a spine of about 2n/3 nodes with a leaf off every other spine
    node, and the spine's nodes (the path an accept takes)."""
    spine_len = max(1, (2 * n + 2) // 3)
    parents = [-1] + list(range(spine_len - 1))
    leaf_at = 0
    while len(parents) < n:
        parents.append(min(leaf_at, spine_len - 1))
        leaf_at += 2
    return parents, list(range(spine_len))


if __name__ == "__main__":
    raise SystemExit(main())
