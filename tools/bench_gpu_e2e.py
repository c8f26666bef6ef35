#!/usr/bin/env python3
"""End-to-end speculative decoding speed on one model file with the controlled-acceptance oracle
drafter (pyspecla/speculative/drafters/oracle.py), at chosen mean accepted tokens per step
(default 4, 6, 8), against plain decoding on the same kind of context, with each speculative
step's time broken down. Writes one JSON row per (mode, target, recorded steps) (commit, device,
model, mode, figures) and prints a table.

    python tools/bench_gpu_e2e.py --model 27b-q4_k_m-speed-only.gguf --device cuda --out rows.jsonl
    python tools/bench_gpu_e2e.py --model tiny.gguf --device cpu --quick

Setup. The prompt is --n-prompt random token ids (seeded). The target's greedy continuation is
decoded once, plainly, before anything is timed: the oracle drafter proposes from it (true token
at rank 0 with probability p per depth, random wrong tokens otherwise), and it is the reference
every run's tokens must equal (`same_as_plain`). The tree is a DDTree of --budget nodes besides the
root (top-4, tau 6, chain seed: a 15-deep rank-0 spine), so a step commits 1 + the run of hits along
the spine; p is solved from 1 + sum_{i=1..15} p^i = target, and every row reports the measured mean
(`mean_accepted`, tokens committed per step: the accepted drafted tokens plus the bonus token).

Modes: `plain` (Context.eval_argmax one token at a time: the plain path; a GPU replays its
recorded decode step), `ddtree+specla` (HLD chains + deferred factor commit) and `ddtree-dense`
(dense per-node checkpoints + restore), the default three, and on request `ddtree+specla-now` (HLD
chains, the accepted path folded at accept rather than in the next verify), each with recorded steps on and off
(new_context(recorded_steps=...): graph replay vs eager, for plain decode steps, the speculative
steps' verifies and a --draft-cost draft's proposals alike, docs/gpu-steps.md; the CPU records nothing, the rows are there
all the same). Every context is made with the same parameters (tree capacity, methods),
once per mode, and reset before each run. Runs alternate between modes within a repetition and
the order flips every repetition; tokens/s is the median over --reps repetitions, and
`speedup_vs_plain` divides it by the plain median of the same recorded setting (`speedup_paired`:
the median of the per-repetition quotients).

Breakdown per step (ms; from the loop's timers, pyspecla/speculative/loop.py): draft (the
drafter's proposal), tree (building the DDTree), verify (verify_tree; it builds the HLD schedule
inside, whose cost `hld_ms` is measured apart, after the run, by timing the library's builder
on the run's own trees), accept (the greedy walk and Context.accept; on a GPU accept only queues
its device work, which then finishes inside the next verify), host (the rest of the step: the
loop's bookkeeping); `host_work_ms` sums tree, HLD, accept and host, `host_work_share` divides it by
the step (issue 14 keeps it at 3 % at most). Launches, kernels run and host waits per step (Context.step_counters, -1 on the CPU) are
counted from the first verify to the end of the run (the final fold of the pending path included).
Tokens/s counts the decode phase (after the prompt pass), as the loop's own figure does. Before
the repetitions each configuration runs --warmup times (24 tokens, untimed): a context records its
graphs in its first run, and rows with one repetition counted that recording in their launches and
time.

The draft's cost (--draft-cost DRAFT.gguf, a DFlash draft for the target, e.g. the synthetic one of
the published 27B shape that tools/bench_draft_head.py writes): each speculative step also runs the
draft's proposal, whose tokens are dropped (DraftCostOracle), and the speculative contexts capture
its feature layers. The acceptance stays the oracle's; `draft_ms` then holds the draft's time, and
the rows add the draft context's own launches and host waits per step."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import commit  # noqa: E402
from bench_cpu import append_rows  # noqa: E402
from bench_gpu_spec import device_label, exit_with  # noqa: E402

MODES = {  # name: (specla, verify_method, commit_method); None = plain decoding
    "plain": None,
    "ddtree+specla": (True, "hld_chains", "deferred_factors"),
    "ddtree-dense": (False, "dense_checkpoints", "checkpoint_restore"),
    # SpecLA with the accepted path folded at accept (not inside the next verify): its device work
    # is queued before the host's proposal and tree for the next step, so it can run while the
    # host works; on request only (--modes)
    "ddtree+specla-now": (True, "hld_chains", "factors_now"),
}
DEFAULT_MODES = ("plain", "ddtree+specla", "ddtree-dense")
SPINE_DEPTH = 15  # SpecConfig.max_depth: the rank-0 spine a DDTree seeds with
N_PROMPT = 32  # prompt tokens of a run (--n-prompt; quick: 8)
BUDGET = 22  # DDTree nodes besides the root (--budget)
DRAFT_VOCAB = 32768  # rows of the head a --draft-cost draft scores (--draft-vocab)


def solve_p(target: float, depth: int = SPINE_DEPTH) -> float:
    """p with 1 + sum_{i=1..depth} p^i = target (bisection; the left side grows with p)."""
    if not 1.0 < target < 1.0 + depth:
        raise ValueError(f"accepted tokens per step must be in (1, {1 + depth}), got {target}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1.0 + sum(mid ** i for i in range(1, depth + 1)) < target else (lo, mid)
    return (lo + hi) / 2


class ObservedContext:
    """The context a speculative run drives, seen through: records each verified tree's parents
    and resets the launch counters at the first verify, so they count the decode steps and not
    the prompt pass. Everything else goes to the context unchanged."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.trees: list[np.ndarray] = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def verify_tree(self, tokens, parents, want_logits: bool = False):
        if not self.trees:
            self._ctx.launch_counters()
        self.trees.append(parents)
        return self._ctx.verify_tree(tokens, parents, want_logits)


class DraftCostOracle:
    """The oracle's proposals at a DFlash draft's price: every step first runs the draft's own
    proposal (feature ingest, the block forward, log-softmax and top-k on the device, the one
    read-back), drops its tokens (a synthetic draft's guesses are noise) and returns the oracle's.
    The acceptance stays the controlled one; the step pays what a real DFlash step pays, and the
    target context captures the draft's feature layers as a real run does."""

    def __init__(self, oracle, dflash):
        self.oracle, self.dflash = oracle, dflash
        self.capture_layers = list(dflash.capture_layers)

    @property
    def generated(self) -> int:
        return self.oracle.generated

    @generated.setter
    def generated(self, n: int) -> None:
        self.oracle.generated = n

    @property
    def history(self):  # absent (AttributeError) unless the draft scores a reduced vocabulary
        return self.dflash.history

    @history.setter
    def history(self, value) -> None:
        self.dflash.history = value

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        self.dflash.propose(target_ctx, root_token, n_depths, top_k)
        return self.oracle.propose(target_ctx, root_token, n_depths, top_k)


def hld_ms(trees, capacity: int) -> float:
    """Total ms of building the HLD schedules of these trees with the library's builder (the
    function verify_tree runs first), one ctypes call each."""
    from pyspecla._native import check, int32_ptr, lib

    schedule = np.zeros(lib.specla_hld_size(capacity), dtype=np.int32)
    parents = [np.ascontiguousarray(np.asarray(p, dtype=np.int32)) for p in trees]
    t0 = time.perf_counter()
    for p in parents:
        check(lib.specla_hld_build(int32_ptr(p), len(p), capacity, int32_ptr(schedule), len(schedule)))
    return (time.perf_counter() - t0) * 1e3


# the parts of breakdown_ms that are the host's work (draft and verify are device work and its wait)
HOST_WORK_PARTS = ("tree_ms", "hld_ms", "accept_ms", "host_ms")


def per_step(count: int, steps: int) -> float | None:
    """A backend counter per step; None where the backend does not count (-1: the CPU)."""
    return count / steps if count >= 0 else None


def run_plain(ctx, prompt, n_predict: int) -> dict:
    ctx.reset()
    out = [ctx.eval_argmax(prompt)]
    ctx.launch_counters()
    t0 = time.perf_counter()
    for _ in range(n_predict - 1):
        out.append(ctx.eval_argmax([out[-1]]))
    decode_s = time.perf_counter() - t0
    launches, waits, kernels = ctx.step_counters()
    steps = max(n_predict - 1, 1)
    return {"tokens": out, "tokens_per_s": (n_predict - 1) / decode_s, "steps": n_predict - 1,
            "mean_accepted": 1.0, "step_ms": decode_s * 1e3 / steps,
            "launches_per_step": per_step(launches, steps), "kernels_per_step": per_step(kernels, steps),
            "host_waits_per_step": per_step(waits, steps)}


def run_spec(model, ctx, specla: bool, prompt, n_predict: int, p: float, continuation, budget: int,
             draft=None, draft_vocab: int = 0) -> dict:
    from pyspecla.speculative.drafters import DFlashDrafter, OracleDrafter
    from pyspecla.speculative.loop import SpecConfig, generate

    ctx.reset()
    drafter = OracleDrafter(p, continuation, model.hparams.n_vocab, seed=0)
    if draft is not None:  # a fresh draft context per run, as a run of its own would make
        drafter = DraftCostOracle(drafter, DFlashDrafter(draft, n_ctx=ctx.n_ctx, vocab=draft_vocab or None,
                                                         recorded_steps=ctx.recorded_steps))
    observed = ObservedContext(ctx)
    config = SpecConfig(mode="ddtree", specla=specla, budget=budget, tau=6.0, top_k=4,
                        max_depth=SPINE_DEPTH)
    stats, _ = generate(model, prompt, n_predict, config, drafter=drafter, context=observed)
    launches, waits, kernels = ctx.step_counters()
    steps = max(stats.steps, 1)
    step_ms = stats.decode_s * 1e3 / steps
    draft_counts = {}
    if draft is not None:  # the draft context's own backend: its launches and its top-k read-backs
        d_launches, d_waits = drafter.dflash.context.launch_counters()
        draft_counts = {"draft_launches_per_step": per_step(d_launches, steps),
                        "draft_host_waits_per_step": per_step(d_waits, steps)}
        drafter.dflash.context.close()  # the run's own draft context (its device memory) ends with it
    hld = hld_ms(observed.trees, budget + 1) / steps
    verify = (stats.verify_ms - stats.accept_ms) / steps
    breakdown = {"draft_ms": (stats.draft_ms - stats.tree_ms) / steps, "tree_ms": stats.tree_ms / steps,
                 "hld_ms": hld, "verify_ms": verify - hld, "accept_ms": stats.accept_ms / steps,
                 "host_ms": step_ms - (stats.draft_ms + stats.verify_ms) / steps}
    return {"tokens": stats.tokens, "tokens_per_s": stats.tokens_per_s, "steps": stats.steps,
            "mean_accepted": stats.mean_accepted, "step_ms": step_ms,
            "mean_tree_nodes": float(np.mean(stats.tree_nodes_per_step)) if stats.tree_nodes_per_step else 0.0,
            "side_branch_steps": stats.side_branch_steps, "breakdown": breakdown,
            "verify_ms_including_hld": verify,
            "launches_per_step": per_step(launches, steps), "kernels_per_step": per_step(kernels, steps),
            "host_waits_per_step": per_step(waits, steps), **draft_counts}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target GGUF")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--targets", default="4,6,8", help="mean tokens committed per step to aim at (default 4,6,8)")
    parser.add_argument("-n", "--n-predict", type=int, default=None, help="tokens per run (default 256; quick 24)")
    parser.add_argument("--n-prompt", type=int, default=None, help=f"prompt tokens (default {N_PROMPT}; quick 8)")
    parser.add_argument("--budget", type=int, default=BUDGET, help=f"DDTree nodes besides the root (default {BUDGET})")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 3; quick 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs of each configuration (24 tokens) before the repetitions (default 1)")
    parser.add_argument("--recorded", default="on,off", help="recorded steps: on, off or on,off (default both)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--draft-cost", default=None, metavar="DRAFT.gguf",
                        help="a DFlash draft for the target: each speculative step also runs its proposal "
                             "(tokens dropped) so the figures include the draft's cost (DraftCostOracle)")
    parser.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB,
                        help="with --draft-cost: the draft scores this many of the head's rows (0: all)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    parser.add_argument("--quick", action="store_true", help="24 tokens, an 8-token prompt, 1 repetition")
    parser.add_argument("--out", default=None, help="append the JSON rows here")
    parser.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD here)")
    args = parser.parse_args(argv)
    n_predict = args.n_predict or (24 if args.quick else 256)
    n_prompt = args.n_prompt or (8 if args.quick else N_PROMPT)
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    modes = [m for m in args.modes.split(",") if m]
    recorded = [r for r in args.recorded.split(",") if r]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"--modes: unknown {unknown}; choose from {list(MODES)}")
    if "plain" not in modes:
        modes.insert(0, "plain")  # the denominator is always measured in the same repetitions
    if any(r not in ("on", "off") for r in recorded) or not recorded:
        parser.error(f"--recorded takes on, off or on,off, got {args.recorded!r}")
    try:
        targets = [float(t) for t in args.targets.split(",") if t]
        ps = {t: solve_p(t) for t in targets}
    except ValueError as e:
        parser.error(f"--targets: {e}")
    if n_predict < 2 or n_prompt < 1 or reps < 1 or args.warmup < 0 or args.budget < SPINE_DEPTH:
        parser.error(f"-n must be >= 2, --n-prompt and --reps >= 1, --warmup >= 0, --budget >= {SPINE_DEPTH} (the spine)")

    from pyspecla import Model
    from pyspecla.errors import SpeclaError

    try:
        model = Model.load(args.model, n_threads=args.threads, device=args.device)
    except (SpeclaError, OSError) as e:
        print(f"bench_gpu_e2e: {e}", file=sys.stderr)
        return 2
    draft = None
    if args.draft_cost:
        from pyspecla.dflash_draft import DFlashDraft

        try:
            draft = DFlashDraft.load(args.draft_cost, model, n_threads=args.threads)
        except (SpeclaError, OSError) as e:
            print(f"bench_gpu_e2e: --draft-cost: {e}", file=sys.stderr)
            return 2
    V = model.hparams.n_vocab
    prompt = np.random.default_rng(0).integers(0, V, n_prompt).tolist()
    # the oracle's answer and every run's reference, decoded plainly before anything is timed
    continuation = model.generate(prompt, n_predict + 16)
    base = {"commit": args.commit or commit(), "device": device_label(args.device), "backend": args.device,
            "model": os.path.basename(args.model), "n_predict": n_predict, "n_prompt": n_prompt,
            "budget": args.budget, "reps": reps, "warmup": args.warmup, "quick": args.quick,
            "draft_cost": os.path.basename(args.draft_cost) if draft is not None else None,
            "draft_vocab": args.draft_vocab if draft is not None else None}
    n_ctx = n_prompt + n_predict + args.budget + 2

    # one context per (mode, recorded): the same parameters for every mode
    contexts = {}
    for rec in recorded:
        for mode in modes:
            methods = MODES[mode] or MODES["ddtree+specla"]
            # the draft's feature layers are captured by the speculative contexts only: plain
            # decoding, the denominator, does not pay for them
            capture = draft.target_layer_ids if draft is not None and mode != "plain" else None
            contexts[(mode, rec)] = model.new_context(n_ctx=n_ctx, max_tree_nodes=args.budget + 1,
                                                      verify_method=methods[1], commit_method=methods[2],
                                                      recorded_steps=rec == "on", capture_layers=capture)

    runs = [(mode, rec, t) for rec in recorded for mode in modes for t in ([None] if mode == "plain" else targets)]

    def run_once(run, n: int) -> dict:
        mode, rec, target = run
        ctx = contexts[(mode, rec)]
        if mode == "plain":
            return run_plain(ctx, prompt, n)
        return run_spec(model, ctx, MODES[mode][0], prompt, n, ps[target], continuation, args.budget, draft,
                        args.draft_vocab)

    # a context's first run records its graphs (decode, verify, accept): runs that count only steady
    # steps come after one untimed run of each configuration
    for _ in range(args.warmup):
        for run in runs:
            run_once(run, min(n_predict, 24))
    results = {run: [] for run in runs}
    for rep in range(reps):
        for run in (runs if rep % 2 == 0 else runs[::-1]):
            mode, rec, target = run
            results[run].append(run_once(run, n_predict))
            print(f"# rep {rep} {mode} recorded={rec} target={target}: "
                  f"{results[run][-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)

    rows = []
    reference = continuation[:n_predict]
    for run in runs:
        mode, rec, target = run
        rs = results[run]
        plain = results[("plain", rec, None)]
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        plain_tps = statistics.median(r["tokens_per_s"] for r in plain)
        row = dict(base, mode=mode, recorded_steps=rec == "on", ctx_device=contexts[(mode, rec)].device,
                   tokens_per_s=round(tps, 3), runs_tokens_per_s=[round(r["tokens_per_s"], 3) for r in rs],
                   speedup_vs_plain=round(tps / plain_tps, 4),
                   speedup_paired=round(statistics.median(r["tokens_per_s"] / q["tokens_per_s"]
                                                          for r, q in zip(rs, plain)), 4),
                   steps=rs[-1]["steps"], mean_accepted=round(statistics.median(r["mean_accepted"] for r in rs), 4),
                   step_ms=round(statistics.median(r["step_ms"] for r in rs), 4),
                   launches_per_step=rs[-1]["launches_per_step"], kernels_per_step=rs[-1]["kernels_per_step"],
                   host_waits_per_step=rs[-1]["host_waits_per_step"],
                   same_as_plain=all(r["tokens"] == reference for r in rs))
        if mode != "plain":
            if draft is not None:
                row.update(draft_launches_per_step=rs[-1]["draft_launches_per_step"],
                           draft_host_waits_per_step=rs[-1]["draft_host_waits_per_step"])
            row.update(target_accepted=target, oracle_p=round(ps[target], 5),
                       mean_tree_nodes=round(rs[-1]["mean_tree_nodes"], 3), side_branch_steps=rs[-1]["side_branch_steps"],
                       verify_ms_including_hld=round(statistics.median(r["verify_ms_including_hld"] for r in rs), 4),
                       breakdown_ms={k: round(statistics.median(r["breakdown"][k] for r in rs), 4)
                                     for k in rs[0]["breakdown"]})
            # issue 14's host budget: the host's own work per step (the tree, the HLD schedule, the
            # accept walk with its queued launches, the loop's bookkeeping) over the step
            host_work = sum(row["breakdown_ms"][k] for k in HOST_WORK_PARTS)
            row.update(host_work_ms=round(host_work, 4), host_work_share=round(host_work / row["step_ms"], 4))
        rows.append(row)
        print(json.dumps(row), flush=True)
    for ctx in contexts.values():
        ctx.close()
    if draft is not None:
        draft.close()
    model.close()

    print(f"# {base['device']}, {base['model']}, commit {base['commit']}, {n_predict} tokens, {reps} reps; "
          "breakdown in ms per step")
    print(f"{'mode':<14} {'rec':<4} {'target':>6} {'acc/step':>8} {'tok/s':>9} {'x plain':>7} {'same':>5}  "
          f"{'draft':>7} {'tree':>7} {'hld':>7} {'verify':>8} {'accept':>7} {'host':>7}  {'launch':>7} {'waits':>6}")
    for r in rows:
        b = r.get("breakdown_ms") or {}
        cells = " ".join(f"{b[k]:>7.3f}" if k in b else f"{'':>7}" for k in ("draft_ms", "tree_ms", "hld_ms"))
        verify = f"{b['verify_ms']:>8.3f}" if b else f"{'':>8}"
        tail = " ".join(f"{b[k]:>7.3f}" if k in b else f"{'':>7}" for k in ("accept_ms", "host_ms"))
        launches = r["launches_per_step"]
        waits = r["host_waits_per_step"]
        print(f"{r['mode']:<14} {'on' if r['recorded_steps'] else 'off':<4} {r.get('target_accepted') or '':>6} "
              f"{r['mean_accepted']:>8.2f} {r['tokens_per_s']:>9.1f} {r['speedup_vs_plain']:>6.2f}x "
              f"{str(r['same_as_plain']):>5}  {cells} {verify} {tail}  "
              f"{launches if launches is None else round(launches, 1)!s:>7} "
              f"{waits if waits is None else round(waits, 2)!s:>6}")
    append_rows(rows, args.out)
    return 0 if all(r["same_as_plain"] for r in rows) else 1


if __name__ == "__main__":
    exit_with(main, "bench_gpu_e2e")
