"""The n-gram (prompt-lookup) drafter: its proposals on hand-built histories, its spec parsing, and
the speculative loop with it on the tiny models — lossless in every mode, more than one token per
step where the text repeats, a plain 1-node decode step where nothing can match, deterministic —
and `--draft ngram` on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import plain_tokens

from pyspecla import Model
from pyspecla.errors import UsageError
from pyspecla.speculative.tree import build_chain, build_ddtree
from pyspecla.speculative.drafters import NgramDrafter
from pyspecla.speculative.loop import SpecConfig, generate

N_TOKENS = 128
MODES = [("chain", False), ("chain", True), ("ddtree", False), ("ddtree", True)]


def config_for(mode, specla, drafter):
    # the CLI's defaults: tau 6 and K 4 with SpecLA, no tau and K 8 without
    return SpecConfig(mode=mode, specla=specla, tau=6.0 if specla else None, top_k=4 if specla else 8,
                      max_depth=drafter.max_depth)


def propose(history, n_depths=10, top_k=4, **kwargs):
    drafter = NgramDrafter(**kwargs)
    drafter.history = list(history)
    return drafter.propose(None, history[-1], n_depths, top_k)


def check_tables(tokens, logprobs, top_k):
    assert tokens.dtype == np.int32 and logprobs.dtype == np.float32
    assert tokens.shape == logprobs.shape and tokens.shape[1] <= top_k
    assert np.all(np.isfinite(logprobs)) and np.all(logprobs <= 0.0)
    assert np.all(np.diff(logprobs, axis=1) <= 0.0), "rows must descend"
    for row in tokens:
        assert len(set(row.tolist())) == len(row), "distinct tokens within a row"


# ---------------------------------------------------------------------------------------------
# the drafter alone


def test_no_match_proposes_zero_depths():
    tokens, logprobs = propose([5, 6, 7, 8, 9], top_k=4)
    assert tokens.shape == (0, 4) and logprobs.shape == (0, 4)
    assert tokens.dtype == np.int32 and logprobs.dtype == np.float32


def test_proposes_what_followed_the_latest_occurrence_of_the_longest_suffix():
    # suffix 3-gram (1, 2, 3) occurred at 0..2 followed by 4 5; the 1-gram (3) more recently by 9
    history = [1, 2, 3, 4, 5, 7, 3, 9, 8, 1, 2, 3]
    tokens, logprobs = propose(history, n_depths=3, top_k=1)
    assert tokens[:, 0].tolist() == [4, 5, 7]
    check_tables(tokens, logprobs, 1)
    # with n=1 only the latest occurrence of the root (3 at index 6) counts
    tokens, _ = propose(history, n_depths=3, top_k=1, max_n=1)
    assert tokens[:, 0].tolist() == [9, 8, 1]


def test_backs_off_to_shorter_ngrams():
    history = [4, 2, 9, 6, 1, 2]  # no earlier (1, 2) nor (6, 1, 2); the 1-gram (2) is followed by 9
    tokens, _ = propose(history, n_depths=2, top_k=1)
    assert tokens[:, 0].tolist() == [9, 6]


def test_continuation_into_the_present_repeats_periodically():
    history = [7, 1, 2, 3, 1, 2, 3]  # latest earlier (1, 2, 3) ends 3 back: period 3
    tokens, _ = propose(history, n_depths=8, top_k=1)
    assert tokens[:, 0].tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    tokens, _ = propose([5, 5, 5], n_depths=4, top_k=1)
    assert tokens[:, 0].tolist() == [5, 5, 5, 5]


def test_max_tokens_caps_the_depth():
    history = list(range(20)) + list(range(3))
    tokens, _ = propose(history, n_depths=15, top_k=2, max_tokens=6)
    assert tokens.shape[0] == 6 and tokens[:, 0].tolist() == [3, 4, 5, 6, 7, 8]
    tokens, _ = propose(history, n_depths=4, top_k=2, max_tokens=6)
    assert tokens.shape[0] == 4


def test_alternatives_come_from_other_occurrences_ranked_by_count():
    # (1, 2) followed by 5 twice (older) and by 3 once (latest): the spine is the latest (3), the
    # alternative 5 outnumbers it, so the spine's count is raised to tie (recency wins the tie)
    history = [1, 2, 5, 0, 1, 2, 5, 0, 1, 2, 3, 0, 1, 2]
    tokens, logprobs = propose(history, n_depths=2, top_k=4, max_n=2)
    check_tables(tokens, logprobs, 4)
    assert tokens.shape == (2, 2) and tokens[0].tolist() == [3, 5]
    # N = 3 occurrences, boost 1, D = 3 + 1 + 1: both get log(2 / 5)
    assert logprobs[0].tolist() == pytest.approx([np.log(2 / 5)] * 2)
    # depth 2 is conditioned on the spine: only the occurrence followed by 3 agrees, then 0; the
    # row is padded (nothing else ever followed 3) far below
    assert tokens[1, 0] == 0 and logprobs[1, 0] == pytest.approx(np.log(1 / 2))
    assert logprobs[1, 1] == pytest.approx(np.log(1 / 2) - 30.0, abs=1e-4)
    # the longer 3-gram (0, 1, 2) matches twice, followed by 5 then 3: one count each, D = 3
    tokens, logprobs = propose(history, n_depths=1, top_k=4, max_n=3)
    assert tokens[0].tolist() == [3, 5] and logprobs[0].tolist() == pytest.approx([np.log(1 / 3)] * 2)


def test_tables_are_valid_for_the_tree_builders_on_random_histories():
    rng = np.random.default_rng(0)
    for trial in range(200):
        history = rng.integers(0, int(rng.integers(2, 12)), int(rng.integers(1, 80))).tolist()
        top_k = int(rng.integers(1, 9))
        tokens, logprobs = propose(history, n_depths=int(rng.integers(1, 16)), top_k=top_k,
                                   max_n=int(rng.integers(1, 5)))
        check_tables(tokens, logprobs, top_k)
        if len(tokens):
            # the spine is the latest earlier occurrence's continuation
            build_ddtree(history[-1], tokens, logprobs, 22, tau=6.0)
            build_ddtree(history[-1], tokens, logprobs, 22, tau=None)
            build_chain(history[-1], tokens, logprobs, 10)
        else:
            assert history.count(history[-1]) == 1, "a token seen before always matches (n = 1)"


def test_incremental_index_equals_a_fresh_one():
    rng = np.random.default_rng(1)
    history = rng.integers(0, 6, 40).tolist()
    appended = NgramDrafter()
    appended.history = []
    for end, token in enumerate(history, 1):
        appended.history.append(token)  # what the loop does: one list, appended to
        tables = appended.propose(None, token, 10, 4)
        assert all(np.array_equal(a, b) for a, b in zip(propose(history[:end]), tables))
    # a new list (a new generation) starts a new index
    other = rng.integers(0, 6, 25).tolist()
    appended.history = list(other)
    assert all(np.array_equal(a, b) for a, b in zip(propose(other), appended.propose(None, other[-1], 10, 4)))


def test_history_must_end_with_the_root():
    drafter = NgramDrafter()
    drafter.history = [1, 2, 3]
    with pytest.raises(UsageError, match="root"):
        drafter.propose(None, 4, 10, 4)


@pytest.mark.parametrize("spec,expected", [("ngram", (3, 10)), ("ngram:n=5", (5, 10)), ("ngram:max=4", (3, 4)),
                                           ("ngram:n=2,max=16", (2, 16)), ("ngram:max=16,n=1", (1, 16))])
def test_parse(spec, expected):
    assert NgramDrafter.parse(spec) == expected


BAD_SPECS = ["ngram:", "ngram:n=0", "ngram:max=0", "ngram:n=65", "ngram:n=3,n=4", "ngram:k=3", "ngram:n=x",
             "ngram:n=3;max=4", "ngram3", "ngram:n=2,"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_parse_rejects_malformed_specs(spec):
    with pytest.raises(UsageError, match="--draft"):
        NgramDrafter.parse(spec)


# ---------------------------------------------------------------------------------------------
# the loop with the drafter, on the tiny models


@pytest.fixture(scope="module", params=["f32", "q4_k_m"])
def model(request, tiny_model_path):
    return Model.load(tiny_model_path(request.param))


def ar_tokens(model, prompt, n=N_TOKENS):
    return plain_tokens(model, prompt, n)


def prompts(n, n_vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, int(rng.integers(1, 24))).tolist() for _ in range(n)]


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_every_mode_is_lossless_on_10_prompts(model, mode, specla):
    for i, prompt in enumerate(prompts(10, model.hparams.n_vocab, seed=1)):
        drafter = NgramDrafter()
        stats, ctx = generate(model, prompt, N_TOKENS, config_for(mode, specla, drafter), drafter=drafter)
        assert stats.tokens == ar_tokens(model, prompt), f"prompt {i}: speculative output differs from AR"
        assert ctx.pending == 0
        assert sum(stats.accepted_per_step) >= N_TOKENS - 1


def repetitiveness(tokens, n=3):
    """Fraction of positions whose preceding n-gram occurred before."""
    seen, hits = set(), 0
    for i in range(n, len(tokens)):
        gram = tuple(tokens[i - n:i])
        hits += gram in seen
        seen.add(gram)
    return hits / max(len(tokens) - n, 1)


def repetitive_prompt(model):
    """A random 16-token sequence repeated 4 times; of a few such, the one whose greedy text
    (prompt + continuation) repeats most — random weights do not copy the prompt, but their
    greedy output falls into cycles."""
    candidates = []
    for seed in range(4):
        prompt = np.random.default_rng(100 + seed).integers(0, model.hparams.n_vocab, 16).tolist() * 4
        candidates.append((repetitiveness(prompt + ar_tokens(model, prompt)), seed, prompt))
    return max(candidates)[2]


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_repetitive_text_gives_more_than_one_token_per_step(model, mode, specla):
    prompt = repetitive_prompt(model)
    drafter = NgramDrafter()
    # the proposals themselves are under test: without the loss guard (tests/test_guard.py), which
    # would size them by what verifies cost on this machine at the moment
    drafter.guarded = False
    stats, _ = generate(model, prompt, N_TOKENS, config_for(mode, specla, drafter), drafter=drafter)
    assert stats.tokens == ar_tokens(model, prompt)
    assert stats.mean_accepted > 2.0, stats.mean_accepted
    assert stats.steps < N_TOKENS / 2


def distinct_prompt(model, n_new=8):
    """Distinct prompt tokens, and a greedy continuation whose first n_new tokens are distinct and
    not in the prompt: nothing can match during the first n_new steps."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        prompt = rng.choice(model.hparams.n_vocab, 12, replace=False).tolist()
        first = ar_tokens(model, prompt)[:n_new]
        if len(set(first)) == n_new and not set(first) & set(prompt):
            return prompt
    raise AssertionError("no prompt without early matches found")


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_no_match_steps_are_plain_decode_steps(model, mode, specla):
    n_new = 8
    prompt = distinct_prompt(model, n_new)
    drafter = NgramDrafter()
    drafter.guarded = False  # which steps the drafter itself makes plain (the guard may add more)
    stats, _ = generate(model, prompt, N_TOKENS, config_for(mode, specla, drafter), drafter=drafter)
    assert stats.tokens == ar_tokens(model, prompt)
    # step s verifies the root out[s]: new for s < n_new, so the proposal is empty
    assert stats.tree_nodes_per_step[:n_new] == [1] * n_new
    assert stats.accepted_per_step[:n_new] == [1] * n_new
    # the loop still verifies only the root on every later miss, and more than that on a match
    history = prompt + stats.tokens
    position = len(prompt)  # history index of the root of step 0
    for nodes, accepted in zip(stats.tree_nodes_per_step, stats.accepted_per_step):
        root = history[position]
        assert (nodes == 1) == (root not in history[:position])
        position += accepted


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_deterministic(model, mode, specla):
    prompt = repetitive_prompt(model)
    runs = []
    drafter = NgramDrafter(max_n=2, max_tokens=7)
    drafter.guarded = False  # the guard sizes steps by wall-clock timings: not deterministic
    for _ in range(2):  # the second run reuses the drafter: a new history list resets its index
        stats, _ = generate(model, prompt, 64, config_for(mode, specla, drafter), drafter=drafter)
        runs.append((stats.tokens, stats.accepted_per_step, stats.tree_nodes_per_step))
    fresh = NgramDrafter(max_n=2, max_tokens=7)
    fresh.guarded = False
    stats, _ = generate(model, prompt, 64, config_for(mode, specla, fresh), drafter=fresh)
    runs.append((stats.tokens, stats.accepted_per_step, stats.tree_nodes_per_step))
    assert runs[0] == runs[1] == runs[2]
    assert max(runs[0][2]) <= (7 + 1 if mode == "chain" else 22 + 1)


def test_history_hook_holds_prompt_and_emitted_tokens(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=3)[0]
    drafter = NgramDrafter()
    stats, _ = generate(model, prompt, 40, SpecConfig(mode="ddtree", max_depth=drafter.max_depth), drafter=drafter)
    assert drafter.history == prompt + stats.tokens


# ---------------------------------------------------------------------------------------------
# the command line


def run_cli(*args, timeout=120):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "pyspecla", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("extra", [["--draft", "ngram", "--specla"], ["--draft", "ngram:n=2,max=6", "--no-ddtree"],
                                   ["--draft", "ngram:max=12"]])
def test_cli_ngram_equals_plain_run(tiny_model_path, tmp_path, extra):
    path = tiny_model_path("q4_k_m")
    plain = run_cli("run", path, "-p", "hello hello hello", "-n", "40", "--ignore-eos")
    assert plain.returncode == 0, plain.stderr
    stats_file = tmp_path / "stats.json"
    spec = run_cli("run", path, "-p", "hello hello hello", "-n", "40", "--ignore-eos", *extra,
                   "--stats-json", str(stats_file))
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    record = json.loads(stats_file.read_text())
    assert len(record["tokens"]) == 40 and record["draft"] == extra[1]
    max_tokens = NgramDrafter.parse(extra[1])[1]
    assert record["config"]["max_depth"] == max_tokens
    assert max(record["tree_nodes_per_step"]) <= (max_tokens + 1 if "--no-ddtree" in extra else 23)


def test_cli_malformed_ngram_specs_are_one_clear_line(tiny_model_path):
    path = tiny_model_path("q4_k_m")
    for spec in ("ngram:n=0", "ngram:max=x", "ngram:n=3,n=4", "ngram3"):
        result = run_cli("run", path, "-p", "x", "-n", "4", "--draft", spec)
        assert result.returncode == 2, (spec, result.stderr)
        assert f"--draft {spec!r}" in result.stderr and "ngram:n=N,max=M" in result.stderr
        assert "Traceback" not in result.stderr
