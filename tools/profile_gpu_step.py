"""Where a GPU decode step's time goes: runs a few decode tokens of a model on the CUDA backend under
PyTorch's profiler (CUPTI sees every kernel of the process, libspecla's included) and writes one
JSON row per kernel name (calls per token, total and mean microseconds per token, share of the
step) plus a row for the whole step.

    python tools/profile_gpu_step.py --model 27b.gguf --out rows.jsonl [--tokens 4]"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyspecla import Model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default=None)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    model = Model.load(args.model, device="cuda")
    ctx = model.new_context(n_ctx=256, max_batch=16)
    ctx.eval([1, 2, 3, 4, 5, 6, 7, 8])
    for t in range(8):
        ctx.eval_argmax([100 + t])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for t in range(args.tokens):
            ctx.eval_argmax([200 + t])
        wall = (time.perf_counter() - t0) / args.tokens
    per_name = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type.name == "CUDA" or getattr(event, "device_time", 0):
            per_name[event.name][0] += 1
            per_name[event.name][1] += event.device_time if hasattr(event, "device_time") else event.cuda_time
    kernel_us = sum(v[1] for v in per_name.values()) / args.tokens
    rows = [{"commit": args.commit, "model": os.path.basename(args.model), "mode": "decode-profile",
             "wall_ms_per_token": round(wall * 1e3, 3), "kernel_ms_per_token": round(kernel_us / 1e3, 3),
             "kernels_per_token": sum(v[0] for v in per_name.values()) / args.tokens}]
    for name, (calls, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        rows.append({"mode": "decode-kernel", "kernel": name[:120], "calls_per_token": calls / args.tokens,
                     "us_per_token": round(us / args.tokens, 1), "mean_us": round(us / calls, 2),
                     "share_of_kernel_time": round(us / args.tokens / kernel_us, 4)})
    for row in rows[:40]:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
