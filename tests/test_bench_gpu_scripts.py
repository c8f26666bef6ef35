"""Smoke runs of the GPU benchmark scripts on the CPU backend (the lead runs them with --device cuda
on the H200; tools/device/run_gpu.sh lists the command lines): each runs end to end with --quick on
a tiny model or the smallest layer count, writes rows with the fields the reports read, and finds
its bit-for-bit checks true. Bad input ends with a message and a non-zero exit, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE_FIELDS = {"commit", "device", "model", "mode"}


def run_tool(script: str, *args: str, expect_rc: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / script), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == expect_rc, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("path_flag", [[], ["--resident"]], ids=["host_ops", "resident_workload"])
def test_bench_specla_quick_on_the_cpu(tmp_path, path_flag):
    out = tmp_path / "specla.jsonl"
    proc = run_tool("bench_specla.py", "--quick", "--layers", "1", "--threads", "1", "--device", "cpu",
                    *path_flag, "--out", str(out))
    rows = read_rows(out)
    assert all(BASE_FIELDS <= row.keys() for row in rows)
    assert {row["path"] for row in rows} == {"resident_workload" if path_flag else "host_ops"}
    assert {row["backend"] for row in rows} == {"cpu"}
    ratios = [row for row in rows if row["method"] == "ratio"]
    # 4 trees, 4 accepted lengths, 1 deferred commit
    assert sorted({row["case"] for row in ratios}) == ["commit", "deferred_commit", "tree_verify"]
    assert len(ratios) == 9
    for row in ratios:
        assert row["ratio"] > 0 and row["numerator_median_ms"] > 0 and row["denominator_median_ms"] > 0
        same = row.get("same_outputs", row.get("same_state", row.get("same_outputs_and_state")))
        assert same is True, row
    assert any(line.startswith("case ") for line in proc.stdout.splitlines())  # the table's header


def test_bench_specla_refuses_cuda_without_a_device(tmp_path):
    from pyspecla import _native

    if _native.cuda_device_count() > 0:
        pytest.skip("this build sees a CUDA device")
    proc = run_tool("bench_specla.py", "--quick", "--layers", "1", "--device", "cuda", expect_rc=2)
    assert "sees no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_gpu_spec_quick_on_the_cpu(tmp_path, tiny_model_path):
    out = tmp_path / "spec.jsonl"
    run_tool("bench_gpu_spec.py", "--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--quick", "--reps", "1",
             "--depths", "0,8", "--threads", "1", "--out", str(out))
    rows = read_rows(out)
    assert all(BASE_FIELDS <= row.keys() for row in rows)
    exact = [row for row in rows if row["mode"] == "verify-exactness"]
    assert [row["depth"] for row in exact] == [0, 8]
    assert all(row["exact"] and row["nodes_checked"] == 23 for row in exact)
    for mode in ("decode", "verify", "verify-pending", "accept", "accept-side"):
        got = [row for row in rows if row["mode"] == mode]
        assert len(got) == 4, mode  # 2 depths x SpecLA on / off
        assert all(row["ms"] > 0 for row in got)
        if mode != "decode":
            assert all(row["decode_steps"] > 0 and row["n_nodes"] == 23 for row in got)
    tree = next(row for row in rows if row["mode"] == "tree")
    assert len(tree["parents"]) == 23 and tree["spine_path"] == [0, 1, 2, 3, 4, 5]
    assert tree["side_path"] == [0, 1, 13, 17, 22]


def test_bench_gpu_e2e_quick_on_the_cpu(tmp_path, tiny_model_path):
    out = tmp_path / "e2e.jsonl"
    run_tool("bench_gpu_e2e.py", "--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--quick", "-n", "16",
             "--threads", "1", "--out", str(out))
    rows = read_rows(out)
    assert all(BASE_FIELDS <= row.keys() for row in rows)
    assert all(row["same_as_plain"] and row["warmup"] == 1 for row in rows)
    plain = [row for row in rows if row["mode"] == "plain"]
    spec = [row for row in rows if row["mode"] != "plain"]
    assert sorted(row["recorded_steps"] for row in plain) == [False, True]
    assert len(spec) == 2 * 2 * 3  # (SpecLA, dense) x recorded on/off x targets 4, 6, 8
    for row in spec:
        assert row["target_accepted"] in (4.0, 6.0, 8.0) and 0 < row["oracle_p"] < 1
        assert row["mean_accepted"] >= 1 and row["tokens_per_s"] > 0 and row["speedup_vs_plain"] > 0
        assert set(row["breakdown_ms"]) == {"draft_ms", "tree_ms", "hld_ms", "verify_ms", "accept_ms", "host_ms"}
        assert row["breakdown_ms"]["verify_ms"] > 0 and row["breakdown_ms"]["hld_ms"] > 0
        b = row["breakdown_ms"]
        assert row["host_work_ms"] == pytest.approx(b["tree_ms"] + b["hld_ms"] + b["accept_ms"] + b["host_ms"], abs=1e-3)
        assert row["host_work_share"] == pytest.approx(row["host_work_ms"] / row["step_ms"], abs=1e-3)
        assert 0 < row["host_work_share"] < 1


def test_bench_gpu_e2e_commit_at_accept_on_the_cpu(tmp_path, tiny_model_path):
    """The mode asked for by name only: SpecLA with the accepted path folded at accept."""
    out = tmp_path / "e2e.jsonl"
    run_tool("bench_gpu_e2e.py", "--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--quick", "-n", "12",
             "--threads", "1", "--targets", "6", "--recorded", "on", "--modes", "plain,ddtree+specla-now",
             "--out", str(out))
    rows = read_rows(out)
    assert sorted(row["mode"] for row in rows) == ["ddtree+specla-now", "plain"]
    assert all(row["same_as_plain"] for row in rows)


@pytest.mark.parametrize("script,flags", [("bench_gpu_spec.py", ["--quick"]), ("bench_gpu_e2e.py", ["--quick"]),
                                          ("bench_gpu.py", [])])
def test_a_missing_model_is_named(tmp_path, script, flags):
    missing = tmp_path / "nope.gguf"
    proc = run_tool(script, "--model", str(missing), "--device", "cpu", *flags, expect_rc=2)
    assert "nope.gguf" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_gpu_e2e_with_the_draft_cost(tmp_path, tiny_model_path):
    """--draft-cost runs a DFlash draft's proposal every step and keeps the oracle's tokens: the
    acceptance (steps, tokens committed per step) is the oracle's own, the output still plain
    decoding's, and the rows name the draft."""
    from pyspecla.testing.drafts import write_test_draft

    target = tiny_model_path("q8_0")
    draft = write_test_draft(tmp_path / "draft.gguf", target, seed=1)
    common = ["--model", target, "--device", "cpu", "--quick", "-n", "16", "--threads", "1", "--targets", "6",
              "--recorded", "off", "--modes", "ddtree+specla"]
    with_cost, without = tmp_path / "cost.jsonl", tmp_path / "oracle.jsonl"
    run_tool("bench_gpu_e2e.py", *common, "--draft-cost", str(draft), "--draft-vocab", "0", "--out", str(with_cost))
    run_tool("bench_gpu_e2e.py", *common, "--out", str(without))
    costed = {row["mode"]: row for row in read_rows(with_cost)}
    plain_oracle = {row["mode"]: row for row in read_rows(without)}
    assert all(row["same_as_plain"] for row in costed.values())
    assert costed["ddtree+specla"]["draft_cost"] == "draft.gguf" and costed["plain"]["draft_cost"] == "draft.gguf"
    assert plain_oracle["ddtree+specla"]["draft_cost"] is None
    # the draft's own launches and read-backs per step: counted on a GPU, None on the CPU
    assert costed["ddtree+specla"]["draft_host_waits_per_step"] is None
    assert "draft_host_waits_per_step" not in plain_oracle["ddtree+specla"]
    for key in ("steps", "mean_accepted", "mean_tree_nodes"):
        assert costed["ddtree+specla"][key] == plain_oracle["ddtree+specla"][key], key


def test_draft_cost_oracle_runs_the_draft_and_returns_the_oracles_tokens():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from bench_gpu_e2e import DraftCostOracle
    finally:
        sys.path.remove(str(ROOT / "tools"))

    class FakeDraft:
        capture_layers = [3, 5]

        def __init__(self):
            self.calls = []

        def propose(self, ctx, root, n_depths, top_k):
            self.calls.append((root, n_depths, top_k))
            return "draft tokens", "draft logprobs"

    class FakeOracle:
        generated = 0

        def propose(self, ctx, root, n_depths, top_k):
            return f"oracle tokens at {self.generated}", "oracle logprobs"

    dflash, oracle = FakeDraft(), FakeOracle()
    drafter = DraftCostOracle(oracle, dflash)
    assert drafter.capture_layers == [3, 5]
    assert not hasattr(drafter, "history")  # the loop sets a history only on drafts with a reduced vocabulary
    drafter.generated = 7
    assert oracle.generated == 7
    assert drafter.propose(None, 11, 15, 4) == ("oracle tokens at 7", "oracle logprobs")
    assert dflash.calls == [(11, 15, 4)]
    dflash.history = []
    drafter.history = [1, 2]
    assert dflash.history == [1, 2]


def test_bench_gpu_e2e_names_a_missing_draft(tmp_path, tiny_model_path):
    proc = run_tool("bench_gpu_e2e.py", "--model", tiny_model_path("q8_0"), "--device", "cpu", "--quick",
                    "--draft-cost", str(tmp_path / "no-draft.gguf"), expect_rc=2)
    assert "no-draft.gguf" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_host_step_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    run_tool("bench_host_step.py", "--reps", "3", "--inner", "2", "--out", str(out), "--commit", "abc1234")
    rows = read_rows(out)
    assert [r["mode"] for r in rows] == ["usable_proposal", "build_ddtree", "hld_build", "greedy_accept"]
    for r in rows:
        assert BASE_FIELDS <= set(r) and r["commit"] == "abc1234"
        assert r["n_nodes"] == 23 and r["accepted"] == 6  # the 22-node budget, 5 drafted tokens + the bonus
        assert 0 < r["q1_us"] <= r["median_us"] <= r["q3_us"]


def test_bench_host_step_names_a_bad_count():
    proc = run_tool("bench_host_step.py", "--reps", "0", expect_rc=2)
    assert "--reps and --inner must be >= 1" in proc.stderr


def test_bench_host_step_names_a_bad_step():
    proc = run_tool("bench_host_step.py", "--step-ms", "0", expect_rc=2)
    assert "--step-ms must be > 0" in proc.stderr


def test_bench_gpu_settings_run_in_interleaved_rounds(tmp_path, tiny_model_path):
    """--settings VAR=V1:V2 --rounds 2: every figure once per value and round, in the order V1, V2, V1,
    V2, the rows tagged with both; --rounds alone tags the round only. The setting here is a variable
    nothing reads: the test is the loop, not a backend switch."""
    out = tmp_path / "gpu.jsonl"
    common = ["--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--decode-tokens", "2", "--batches", "2",
              "--depths", "0", "--reps", "1", "--commit", "test", "--out", str(out)]
    run_tool("bench_gpu.py", *common, "--settings", "PYSPECLA_TEST_UNREAD=a:b", "--rounds", "2")
    decode = [row for row in read_rows(out) if row["mode"] == "decode"]
    assert [(row["setting"], row["round"]) for row in decode] == [
        ("PYSPECLA_TEST_UNREAD=a", 0), ("PYSPECLA_TEST_UNREAD=b", 0),
        ("PYSPECLA_TEST_UNREAD=a", 1), ("PYSPECLA_TEST_UNREAD=b", 1)]
    out.unlink()
    run_tool("bench_gpu.py", *common, "--rounds", "2")
    batch = [row for row in read_rows(out) if row["mode"] == "batch"]
    assert [row["round"] for row in batch] == [0, 1] and all("setting" not in row for row in batch)
    run_tool("bench_gpu.py", *common, "--settings", "NOEQUALS", expect_rc=2)


def test_bench_gpu_n_ctx_sizes_the_timed_context(tmp_path, tiny_model_path):
    """--n-ctx: the timed context's size, carried in every row (default: what the figures need); one
    smaller than the depths and batches need is refused by name."""
    out = tmp_path / "gpu.jsonl"
    common = ["--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--decode-tokens", "2", "--batches", "2",
              "--depths", "0", "--reps", "1", "--commit", "test", "--out", str(out)]
    run_tool("bench_gpu.py", *common)
    assert {row["n_ctx"] for row in read_rows(out)} == {0 + 2 + 2 + 16}
    out.unlink()
    run_tool("bench_gpu.py", *common, "--n-ctx", "200")
    rows = read_rows(out)
    assert {row["n_ctx"] for row in rows} == {200} and any(row["mode"] == "batch" for row in rows)
    proc = run_tool("bench_gpu.py", *common, "--n-ctx", "8", expect_rc=2)
    assert "--n-ctx 8 is smaller than the 20 tokens" in proc.stderr and "Traceback" not in proc.stderr
    # refused before any model is loaded: an absent file is not what the message names
    proc = run_tool("bench_gpu.py", *common, "--n-ctx", "8", "--model", str(tmp_path / "absent.gguf"), expect_rc=2)
    assert "--n-ctx 8 is smaller" in proc.stderr and "absent.gguf" not in proc.stderr


def test_bench_gpu_spec_n_ctx_sizes_its_contexts(tmp_path, tiny_model_path):
    out = tmp_path / "spec.jsonl"
    common = ["--model", tiny_model_path("q4_k_m"), "--device", "cpu", "--quick", "--reps", "1", "--depths", "0",
              "--threads", "1", "--out", str(out)]
    run_tool("bench_gpu_spec.py", *common, "--n-ctx", "300")
    rows = read_rows(out)
    assert {row["n_ctx"] for row in rows} == {300}
    assert all(row["exact"] for row in rows if row["mode"] == "verify-exactness")
    proc = run_tool("bench_gpu_spec.py", *common, "--n-ctx", "10", "--model", str(tmp_path / "absent.gguf"),
                    expect_rc=2)
    assert "--n-ctx 10 is smaller than the 62 tokens the depths and the tree need" in proc.stderr
    assert "absent.gguf" not in proc.stderr and "Traceback" not in proc.stderr
