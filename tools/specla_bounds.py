#!/usr/bin/env python3
"""What bounds bench_specla's three ratios, read from its own rows (docs/specla.md, "What bounds
bench_specla's ratios on a GPU").

Both sides of each comparison keep a head's state on chip while they walk tokens, so their times
are close to linear in the work they walk; this fits those lines and says what each ratio would be
if every fixed cost (launches, the prologue kernels, the state's one read and write) were free:

  tree verify   root-to-leaf replay: t = f + a * node_steps   (node_steps = sum of the leaves' path
                lengths, tools/bench_specla.py's tree_stats), over the four trees;
                HLD chains: t = f + a * n_nodes + c * n_chains (chain starts load a state);
                bound = a_replay * node_steps / (a_hld * n_nodes + c * n_chains), and at equal cost
                a node step, node_steps / n_nodes.
  commit        t = f + a * accepted for replay and for the factor fold (accept + finish);
                bound = a_replay / a_fold, whatever the accepted length.
  deferred      separate commit (fold at accept, then the verify) against the deferred fold inside
                the verify: at best the fold costs nothing inside the verify, so
                bound = (separate) / (the same tree's verify with nothing pending).

    python3 tools/specla_bounds.py results/bench-gpu-h100-e2eb6fa.jsonl --layers 48

A fit is only as good as the rows: with 4 trees and 3 coefficients for HLD, a noisy run can give a
per-node or per-chain cost at or below zero, which no walk has; such a fit is reported with
`fit_ok: false` and no fitted bound (the equal-cost bound of the tree verify needs no fit).

Reads only rows whose `case` is tree_verify, commit or deferred_commit; prints a table, and with
--out appends one JSON row per bound."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load_rows_from(rows: list[dict], layers: int) -> list[dict]:
    """The timing rows (not the ratio rows) of the three cases at `layers` layers."""
    return [r for r in rows if r.get("case") in ("tree_verify", "commit", "deferred_commit")
            and r.get("layers") == layers and r.get("method") != "ratio"]


def load_rows(paths: list[str], layers: int) -> list[dict]:
    rows = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"specla_bounds: {path}:{n}: not a JSON row ({e.msg})")
    return load_rows_from(rows, layers)


def fit(columns: list[list[float]], times: list[float]) -> np.ndarray:
    """Least-squares coefficients of times ~ 1 + columns (first coefficient the intercept)."""
    a = np.column_stack([np.ones(len(times))] + [np.asarray(c, dtype=float) for c in columns])
    coef, *_ = np.linalg.lstsq(a, np.asarray(times, dtype=float), rcond=None)
    return coef


def tree_shape(parents: list[int]) -> tuple[int, int]:
    """(root-to-leaf node steps, chains of the HLD schedule) of a parent array: a heavy-light
    decomposition ends each chain at a leaf, so its chains are the tree's leaves."""
    from bench_specla import tree_stats

    stats = tree_stats(parents)
    return stats["root_to_leaf_node_steps"], stats["n_leaves"]


def tree_verify_bounds(rows: list[dict]) -> list[dict]:
    by_tree: dict[str, dict] = {}
    for r in rows:
        if r["case"] == "tree_verify":
            entry = by_tree.setdefault(r["tree"], {"n_nodes": r["n_nodes"], "parents": r.get("parents")})
            entry[r["verify_method"]] = r["median_ms"]
    trees = {k: v for k, v in by_tree.items() if "hld_chains" in v and "root_to_leaf" in v and v["parents"]}
    if len(trees) < 3:
        return []
    for v in trees.values():
        v["node_steps"], v["n_chains"] = tree_shape(v["parents"])
    names = sorted(trees)
    r_f, r_a = fit([[trees[t]["node_steps"] for t in names]], [trees[t]["root_to_leaf"] for t in names])
    h_f, h_a, h_c = fit([[trees[t]["n_nodes"] for t in names], [trees[t]["n_chains"] for t in names]],
                        [trees[t]["hld_chains"] for t in names])
    fit_ok = bool(r_a > 0 and h_a > 0 and h_c > 0)
    out = []
    for t in names:
        v = trees[t]
        out.append({
            "case": "tree_verify", "tree": t, "n_nodes": v["n_nodes"], "node_steps": v["node_steps"],
            "n_chains": v["n_chains"], "measured_ratio": v["root_to_leaf"] / v["hld_chains"], "fit_ok": fit_ok,
            "bound_free_fixed_costs": r_a * v["node_steps"] / (h_a * v["n_nodes"] + h_c * v["n_chains"]) if fit_ok else None,
            "bound_equal_step_cost": v["node_steps"] / v["n_nodes"],
            "fit_ms": {"replay_fixed": r_f, "replay_per_step": r_a, "hld_fixed": h_f, "hld_per_node": h_a,
                       "hld_per_chain": h_c},
        })
    return out


def commit_bounds(rows: list[dict]) -> list[dict]:
    points: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["case"] == "commit":
            points.setdefault(r["commit_method"], {})[r["accepted"]] = r["median_ms"]
    if "replay" not in points or "factors_now" not in points:
        return []
    acc = sorted(set(points["replay"]) & set(points["factors_now"]))
    if len(acc) < 2:
        return []
    rf, ra = fit([acc], [points["replay"][n] for n in acc])
    ff, fa = fit([acc], [points["factors_now"][n] for n in acc])
    fit_ok = bool(ra > 0 and fa > 0)
    return [{
        "case": "commit", "accepted": n, "measured_ratio": points["replay"][n] / points["factors_now"][n],
        "fit_ok": fit_ok, "bound_free_fixed_costs": ra / fa if fit_ok else None,
        "fit_ms": {"replay_fixed": rf, "replay_per_token": ra, "fold_fixed": ff, "fold_per_token": fa},
    } for n in acc]


def deferred_bounds(rows: list[dict]) -> list[dict]:
    times = {r["commit_method"]: r for r in rows if r["case"] == "deferred_commit"}
    verify = {r["tree"]: r["median_ms"] for r in rows
              if r["case"] == "tree_verify" and r["verify_method"] == "hld_chains"}
    if "factors_now" not in times or "deferred_factors" not in times:
        return []
    tree = times["factors_now"]["tree"]
    if tree not in verify:
        return []
    sep, dfr = times["factors_now"]["median_ms"], times["deferred_factors"]["median_ms"]
    return [{
        "case": "deferred_commit", "tree": tree, "accepted": times["factors_now"].get("accepted"),
        "measured_ratio": sep / dfr, "fit_ok": True, "bound_free_fold": sep / verify[tree],
        "ms": {"separate": sep, "deferred": dfr, "verify_nothing_pending": verify[tree]},
    }]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", help="bench_specla JSON-lines files")
    ap.add_argument("--layers", type=int, default=48, help="the layer count whose rows to read (48)")
    ap.add_argument("--out", help="append one JSON row per bound here")
    args = ap.parse_args(argv)
    for p in args.rows:
        if not Path(p).is_file():
            print(f"specla_bounds: {p}: no such file", file=sys.stderr)
            return 2
    rows = load_rows(args.rows, args.layers)
    bounds = tree_verify_bounds(rows) + commit_bounds(rows) + deferred_bounds(rows)
    if not bounds:
        print(f"specla_bounds: no bench_specla rows at {args.layers} layers in {', '.join(args.rows)}",
              file=sys.stderr)
        return 1
    source = sorted({r.get("commit", "?") + " " + r.get("device", "?") for r in rows})
    print(f"bench_specla rows at {args.layers} layers: {'; '.join(source)}")
    for b in bounds:
        bound = b["bound_free_fold"] if "bound_free_fold" in b else b["bound_free_fixed_costs"]
        said = f"bound {bound:.2f}x" if b["fit_ok"] else "no bound: a fitted cost a unit came out <= 0 (noisy rows)"
        extra = f", equal step cost {b['bound_equal_step_cost']:.2f}x" if "bound_equal_step_cost" in b else ""
        what = b.get("tree") or f"{b['accepted']} accepted"
        print(f"  {b['case']:16s} {what:18s} measured {b['measured_ratio']:.2f}x, {said}{extra}")
    if args.out:
        with open(args.out, "a") as f:
            for b in bounds:
                f.write(json.dumps({"source": source, "layers": args.layers, **b}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
