#!/usr/bin/env python3
"""Whole-model verify cost on one model file: a 23-node DDTree verify (Context.verify_tree with one
fixed, realistic tree shape) with SpecLA on (HLD chains + deferred factor commit) and off (dense
per-node checkpoints + restore), against one plain decode step at the same depth, and the cost of
accept(), all in decode steps. Depths 0 and 4096 by default. Writes one JSON row per figure
(commit, device, model, mode, figures) and prints a table.

    python tools/bench_gpu_spec.py --model 27b-q4_k_m-speed-only.gguf --device cuda --out rows.jsonl
    python tools/bench_gpu_spec.py --model tiny.gguf --device cpu --quick

The tree: bench_specla's DDTree shape grown to 23 nodes (a 12-node top-1 spine from the root, then
11 nodes best first by path probability with rank probabilities 0.8 / 0.1 / 0.05 / 0.03), token ids
fixed by a seed. Two accepted paths: the spine's first 6 nodes (the tree's first nodes in order: no
KV rows move) and a side branch, the root path with the most nodes off the spine ([0, 1, 13, 17, 22]:
3 KV rows move into place).

Method. One context per SpecLA setting, each filled to the depth and saved there (save_state); every
measurement starts from the saved state and goes back to it (truncate, not timed). Per repetition,
in an order that alternates between repetitions (so drift hits every figure alike), each context
runs: a decode step (eval_argmax of one token: the plain path, a replayed recorded step on a GPU);
a verify with nothing pending; a verify, then accept(spine path) timed alone between two
Context.sync() calls; then a verify with that path pending (where SpecLA folds it: the steady
state of a speculative step); a verify, then accept(side path), timed the same way. A decode or
verify is timed up to the return of its argmax, the step's one read-back. Each figure is the
median over --reps repetitions after one warm-up; `decode_steps` divides it by the median decode
step of the same context at the same depth, measured in the same repetitions. --recorded off runs
every op eagerly (by default a GPU replays its recorded decode step and verifies that return only
the argmax, docs/gpu-steps.md); the rows say which (`recorded_steps`).

Launches, host waits and kernels run (Context.step_counters, None on the CPU) are counted around
one decode step and one verify per context and depth. Exactness, checked untimed at every depth: the verify's
logits with SpecLA on equal those with it off bit for bit, and every node's logits row equals the
last row of evaluating that node's root path from the depth (plain prefill), bit for bit."""

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

from bench_cpu import append_rows, cpu_name  # noqa: E402
from bench_gpu import commit, device_name, timed_context_size  # noqa: E402
from bench_specla import DDTREE_RANK_PROBS, best_first_tree  # noqa: E402

TREE_NODES = 23
SPINE_NODES = 12
SPINE_ACCEPTED = 6
SETTINGS = {  # name: (verify_method, commit_method)
    "specla": ("hld_chains", "deferred_factors"),
    "dense": ("dense_checkpoints", "checkpoint_restore"),
}


def root_path(parents, node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def verify_tree_shape() -> tuple[list[int], list[int], list[int]]:
    """(parents, spine path, side path) of the benchmark tree. The side path is the root path with
    the most nodes off the spine (then the longest, then the lowest node): the accept that moves
    the most KV rows."""
    parents = best_first_tree(TREE_NODES, DDTREE_RANK_PROBS, max_depth=TREE_NODES - 1, spine_nodes=SPINE_NODES)
    paths = [root_path(parents, t) for t in range(TREE_NODES)]
    side = max(paths, key=lambda p: (sum(t >= SPINE_NODES for t in p), len(p), -p[-1]))
    return parents, list(range(SPINE_ACCEPTED)), side


def device_label(device: str) -> str:
    return f"cuda: {device_name()}" if device.startswith("cuda") else f"cpu: {cpu_name()} ({os.cpu_count()} cores)"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


class Measured:
    """One context at one depth: the timed operations, each returning seconds."""

    def __init__(self, ctx, depth: int, tokens, parents, spine, side, decode_token: int):
        self.ctx, self.depth = ctx, depth
        self.tokens, self.parents, self.spine, self.side = tokens, parents, spine, side
        self.decode_token = decode_token

    def decode(self) -> float:
        t0 = time.perf_counter()
        self.ctx.eval_argmax([self.decode_token])
        t1 = time.perf_counter()
        self.ctx.truncate(self.depth)
        return t1 - t0

    def _verify(self) -> float:
        t0 = time.perf_counter()
        self.ctx.verify_tree(self.tokens, self.parents)  # returns the argmax: the step's read-back
        return time.perf_counter() - t0

    def verify(self) -> float:
        dt = self._verify()
        self.ctx.truncate(self.depth)  # drops the verified tree
        return dt

    def _accept(self, path) -> float:
        self._verify()
        self.ctx.sync()
        t0 = time.perf_counter()
        self.ctx.accept(path)
        self.ctx.sync()
        return time.perf_counter() - t0

    def accept_then_verify(self) -> tuple[float, float]:
        """accept(spine) alone, then the next verify with that path pending."""
        accept = self._accept(self.spine)
        verify = self._verify()
        self.ctx.truncate(self.depth)  # back to the saved state; the pending path is dropped
        return accept, verify

    def accept_side(self) -> float:
        dt = self._accept(self.side)
        self.ctx.truncate(self.depth)
        return dt


def fill(ctx, depth: int, n_vocab: int) -> None:
    ctx.reset()
    tokens = [(i * 7 + 3) % n_vocab for i in range(depth)]
    for i in range(0, len(tokens), ctx.max_batch):
        ctx.eval(tokens[i:i + ctx.max_batch])
    ctx.save_state()


def exactness(contexts: dict, depth: int, tokens, parents) -> dict:
    """Untimed: the verify's logits, SpecLA on vs off, and every node vs prefilling its root path."""
    logits = {}
    for name, ctx in contexts.items():
        _, logits[name] = ctx.verify_tree(tokens, parents, want_logits=True)
        ctx.truncate(depth)
    on_off = same_bits(logits["specla"], logits["dense"])
    ctx = contexts["specla"]
    differing = []
    for node in range(len(parents)):
        path = root_path(parents, node)
        rows = ctx.eval([int(tokens[i]) for i in path], logits_all=True)
        ctx.truncate(depth)
        if not same_bits(rows[-1], logits["specla"][node]):
            differing.append(node)
    return {"same_logits_specla_vs_dense": on_off, "nodes_checked": len(parents),
            "nodes_differing_from_prefill": differing, "exact": on_off and not differing}


def counters_of(ctx, fn) -> tuple[int | None, int | None, int | None]:
    """(launches, host waits, kernels run) of one call of fn; None each on the CPU."""
    ctx.launch_counters()
    fn()
    counts = ctx.step_counters()
    return tuple(c if c >= 0 else None for c in counts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target GGUF")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--depths", default=None, help="comma-separated context depths (default 0,4096; quick 0,32)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per figure (default 15; quick 3)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    parser.add_argument("--quick", action="store_true", help="depths 0,32 and 3 repetitions: a smoke run")
    parser.add_argument("--out", default=None, help="append the JSON rows here")
    parser.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD here)")
    parser.add_argument("--recorded", choices=("on", "off"), default="on",
                        help="on (default): a GPU replays recorded decode and verify steps; off: every op eagerly")
    parser.add_argument("--n-ctx", type=int, default=None,
                        help="the contexts' size in tokens (default: what the depths and the tree need); a larger "
                             "one shows what a user's -c costs a verify at the same depth")
    args = parser.parse_args(argv)
    try:
        depths = [int(d) for d in (args.depths or ("0,32" if args.quick else "0,4096")).split(",") if d != ""]
    except ValueError:
        parser.error(f"--depths must be comma-separated integers, got {args.depths!r}")
    reps = args.reps if args.reps is not None else (3 if args.quick else 15)
    if reps < 1 or not depths or min(depths) < 0:
        parser.error("--reps must be >= 1 and --depths non-negative")
    n_ctx = timed_context_size(parser, args.n_ctx, max(depths) + 2 * TREE_NODES + 16, "the depths and the tree")

    from pyspecla import Model
    from pyspecla.errors import SpeclaError

    try:
        model = Model.load(args.model, n_threads=args.threads, device=args.device)
    except (SpeclaError, OSError) as e:
        print(f"bench_gpu_spec: {e}", file=sys.stderr)
        return 2
    base = {"commit": args.commit or commit(), "device": device_label(args.device), "backend": args.device,
            "model": os.path.basename(args.model), "quick": args.quick, "recorded_steps": args.recorded == "on",
            "n_ctx": n_ctx}
    rows = []

    def emit(mode: str, **figures) -> None:
        row = dict(base, mode=mode, **figures)
        rows.append(row)
        print(json.dumps(row), flush=True)

    parents, spine, side = verify_tree_shape()
    V = model.hparams.n_vocab
    rng = np.random.default_rng(0)
    contexts = {name: model.new_context(n_ctx=n_ctx, max_batch=64, max_tree_nodes=TREE_NODES, verify_method=v,
                                        commit_method=c, recorded_steps=args.recorded == "on")
                for name, (v, c) in SETTINGS.items()}
    emit("tree", n_nodes=TREE_NODES, parents=parents, spine_path=spine, side_path=side,
         ctx_device=contexts["specla"].device)
    table = []
    for depth in depths:
        tokens = rng.integers(0, V, TREE_NODES).astype(np.int32)
        for ctx in contexts.values():
            fill(ctx, depth, V)
        measured = {name: Measured(ctx, depth, tokens, parents, spine, side, decode_token=int(tokens[0]))
                    for name, ctx in contexts.items()}
        exact = exactness(contexts, depth, tokens, parents)
        emit("verify-exactness", depth=depth, **exact)

        figures = {name: {k: [] for k in ("decode", "verify", "accept", "verify_pending", "accept_side")}
                   for name in measured}
        order = list(measured)
        for rep in range(reps + 1):
            for name in (order if rep % 2 == 0 else order[::-1]):
                m = measured[name]
                ops = [("decode", m.decode), ("verify", m.verify), ("accept_then_verify", m.accept_then_verify),
                       ("accept_side", m.accept_side)]
                for key, fn in (ops if rep % 2 == 0 else ops[::-1]):
                    result = fn()
                    if rep == 0:
                        continue  # warm-up
                    if key == "accept_then_verify":
                        figures[name]["accept"].append(result[0])
                        figures[name]["verify_pending"].append(result[1])
                    else:
                        figures[name][key].append(result)

        for name, ctx in contexts.items():
            f = {k: statistics.median(v) for k, v in figures[name].items()}
            decode = f["decode"]
            launches_decode, waits_decode, kernels_decode = counters_of(ctx, measured[name].decode)
            launches_verify, waits_verify, kernels_verify = counters_of(ctx, measured[name].verify)
            ctx.verify_tree(tokens, parents)
            stats = ctx.tree_stats()
            ctx.truncate(depth)
            v_method, c_method = SETTINGS[name]
            common = {"depth": depth, "specla": name == "specla", "verify_method": v_method,
                      "commit_method": c_method, "reps": reps, "decode_ms": round(decode * 1e3, 4)}
            emit("decode", **common, ms=round(decode * 1e3, 4), runs_ms=[round(x * 1e3, 4) for x in figures[name]["decode"]],
                 launches=launches_decode, host_waits=waits_decode, kernels=kernels_decode)
            table.append((depth, name, "decode", decode * 1e3, 1.0))
            for key, what in (("verify", "verify, nothing pending"),
                              ("verify_pending", f"verify with the {len(spine)}-token spine path pending"),
                              ("accept", f"accept of the {len(spine)}-node spine path (no compaction)"),
                              ("accept_side", f"accept of the {len(side)}-node side path (KV rows move)")):
                extra = {}
                if key == "verify":
                    extra = {"launches": launches_verify, "host_waits": waits_verify, "kernels": kernels_verify,
                             "tree_stats": stats}
                emit(key.replace("_", "-"), **common, n_nodes=TREE_NODES, timed=what, ms=round(f[key] * 1e3, 4),
                     decode_steps=round(f[key] / decode, 4),
                     runs_ms=[round(x * 1e3, 4) for x in figures[name][key]], **extra)
                table.append((depth, name, key, f[key] * 1e3, f[key] / decode))

    for ctx in contexts.values():
        ctx.close()
    model.close()

    print(f"# {base['device']}, {base['model']}, commit {base['commit']}, {reps} reps; decode steps = figure / "
          "the same context's decode step at that depth")
    print(f"{'depth':>6} {'setting':<7} {'figure':<15} {'ms':>10} {'decode steps':>13}")
    for depth, name, key, ms, steps in table:
        print(f"{depth:>6} {name:<7} {key:<15} {ms:>10.3f} {steps:>13.3f}")
    exact_rows = [r for r in rows if r["mode"] == "verify-exactness"]
    print("# exact (SpecLA on == off, every node == prefill of its path): "
          + ", ".join(f"depth {r['depth']}: {r['exact']}" for r in exact_rows))
    append_rows(rows, args.out)
    return 0 if all(r["exact"] for r in exact_rows) else 1


def exit_with(main, name: str) -> None:
    """sys.exit(main()); a library error (e.g. a device this build or machine lacks) is its one-line
    message and exit status 2, not a traceback."""
    from pyspecla.errors import SpeclaError

    try:
        sys.exit(main())
    except SpeclaError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    exit_with(main, "bench_gpu_spec")
