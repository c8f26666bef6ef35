#!/usr/bin/env python3
"""The SpecLA recurrent-layer ops at qwen35-27B shapes (Hk 16, Hv 48, S 128, C 10240, K 4), on
the CPU or a GPU, against the baselines they replace. Writes one JSON row per (case, tree or
accepted length, layer count, method), one row per ratio, and state-memory rows; prints a table.

    SPECLA_LIBRARY=build/lead/native/libspecla.so \\
        python tools/bench_specla.py --layers 1,48 --threads 2 --out bench-specla.jsonl
    python tools/bench_specla.py --device cuda --layers 1,48 --out bench-specla.jsonl

Where the data lives (`path` in the rows):
  host_ops           (--device cpu, the default there) the per-layer single tree ops
                     (FactorBanks.conv_tree / verify_gdn / accept / finish) on numpy arrays: the
                     CPU figures as they have always been measured (the banks' memory is host memory).
  resident_workload  (--device cuda, or --device cpu --resident) a RecurrentWorkload: every layer's
                     inputs are uploaded once when the workload is made, and the durable states,
                     outputs and factor banks stay in the backend's memory; a timed run is one call
                     per step's work over all layers (the same factor-bank code and backend ops a
                     context runs). The single ops cannot be timed on a GPU honestly: they take host
                     arrays and copy every argument in and every output back on each call, so their
                     time would be the copies. A run is timed with the host clock between two device
                     syncs (the backend table exposes no events): [sync, t0, the calls, sync, t1],
                     so kernel launches count as part of the step, as they do in generation.
                     Outputs and states are read back for the bit-for-bit checks after the timed runs.

Cases (docs/specla.md §4 names the paper's figures they mirror):
  tree_verify      conv_tree + verify_gdn over all layers of one step, nothing pending:
                   verify_method hld_chains vs root_to_leaf, per tree; ratio = root_to_leaf / hld_chains
  commit           accept + finish of an accepted prefix (1, 4, 8, 16 tokens) of a 16-node chain:
                   commit_method factors_now vs replay (both write the durable state at accept);
                   the verify before it is not timed; ratio = replay / factors_now
  deferred_commit  verify a 22-node tree, accept 8 tokens, verify the next 22-node tree; timed:
                   accept + the second verify; deferred_factors (fold inside that verify) vs
                   factors_now (fold at accept); ratio = factors_now / deferred_factors
  state_memory     bytes kept per verified node and layer by each method, and for 48 layers x 22 nodes
Methods alternate run by run inside each case so machine noise hits both alike; one untimed
warm-up run each. The last run of each method also checks that the two methods agree bit for bit
(outputs, or durable states after the commits): `same_outputs` / `same_state` in the ratio rows.

--quick: fewer repeats and the 48-layer case scaled down to 8 layers (rows carry the layer
count actually run in `layers` and the asked-for one in `layers_requested`).
On the resident path that check covers every layer's outputs (the host path keeps the last
layer's) and every layer's durable state.

On a shared machine use --threads 1: with more threads than idle cores, each OpenMP region waits
for a descheduled worker (replay opens one per token and layer), and the figures turn to noise.
Rows record the 1-minute load average at the start (`loadavg_start`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# qwen35-27B recurrent (Gated DeltaNet) layers
HK, HV, S, C, K = 16, 48, 128, 10240, 4
MODEL_GDN_LAYERS = 48
QUICK_LAYER_CAP = 8


sys.path.insert(0, str(Path(__file__).resolve().parent))

# --- provenance ---------------------------------------------------------------------------------
def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        return ""


from bench_cpu import cpu_name  # noqa: E402  (one definition of the device string for every bench)


# --- trees (parent arrays in topological order; node 0 = the root, always accepted; depth = edges
# from the root) ---------------------------------------------------------------------------------
def chain_tree(n: int) -> list[int]:
    return [-1] + list(range(n - 1))


def spine_with_siblings(spine_nodes: int, sibling_depths: list[int]) -> list[int]:
    """A top-1 spine (nodes 0..spine_nodes-1, node d at depth d) plus one top-2 sibling per listed
    depth d (a child of spine node d-1), numbered after the spine."""
    parents = chain_tree(spine_nodes)
    parents += [d - 1 for d in sibling_depths]
    return parents


def best_first_tree(n: int, rank_probs: list[float], max_depth: int, spine_nodes: int = 1) -> list[int]:
    """A draft tree grown best-first by path probability, the way DDTree-style builders do: the
    child of rank r (0 = the drafter's top-1) of a node has probability rank_probs[r] given its
    parent. Starts from a forced top-1 spine of `spine_nodes` nodes (the chain seed), then adds the
    most probable missing child until n nodes (ties: shallower parent, then lower parent index,
    then lower rank). Nodes are numbered in insertion order, so parents precede children."""
    parents, depth, logp = [-1], [0], [0.0]
    taken = set()
    for d in range(1, spine_nodes):
        parents.append(d - 1), depth.append(d), logp.append(logp[-1] + math.log(rank_probs[0]))
        taken.add((d - 1, 0))
    while len(parents) < n:
        best = None
        for u in range(len(parents)):
            if depth[u] >= max_depth:
                continue
            for r, p in enumerate(rank_probs):
                if (u, r) in taken:
                    continue
                key = (-(logp[u] + math.log(p)), depth[u], u, r)
                if best is None or key < best:
                    best = key
                break  # rank r+1 of u only after rank r is taken
        if best is None:
            raise ValueError("best_first_tree: no room under max_depth")
        _, _, u, r = best
        taken.add((u, r))
        parents.append(u), depth.append(depth[u] + 1), logp.append(logp[u] + math.log(rank_probs[r]))
    return parents


DDTREE_RANK_PROBS = [0.8, 0.1, 0.05, 0.03]
TOP4_RANK_PROBS = [0.5, 0.25, 0.15, 0.1]

TREES = {
    "top2-depth12-16": (spine_with_siblings(13, [1, 2, 3]),
                        "top-1 spine of 13 nodes (depth 0..12) + one top-2 sibling at depths 1, 2, 3"),
    "top4-depth4-32": (best_first_tree(32, TOP4_RANK_PROBS, max_depth=4),
                       f"top-4 branching, best-first by path probability with rank probs {TOP4_RANK_PROBS}, "
                       "max depth 4, trimmed at 32 nodes"),
    "ddtree-22": (best_first_tree(22, DDTREE_RANK_PROBS, max_depth=21, spine_nodes=12),
                  f"chain seed of 12 nodes (depth 0..11), then 10 best-first nodes with rank probs "
                  f"{DDTREE_RANK_PROBS}"),
    "chain-16": (chain_tree(16), "16-node chain"),
}


def tree_stats(parents: list[int]) -> dict:
    n = len(parents)
    depth = [0] * n
    for t in range(1, n):
        depth[t] = depth[parents[t]] + 1
    is_parent = [False] * n
    for t in range(1, n):
        is_parent[parents[t]] = True
    leaves = [t for t in range(n) if not is_parent[t]]
    stats = {"max_depth": max(depth), "n_leaves": len(leaves),
             # node steps a root-to-leaf replay performs (every leaf's path from the root)
             "root_to_leaf_node_steps": sum(depth[t] + 1 for t in leaves)}
    try:
        from pyspecla.reference.hld import ScheduleView
        from pyspecla.speculative.hld import build_schedule

        view = ScheduleView(build_schedule(parents))
        stats.update(n_chains=view.n_chains, n_waves=view.n_waves, n_boundaries=view.n_boundaries)
    except Exception:  # the schedule layout is informational here; never fail the bench on it
        pass
    return stats


# --- inputs and states ----------------------------------------------------------------------------
class Inputs:
    """Random inputs of n_layers recurrent layers for up to max_nodes nodes (q, k L2-normalised,
    g < 0, beta in (0, 1)), plus conv weights and durable states. Slicing [l, :n] stays contiguous."""

    def __init__(self, n_layers: int, max_nodes: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        shape = (n_layers, max_nodes)

        def l2(a):
            return (a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

        self.q = l2(rng.standard_normal(shape + (HK, S), dtype=np.float32))
        self.k = l2(rng.standard_normal(shape + (HK, S), dtype=np.float32))
        self.v = rng.standard_normal(shape + (HV, S), dtype=np.float32)
        self.g = (-np.abs(rng.standard_normal(shape + (HV,), dtype=np.float32)) * 0.3).astype(np.float32)
        self.beta = (1 / (1 + np.exp(-rng.standard_normal(shape + (HV,), dtype=np.float32)))).astype(np.float32)
        self.x = rng.standard_normal(shape + (C,), dtype=np.float32)
        self.conv_w = (rng.standard_normal((n_layers, C, K), dtype=np.float32) * 0.5).astype(np.float32)
        self.gdn0 = [(rng.standard_normal((HV, S, S), dtype=np.float32) * 0.1).astype(np.float32)
                     for _ in range(n_layers)]
        self.conv0 = [rng.standard_normal((K - 1, C), dtype=np.float32) for _ in range(n_layers)]
        self.n_layers = n_layers

    def states(self):
        return [a.copy() for a in self.gdn0], [a.copy() for a in self.conv0]


def verify_all_layers(banks, sched, n, inp: Inputs, gdn, conv, split=None):
    """One step's recurrent work: tree conv + GDN tree verify of every layer. Returns the last
    layer's outputs (for the bit-for-bit check between methods). split, if given, is a list
    [conv ms, gdn ms] that receives the wall time of the two ops summed over the layers."""
    y = out = None
    for l in range(inp.n_layers):
        t0 = time.perf_counter()
        y = banks.conv_tree(sched, l, inp.x[l, :n], inp.conv_w[l], conv[l])
        t1 = time.perf_counter()
        out = banks.verify_gdn(sched, l, inp.q[l, :n], inp.k[l, :n], inp.v[l, :n], inp.g[l, :n],
                               inp.beta[l, :n], gdn[l])
        if split is not None:
            split[0] += (t1 - t0) * 1e3
            split[1] += (time.perf_counter() - t1) * 1e3
    return y, out


def same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def clock() -> tuple[float, float]:
    """(wall, process CPU) seconds. CPU time leaves out the time other processes hold the core, so
    with --threads 1 it is the steadier figure on a shared machine; with more threads it also
    counts OpenMP workers spinning at barriers."""
    return time.perf_counter(), time.process_time()


def elapsed_ms(start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
    return (end[0] - start[0]) * 1e3, (end[1] - start[1]) * 1e3


# --- where a method's work runs ------------------------------------------------------------------
class HostRunner:
    """One method on the per-layer host ops: FactorBanks and numpy durable states (path host_ops)."""

    path = "host_ops"

    def __init__(self, bench, inp: Inputs, max_nodes: int, verify_method: str, commit_method: str):
        self.banks = bench.banks(inp.n_layers, max_nodes, verify_method, commit_method)
        self.inp = inp
        self.gdn, self.conv = inp.states()
        self.sched = self.n = self.last = None

    def set_tree(self, parents) -> None:
        from pyspecla.speculative.hld import build_schedule

        self.sched, self.n = build_schedule(parents), len(parents)

    def verify(self, split=None) -> None:
        self.last = verify_all_layers(self.banks, self.sched, self.n, self.inp, self.gdn, self.conv, split)

    def accept(self, path, write_states: bool = True) -> None:
        """write_states False: the deferred commit's accept, which takes no states (a bank swap)."""
        if write_states:
            self.banks.accept(self.sched, path, self.gdn, self.conv)
        else:
            self.banks.accept(self.sched, path)

    def finish(self) -> None:
        self.banks.finish(self.gdn, self.conv)

    def sync(self) -> None:
        pass  # the host ops return when done

    def outputs(self) -> list:
        """The last verify's outputs: the last layer's conv and GDN outputs."""
        return list(self.last)

    def states(self) -> list:
        return self.gdn + self.conv

    def close(self) -> None:
        self.banks.close()


class ResidentRunner:
    """One method on a RecurrentWorkload: inputs, states and banks in the backend's memory (path
    resident_workload). The inputs are uploaded here, outside every timed region."""

    path = "resident_workload"

    def __init__(self, bench, inp: Inputs, max_nodes: int, verify_method: str, commit_method: str):
        from pyspecla.speculative.recurrent import RecurrentShape, RecurrentWorkload

        rows = slice(0, max_nodes)
        inputs = {"q": inp.q[:, rows], "k": inp.k[:, rows], "v": inp.v[:, rows], "g": inp.g[:, rows],
                  "beta": inp.beta[:, rows], "x": inp.x[:, rows], "conv_weight": inp.conv_w,
                  "gdn_state": np.stack(inp.gdn0), "conv_state": np.stack(inp.conv0)}
        self.n_layers = inp.n_layers
        self.workload = RecurrentWorkload(RecurrentShape(inp.n_layers, HK, HV, S, C, K, max_nodes), inputs,
                                          verify_method, commit_method, device=bench.args.device,
                                          n_threads=bench.args.threads)

    def set_tree(self, parents) -> None:
        self.workload.set_tree(parents)

    def verify(self, split=None) -> None:
        self.workload.verify()  # one call for every layer: no per-op split here

    def accept(self, path, write_states: bool = True) -> None:
        self.workload.accept(path)  # the workload's states are always at hand

    def finish(self) -> None:
        self.workload.finish()

    def sync(self) -> None:
        self.workload.sync()

    def outputs(self) -> list:
        """The last verify's outputs: every layer's conv and GDN outputs."""
        return [self.workload.read(what, layer) for layer in range(self.n_layers) for what in ("conv_out", "gdn_out")]

    def states(self) -> list:
        return [self.workload.read(what, layer) for what in ("gdn_state", "conv_state") for layer in range(self.n_layers)]

    def close(self) -> None:
        self.workload.close()


# --- the cases ----------------------------------------------------------------------------------
class Bench:
    def __init__(self, args, base: dict):
        self.args, self.base = args, base
        self.rows: list[dict] = []
        self.table: list[tuple] = []

    def repeats(self, layers: int) -> int:
        # one layer is cheap and noisier: give it more runs
        return self.args.repeats if layers > QUICK_LAYER_CAP else self.args.repeats * 3

    def banks(self, layers, max_nodes, verify_method, commit_method):
        from pyspecla.speculative.recurrent import FactorBanks, RecurrentShape

        return FactorBanks(RecurrentShape(layers, HK, HV, S, C, K, max_nodes), verify_method, commit_method,
                           n_threads=self.args.threads)

    def runner(self, inp: Inputs, max_nodes: int, verify_method: str, commit_method: str):
        cls = ResidentRunner if self.args.resident else HostRunner
        return cls(self, inp, max_nodes, verify_method, commit_method)

    def add(self, row: dict) -> None:
        self.rows.append({**self.base, "mode": f"{row['case']}:{row['method']}", **row})

    def add_pair(self, case, common, methods, runs, ratio_of, extra=None, method_extra=None):
        """Two method rows and their ratio row. methods: [(label, verify, commit), ...]; runs[label]:
        [(wall ms, cpu ms), ...]; method_extra[label]: more fields of that method's row."""
        medians, cpu_medians = {}, {}
        for label, verify_method, commit_method in methods:
            wall = [w for w, _ in runs[label]]
            cpu = [c for _, c in runs[label]]
            medians[label], cpu_medians[label] = statistics.median(wall), statistics.median(cpu)
            self.add({"case": case, **common, "method": label, "verify_method": verify_method,
                      "commit_method": commit_method, "repeats": len(wall), "median_ms": medians[label],
                      "runs_ms": wall, "median_cpu_ms": cpu_medians[label], "runs_cpu_ms": cpu,
                      **(method_extra or {}).get(label, {})})
        num, den = ratio_of
        ratio, ratio_cpu = medians[num] / medians[den], cpu_medians[num] / cpu_medians[den]
        # the two runs of one repeat are back to back, so their quotient shares the machine's mood
        paired = [a[0] / b[0] for a, b in zip(runs[num], runs[den])]
        fastest = min(w for w, _ in runs[num]) / min(w for w, _ in runs[den])
        self.add({"case": case, **common, "method": "ratio", "ratio": ratio, "ratio_cpu": ratio_cpu,
                  "ratio_paired_median": statistics.median(paired), "ratio_of_fastest": fastest,
                  "ratio_of": f"{num} / {den}", "numerator_median_ms": medians[num],
                  "denominator_median_ms": medians[den], "numerator_median_cpu_ms": cpu_medians[num],
                  "denominator_median_cpu_ms": cpu_medians[den], **(extra or {})})
        self.table.append((case, common.get("tree", ""), common.get("accepted", ""), common["layers"],
                           num, medians[num], den, medians[den], ratio, statistics.median(paired)))

    def layer_cases(self):
        for requested in self.args.layers:
            run = min(requested, QUICK_LAYER_CAP) if self.args.quick else requested
            yield requested, run

    # 1. tree verify: state-resident HLD chains vs root-to-leaf replay
    def tree_verify(self):
        for requested, layers in self.layer_cases():
            inp = Inputs(layers, max(len(p) for p, _ in TREES.values()), seed=1)
            for name, (parents, description) in TREES.items():
                n = len(parents)
                methods = [("hld_chains", "hld_chains", "deferred_factors"),
                           ("root_to_leaf", "root_to_leaf", "deferred_factors")]
                runners = {m: self.runner(inp, n, v, c) for m, v, c in methods}
                for runner in runners.values():
                    runner.set_tree(parents)
                runs = {m: [] for m, _, _ in methods}
                splits = {m: [] for m, _, _ in methods}
                for r in range(self.repeats(layers) + 1):
                    for m, _, _ in (methods if r % 2 == 0 else methods[::-1]):
                        split = [0.0, 0.0]
                        runners[m].sync()
                        t0 = clock()
                        runners[m].verify(split)
                        runners[m].sync()
                        t1 = clock()
                        if r:  # run 0 warms up
                            runs[m].append(elapsed_ms(t0, t1))
                            splits[m].append(split)
                same = all(same_bits(a, b) for a, b in zip(runners["hld_chains"].outputs(),
                                                           runners["root_to_leaf"].outputs()))
                common = {"layers": layers, "layers_requested": requested, "tree": name, "n_nodes": n,
                          "accepted": None, "parents": parents, "tree_note": description, **tree_stats(parents),
                          "timed": "conv_tree + verify_gdn, every layer, nothing pending"}
                extra = {"same_outputs": same}
                conv_gdn = None
                if not self.args.resident:  # the host ops are timed one by one; a workload runs a step in one call
                    conv_gdn = {m: {"median_conv_tree_ms": statistics.median(c for c, _ in splits[m]),
                                    "median_verify_gdn_ms": statistics.median(g for _, g in splits[m])}
                                for m in splits}
                    extra["ratio_verify_gdn_only"] = (conv_gdn["root_to_leaf"]["median_verify_gdn_ms"]
                                                      / conv_gdn["hld_chains"]["median_verify_gdn_ms"])
                self.add_pair("tree_verify", common, methods, runs, ("root_to_leaf", "hld_chains"), extra, conv_gdn)
                for runner in runners.values():
                    runner.close()

    # 2. commit of the accepted path: fold the factors now vs replay the tokens
    def commit(self):
        parents = chain_tree(16)
        for requested, layers in self.layer_cases():
            inp = Inputs(layers, 16, seed=2)
            methods = [("factors_now", "hld_chains", "factors_now"), ("replay", "hld_chains", "replay")]
            runners = {m: self.runner(inp, 16, v, c) for m, v, c in methods}  # same start: states must stay equal
            for runner in runners.values():
                runner.set_tree(parents)
            for accepted in (1, 4, 8, 16):
                path = list(range(accepted))
                runs = {m: [] for m, _, _ in methods}
                for r in range(self.repeats(layers) + 1):
                    for m, _, _ in (methods if r % 2 == 0 else methods[::-1]):
                        runners[m].verify()  # not timed
                        runners[m].sync()
                        t0 = clock()
                        runners[m].accept(path)
                        runners[m].finish()
                        runners[m].sync()
                        t1 = clock()
                        if r:
                            runs[m].append(elapsed_ms(t0, t1))
                same = all(same_bits(a, b) for a, b in zip(runners["factors_now"].states(), runners["replay"].states()))
                common = {"layers": layers, "layers_requested": requested, "tree": "chain-16", "n_nodes": 16,
                          "accepted": accepted, "parents": parents,
                          "timed": "accept + finish (both methods write the durable state at accept)"}
                self.add_pair("commit", common, methods, runs, ("replay", "factors_now"), {"same_state": same})
            for runner in runners.values():
                runner.close()

    # 3. deferred commit (fold inside the next verify) vs a separate fold at accept
    def deferred_commit(self, accepted: int = 8):
        parents, _ = TREES["ddtree-22"]
        n = len(parents)
        path = list(range(accepted))
        assert all(parents[i] == i - 1 for i in path[1:]), "the accepted path must be the tree's spine prefix"
        for requested, layers in self.layer_cases():
            inp = Inputs(layers, n, seed=3)
            methods = [("deferred_factors", "hld_chains", "deferred_factors"),
                       ("factors_now", "hld_chains", "factors_now")]
            runners = {m: self.runner(inp, n, v, c) for m, v, c in methods}
            for runner in runners.values():
                runner.set_tree(parents)
            runs = {m: [] for m, _, _ in methods}
            for r in range(self.repeats(layers) + 1):
                for m, _, _ in (methods if r % 2 == 0 else methods[::-1]):
                    runners[m].verify()  # step 1: not timed
                    runners[m].sync()
                    t0 = clock()
                    # deferred: a bank swap, the fold waits for the next verify; factors_now folds here
                    runners[m].accept(path, write_states=m != "deferred_factors")
                    runners[m].verify()  # step 2
                    runners[m].sync()
                    t1 = clock()
                    runners[m].finish()  # drop step 2 (nothing left to fold), not timed
                    if r:
                        runs[m].append(elapsed_ms(t0, t1))
            same = all(same_bits(a, b) for a, b in zip(runners["deferred_factors"].outputs(),
                                                       runners["factors_now"].outputs()))
            same = same and all(same_bits(a, b) for a, b in zip(runners["deferred_factors"].states(),
                                                                runners["factors_now"].states()))
            common = {"layers": layers, "layers_requested": requested, "tree": "ddtree-22", "n_nodes": n,
                      "accepted": accepted, "parents": parents,
                      "timed": f"accept({accepted}) + verify of the next {n}-node tree (conv_tree + verify_gdn, "
                               "every layer)"}
            self.add_pair("deferred_commit", common, methods, runs, ("factors_now", "deferred_factors"),
                          {"same_outputs_and_state": same})
            for runner in runners.values():
                runner.close()

    # 4. state memory per verified node
    def state_memory(self, layers: int = MODEL_GDN_LAYERS, nodes: int = 22):
        f = 4  # fp32
        one_bank = (HK * S + HV * S + HV + C) * f
        specla = self.banks(1, nodes, "hld_chains", "deferred_factors")
        replay = self.banks(1, nodes, "hld_chains", "replay")
        dense = self.banks(1, nodes, "dense_checkpoints", "checkpoint_restore")
        impl = {name: b.nbytes / nodes for name, b in (("specla", specla), ("replay", replay), ("dense", dense))}
        for b in (specla, replay, dense):
            b.close()
        entries = [
            ("specla_factor_banks", "hld_chains", "deferred_factors", impl["specla"],
             "FactorBanks.nbytes / (layers x max_nodes) = 2 banks x (Hk*S [k] + Hv*S [delta] + Hv [g] + C [raw conv "
             "input]) x 4 B; both banks counted (the verify's bank and the pending path's bank)"),
            ("dense_checkpoints", "dense_checkpoints", "checkpoint_restore", (HV * S * S + (K - 1) * C) * f,
             "per-node state copies: (Hv*S*S [GDN state] + (K-1)*C [conv window]) x 4 B; this implementation also "
             f"allocates the factor banks beside them ({impl['dense']:.0f} B per node per layer in all)"),
            ("replay_inputs", "hld_chains", "replay", (HK * S + HV * S + HV + HV + C) * f,
             "per-node inputs a replay must keep: (Hk*S [k] + Hv*S [v] + Hv [g] + Hv [beta] + C [raw conv input]) x "
             "4 B, the durable state itself being the snapshot; this implementation keeps them in both banks "
             f"beside delta ({impl['replay']:.0f} B per node per layer in all)"),
        ]
        for label, verify_method, commit_method, per_node, note in entries:
            self.add({"case": "state_memory", "layers": layers, "n_nodes": nodes, "method": label,
                      "verify_method": verify_method, "commit_method": commit_method,
                      "bytes_per_node_per_layer": per_node, "one_bank_bytes_per_node_per_layer": one_bank,
                      "whole_model_bytes": per_node * layers * nodes,
                      "whole_model_note": f"{layers} GDN layers x {nodes} nodes", "note": note})
            self.table.append(("state_memory", label, "", layers, f"{per_node / 1024:.1f} KiB/node/layer", None,
                               f"{per_node * layers * nodes / 2**20:.1f} MiB", None, None, None))


def print_table(table) -> None:
    """A/B = ratio of the wall-clock medians; paired = median of the per-repeat quotients."""
    print(f"{'case':<16} {'tree':<16} {'acc':>3} {'L':>3}  {'A':<14} {'A ms':>9}  {'B':<16} {'B ms':>9}  "
          f"{'A/B':>6} {'paired':>6}")
    for case, tree, acc, layers, a, a_ms, b, b_ms, ratio, ratio_paired in table:
        if a_ms is None:  # memory rows
            print(f"{case:<16} {tree:<20} {layers:>3}  {a:<24} {b}")
            continue
        print(f"{case:<16} {tree:<16} {acc if acc is not None else '':>3} {layers:>3}  {a:<14} {a_ms:>9.1f}  "
              f"{b:<16} {b_ms:>9.1f}  {ratio:>5.2f}x {ratio_paired:>5.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 repeats, the 48-layer case run with 8 layers")
    ap.add_argument("--layers", default=f"1,{MODEL_GDN_LAYERS}", help="comma-separated layer counts (default 1,48)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of the ops (default: all)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed runs per method for > 8 layers; 3x that for smaller layer counts (default 15, quick 2)")
    ap.add_argument("--cases", default="tree_verify,commit,deferred_commit,state_memory",
                    help="comma-separated subset of the cases")
    ap.add_argument("--out", default=None, help="append the JSON rows to this file (default: stdout only)")
    ap.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD here)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="backend of the ops (cuda: always the resident workload)")
    ap.add_argument("--resident", action="store_true",
                    help="on the CPU too, time the resident workload instead of the per-layer host ops")
    args = ap.parse_args()
    args.resident = args.resident or args.device == "cuda"
    args.layers = [int(x) for x in args.layers.split(",") if x]
    if args.repeats is None:
        args.repeats = 2 if args.quick else 15
    if args.threads < 1 or args.repeats < 1 or any(l < 1 for l in args.layers):
        ap.error("--threads, --repeats and --layers must be positive")

    from pyspecla import _native

    dirty = git("status", "--porcelain", "--", "native", "pyspecla")
    if args.device == "cuda":
        from bench_gpu import device_name

        if _native.cuda_device_count() < 1:
            print("bench_specla: --device cuda, but this libspecla sees no CUDA device (a CPU-only build, or "
                  "no GPU here)", file=sys.stderr)
            return 2
        device = f"cuda: {device_name()}"
    else:
        device = f"cpu: {cpu_name()} ({os.cpu_count()} cores)"
    base = {"commit": args.commit or git("rev-parse", "--short", "HEAD") or "unknown",
            "worktree_dirty": bool(dirty),
            "device": device, "backend": args.device,
            "path": "resident_workload" if args.resident else "host_ops",
            "cpu_kernels": {v: k for k, v in _native.CPU_KERNELS.items()}.get(_native.cpu_best_kernels(), "?"),
            "threads": args.threads, "quick": args.quick, "loadavg_start": round(os.getloadavg()[0], 2),
            "model": "qwen35-27B recurrent layers (synthetic inputs)",
            "shape": {"model": "qwen35-27B", "Hk": HK, "Hv": HV, "S": S, "C": C, "K": K}}
    if args.device == "cpu" and args.threads > 1 and os.getloadavg()[0] >= 1.0:
        print(f"# warning: load average {os.getloadavg()[0]:.1f} with --threads {args.threads}; other processes "
              "share the cores, consider --threads 1", file=sys.stderr)
    bench = Bench(args, base)
    t_start = time.perf_counter()
    for case in args.cases.split(","):
        getattr(bench, case)()
        print(f"# {case} done at {time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)
    print(f"# {base['device']}, {base['path']}, commit {base['commit']}")
    print_table(bench.table)
    if args.out:
        with open(args.out, "a") as f:
            for row in bench.rows:
                f.write(json.dumps(row) + "\n")
    else:
        for row in bench.rows:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
