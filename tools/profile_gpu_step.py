"""Where a GPU decode step's time goes: runs a few decode tokens of a model on the CUDA backend under
PyTorch's profiler (CUPTI sees every kernel of the process, libspecla's included) and writes one
JSON row per kernel name (calls per token, total and mean microseconds per token, share of the
step) plus a row for the whole step.

    python tools/profile_gpu_step.py --model 27b.gguf --out rows.jsonl [--tokens 4]
    python tools/profile_gpu_step.py --model 27b.gguf --tree      # the 23-node DDTree verify of
                                                                  # bench_gpu_spec.py, SpecLA on
    python tools/profile_gpu_step.py --model 27b.gguf --spec-draft draft.gguf
        # whole speculative steps as bench_gpu_e2e.py --draft-cost runs them (oracle acceptance at
        # 6 tokens per step, DDTree of 23 nodes with SpecLA, recorded steps, the DFlash draft's
        # proposal each step): rows per step; the draft's kernels are the F16 ones and its split

Per-kernel times need SPECLA_CUDA_PDL=0. With launch overlap on (the default on sm_90), every kernel
starts while its predecessor runs and waits inside, so its span includes that wait: at 0167a20 the
spans summed to 22.3 ms for a 10.0 ms step. Serialized, they sum to the step's kernel time. The
rows say which it was (launch_overlap)."""

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
    parser.add_argument("--batch", type=int, default=1,
                        help="tokens per step: 1 profiles decode, N > 1 a forward of N tokens (a verify batch)")
    parser.add_argument("--depth", type=int, default=16, help="tokens already in the context before each step")
    parser.add_argument("--tree", action="store_true",
                        help="profile a verify of bench_gpu_spec.py's 23-node DDTree (HLD chains, deferred commit)")
    parser.add_argument("--spec-draft", default=None, metavar="DRAFT.gguf",
                        help="profile speculative steps with this DFlash draft's cost (bench_gpu_e2e.py --draft-cost)")
    parser.add_argument("--timeline", default=None, metavar="OUT.jsonl",
                        help="with --spec-draft: also write every GPU activity and the steps' phases (draft, "
                             "verify, accept: host ranges) as JSON lines with start and end in microseconds")
    args = parser.parse_args(argv)
    if args.timeline and not args.spec_draft:
        parser.error("--timeline goes with --spec-draft (it labels the speculative steps' phases)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    model = Model.load(args.model, device="cuda")
    if args.spec_draft:
        return profile_spec_steps(model, args)
    if args.batch < 1 or args.depth < 8:
        parser.error("--batch must be >= 1 and --depth >= 8")
    parents = None
    if args.tree:
        from bench_gpu_spec import verify_tree_shape  # noqa: E402  (tools/ is this script's directory)
        parents = verify_tree_shape()[0]
        args.batch = len(parents)
    ctx = model.new_context(n_ctx=args.depth + args.batch + args.tokens + 16, max_batch=max(16, args.batch),
                            max_tree_nodes=len(parents) if parents else 0)
    fill = [(7 * i) % 1000 + 1 for i in range(args.depth)]
    for i in range(0, args.depth, 64):
        ctx.eval(fill[i:i + 64])
    batch = [300 + i for i in range(args.batch)]
    if args.batch > 1:
        ctx.save_state()  # the recurrent layers roll back only to a saved position

    def step(t):
        # decode: one token appended per step; a batch: N tokens at the depth, then back to it
        if parents:
            ctx.verify_tree(batch, parents)
            ctx.truncate(args.depth)
        elif args.batch == 1:
            ctx.eval_argmax([200 + t])
        else:
            ctx.eval_argmax(batch)
            ctx.truncate(args.depth)

    for t in range(8):
        step(t)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for t in range(args.tokens):
            step(t)
        wall = (time.perf_counter() - t0) / args.tokens
    mode = "tree" if parents else "decode" if args.batch == 1 else "batch"
    return write_rows(args, prof, mode, args.tokens, wall, {"batch": args.batch, "depth": args.depth})


def kernel_times(prof):
    """{kernel name: [calls, device microseconds]} over a profile's CUDA events."""
    per_name = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type.name == "CUDA" or getattr(event, "device_time", 0):
            per_name[event.name][0] += 1
            per_name[event.name][1] += event.device_time if hasattr(event, "device_time") else event.cuda_time
    return per_name


def write_rows(args, prof, mode: str, n_steps: int, wall: float, fields: dict) -> int:
    """One row for the whole step and one per kernel name, per step (a decode token, a batch, a
    verify or a speculative step), printed and appended to --out."""
    per_name = kernel_times(prof)
    kernel_us = sum(v[1] for v in per_name.values()) / n_steps
    overlap = os.environ.get("SPECLA_CUDA_PDL", "1") != "0"
    if overlap:
        print("profile_gpu_step: launch overlap is on (SPECLA_CUDA_PDL unset): kernel spans include their waits; "
              "set SPECLA_CUDA_PDL=0 for per-kernel times", file=sys.stderr)
    rows = [{"commit": args.commit, "model": os.path.basename(args.model), "launch_overlap": overlap,
             "mode": f"{mode}-profile", **fields,
             "wall_ms_per_token": round(wall * 1e3, 3), "kernel_ms_per_token": round(kernel_us / 1e3, 3),
             "kernels_per_token": sum(v[0] for v in per_name.values()) / n_steps}]
    for name, (calls, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        rows.append({"mode": f"{mode}-kernel", **fields, "kernel": name[:120], "calls_per_token": calls / n_steps,
                     "us_per_token": round(us / n_steps, 1), "mean_us": round(us / calls, 2),
                     "share_of_kernel_time": round(us / n_steps / kernel_us, 4)})
    for row in rows[:40]:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


class phase_ranges:
    """With `on`, labels each step's phases as host ranges of the profile: the drafter's proposal
    (DFlashDrafter.propose), the verify (Context.verify_tree) and the accept (Context.accept)."""

    def __init__(self, on: bool):
        self.on, self.saved = on, []

    def __enter__(self):
        if not self.on:
            return self
        from torch.profiler import record_function

        from pyspecla.model import Context
        from pyspecla.speculative.drafters.dflash import DFlashDrafter

        def labelled(cls, name, label):
            original = getattr(cls, name)

            def wrapper(*a, **k):
                with record_function(label):
                    return original(*a, **k)
            self.saved.append((cls, name, original))
            setattr(cls, name, wrapper)
        labelled(DFlashDrafter, "propose", "phase:draft")
        labelled(Context, "verify_tree", "phase:verify")
        labelled(Context, "accept", "phase:accept")
        return self

    def __exit__(self, *exc):
        for cls, name, original in self.saved:
            setattr(cls, name, original)
        return False


def write_timeline(prof, path: str) -> None:
    """GPU activities (kernels, copies) and phase ranges, one JSON object per line: kind, name,
    start and end (microseconds, the profiler's one clock)."""
    with open(path, "w") as f:
        for e in prof.events():
            r = e.time_range
            if e.name.startswith("phase:"):
                if e.device_type.name == "CUDA":
                    continue  # the profiler's GPU-side copy of a host range
                kind = "phase"
            elif e.device_type.name == "CUDA":
                kind = "gpu"
            elif e.name.startswith("cuda") and ("Launch" in e.name or "Memcpy" in e.name or "Synchronize" in e.name
                                                or "Graph" in e.name or "Event" in e.name):
                kind = "api"
            else:
                continue
            f.write(json.dumps({"kind": kind, "name": e.name[:80], "start": round(r.start, 2),
                                "end": round(r.end, 2)}) + "\n")


def profile_spec_steps(model, args) -> int:
    """Speculative steps with the DFlash draft's cost, as bench_gpu_e2e.py --draft-cost runs them
    (6 accepted tokens per step, recorded steps): one untimed run records the graphs, then one
    profiled run; "per token" in the rows is per speculative step."""
    import numpy as np
    from torch.profiler import ProfilerActivity, profile

    from bench_gpu_e2e import BUDGET, DRAFT_VOCAB, MODES, N_PROMPT, run_spec, solve_p  # noqa: E402  (tools/)
    from pyspecla.dflash_draft import DFlashDraft

    draft = DFlashDraft.load(args.spec_draft, model)
    n_predict = max(args.tokens, 24)
    prompt = np.random.default_rng(0).integers(0, model.hparams.n_vocab, N_PROMPT).tolist()
    continuation = model.generate(prompt, n_predict + 16)
    methods = MODES["ddtree+specla"]
    ctx = model.new_context(n_ctx=N_PROMPT + n_predict + BUDGET + 2, max_tree_nodes=BUDGET + 1,
                            verify_method=methods[1], commit_method=methods[2], recorded_steps=True,
                            capture_layers=draft.target_layer_ids)
    p = solve_p(6.0)

    def run(n: int) -> dict:
        return run_spec(model, ctx, True, prompt, n, p, continuation, BUDGET, draft, DRAFT_VOCAB)

    run(24)  # records the graphs
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.timeline else [])
    with profile(activities=activities) as prof, phase_ranges(bool(args.timeline)):
        result = run(n_predict)
    if args.timeline:
        write_timeline(prof, args.timeline)
    steps = max(result["steps"], 1)
    return write_rows(args, prof, "spec", steps, result["step_ms"] / 1e3,
                      {"steps": steps, "mean_accepted": round(result["mean_accepted"], 3),
                       "draft": os.path.basename(args.spec_draft)})


if __name__ == "__main__":
    raise SystemExit(main())
