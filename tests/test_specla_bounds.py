"""tools/specla_bounds.py on rows made from known lines: the fits give back the lines' coefficients
and the bounds follow from them; bad input names the file."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import bench_specla  # noqa: E402
import specla_bounds  # noqa: E402

REPLAY_FIXED, REPLAY_STEP = 0.51, 0.041
HLD_FIXED, HLD_NODE, HLD_CHAIN = 0.63, 0.033, 0.016
FOLD_FIXED, FOLD_TOKEN, REPLAY_TOKEN = 0.31, 0.0074, 0.0195


def synthetic_rows() -> list[dict]:
    rows = []
    for name, (parents, _) in bench_specla.TREES.items():
        steps, chains = specla_bounds.tree_shape(parents)
        n = len(parents)
        common = {"case": "tree_verify", "layers": 48, "tree": name, "n_nodes": n, "parents": parents}
        rows.append({**common, "method": "hld_chains", "verify_method": "hld_chains",
                     "median_ms": HLD_FIXED + HLD_NODE * n + HLD_CHAIN * chains})
        rows.append({**common, "method": "root_to_leaf", "verify_method": "root_to_leaf",
                     "median_ms": REPLAY_FIXED + REPLAY_STEP * steps})
        rows.append({**common, "method": "ratio", "ratio": 99.0})  # ratio rows are not read
    for acc in (1, 4, 8, 16):
        common = {"case": "commit", "layers": 48, "tree": "chain-16", "accepted": acc}
        rows.append({**common, "method": "factors_now", "commit_method": "factors_now",
                     "median_ms": FOLD_FIXED + FOLD_TOKEN * acc})
        rows.append({**common, "method": "replay", "commit_method": "replay",
                     "median_ms": REPLAY_FIXED + REPLAY_TOKEN * acc})
    common = {"case": "deferred_commit", "layers": 48, "tree": "ddtree-22", "accepted": 8}
    rows.append({**common, "method": "factors_now", "commit_method": "factors_now", "median_ms": 1.81})
    rows.append({**common, "method": "deferred_factors", "commit_method": "deferred_factors", "median_ms": 1.63})
    rows.append({"case": "tree_verify", "layers": 1, "tree": "ddtree-22", "method": "hld_chains",
                 "verify_method": "hld_chains", "median_ms": 5.0})  # another layer count: not read
    return rows


def test_bounds_follow_from_the_fitted_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows()))
    rows = specla_bounds.load_rows([str(path)], 48)
    trees = {b["tree"]: b for b in specla_bounds.tree_verify_bounds(rows)}
    assert set(trees) == set(bench_specla.TREES)
    fitted = trees["top4-depth4-32"]["fit_ms"]
    assert fitted["replay_per_step"] == pytest.approx(REPLAY_STEP, rel=1e-9)
    assert fitted["hld_per_node"] == pytest.approx(HLD_NODE, rel=1e-9)
    assert fitted["hld_per_chain"] == pytest.approx(HLD_CHAIN, rel=1e-9)
    top4 = trees["top4-depth4-32"]
    assert (top4["node_steps"], top4["n_nodes"], top4["n_chains"]) == (67, 32, 17)
    assert top4["bound_equal_step_cost"] == pytest.approx(67 / 32)
    assert top4["bound_free_fixed_costs"] == pytest.approx(REPLAY_STEP * 67 / (HLD_NODE * 32 + HLD_CHAIN * 17))
    assert top4["measured_ratio"] == pytest.approx((REPLAY_FIXED + REPLAY_STEP * 67)
                                                   / (HLD_FIXED + HLD_NODE * 32 + HLD_CHAIN * 17))

    commits = specla_bounds.commit_bounds(rows)
    assert [c["accepted"] for c in commits] == [1, 4, 8, 16]
    assert all(c["bound_free_fixed_costs"] == pytest.approx(REPLAY_TOKEN / FOLD_TOKEN) for c in commits)

    (deferred,) = specla_bounds.deferred_bounds(rows)
    n22 = len(bench_specla.TREES["ddtree-22"][0])
    _, chains22 = specla_bounds.tree_shape(bench_specla.TREES["ddtree-22"][0])
    assert deferred["bound_free_fold"] == pytest.approx(1.81 / (HLD_FIXED + HLD_NODE * n22 + HLD_CHAIN * chains22))
    assert deferred["measured_ratio"] == pytest.approx(1.81 / 1.63)


def test_a_fit_with_a_cost_below_zero_claims_no_bound():
    rows = [dict(r) for r in synthetic_rows()]
    for r in rows:  # HLD times that fall as nodes are added: a per-node cost below zero
        if r["case"] == "tree_verify" and r.get("verify_method") == "hld_chains" and r["layers"] == 48:
            r["median_ms"] = 3.0 - 0.05 * r["n_nodes"] + HLD_CHAIN * specla_bounds.tree_shape(r["parents"])[1]
    trees = specla_bounds.tree_verify_bounds(specla_bounds.load_rows_from(rows, 48))
    assert trees and all(not b["fit_ok"] and b["bound_free_fixed_costs"] is None for b in trees)
    assert all(b["bound_equal_step_cost"] > 0 for b in trees)


def test_cli_prints_and_appends_rows(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows()))
    out = tmp_path / "bounds.jsonl"
    assert specla_bounds.main([str(path), "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 4 + 4 + 1
    assert "top4-depth4-32" in capsys.readouterr().out


def test_bad_input_names_the_file(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    assert specla_bounds.main([str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"case": "commit"}\nnot json\n')
    with pytest.raises(SystemExit, match=f"{bad}:2: not a JSON row"):
        specla_bounds.main([str(bad)])
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"case": "other"}) + "\n")
    assert specla_bounds.main([str(empty)]) == 1
    assert "no bench_specla rows at 48 layers" in capsys.readouterr().err
