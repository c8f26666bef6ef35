"""Autoregressive draft models: an ordinary small LM with the target's vocabulary drafting greedily
in its own context, rolled back exactly (specla_context_truncate; a recurrent draft to its saved
state, specla_context_save_state) to what the target committed.

Synthetic models: a qwen2 draft of a qwen2 target is the target's own weights at q8_0 (close enough
to be accepted often, not always, so every step mixes acceptance and rollback); the draft of a
qwen35 target is a qwen2 model written with the same seed (hence the same token embedding, which
both LM heads are tied to) and the qwen35 vocabulary, or the qwen35 target's own weights at q8_0
(a recurrent draft)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.cli import main
from pyspecla.speculative.factory import DRAFT_MAX
from pyspecla.errors import NativeError, UsageError
from pyspecla.speculative.drafters import ModelDrafter
from pyspecla.speculative.loop import SpecConfig, generate
from pyspecla.testing.models import write_test_model

PROMPTS = ["def add(a, b):\n    return", "import numpy as np\n", "x = ", "class Cache:\n\tdef get(self, key"]
N_TOKENS = 64


@pytest.fixture(scope="module")
def files(tiny_model_path, tmp_path_factory):
    base = tmp_path_factory.mktemp("ar_draft")

    def write(name, **kwargs):
        path = str(base / name)
        write_test_model(path, preset="tiny", **kwargs)
        return path

    return {
        "qwen35": tiny_model_path("f32", seed=0),
        "qwen35_q8_0": tiny_model_path("q8_0", seed=0),  # a recurrent draft of the qwen35 target
        "qwen35_draft": write("qwen2-seed0-qwen35vocab.gguf", quant="f32", seed=0, arch="qwen2", vocab_pre="qwen35"),
        "qwen2": write("qwen2-seed4-f32.gguf", quant="f32", seed=4, arch="qwen2"),
        "qwen2_draft": write("qwen2-seed4-q8_0.gguf", quant="q8_0", seed=4, arch="qwen2"),
        "qwen2_other_size": write("qwen2-v1100.gguf", quant="f32", seed=5, arch="qwen2", n_vocab=1100),
        "qwen2_qwen2vocab": write("qwen2-seed0.gguf", quant="f32", seed=0, arch="qwen2"),  # same size, other tokens
    }


@pytest.fixture(scope="module")
def models(files):
    return {name: Model.load(path) for name, path in files.items() if name in ("qwen35", "qwen35_draft", "qwen2",
                                                                                 "qwen2_draft", "qwen35_q8_0")}


# --- (a) truncation ---------------------------------------------------------------------------------

def test_truncate_then_eval_equals_a_fresh_context_bit_for_bit(models):
    model = models["qwen2"]
    rng = np.random.default_rng(0)
    first = rng.integers(0, model.hparams.n_vocab, 40).tolist()
    second = rng.integers(0, model.hparams.n_vocab, 21).tolist()
    ctx = model.new_context(n_ctx=128, max_batch=16)  # chunked evals cross the truncation point
    for keep in (40, 33, 17, 1, 0):
        ctx.reset()
        ctx.eval(first)
        ctx.truncate(keep)
        assert ctx.n_past == keep
        ours = ctx.eval(second, logits_all=True)
        fresh = model.new_context(n_ctx=128, max_batch=16)
        expected = fresh.eval(first[:keep] + second, logits_all=True)[keep:]
        assert np.array_equal(ours, expected), f"truncate({keep}) then eval differs from a fresh context"
        fresh.close()
    ctx.close()


def test_truncate_bad_arguments_and_a_pending_tree(models):
    model = models["qwen2"]
    ctx = model.new_context(n_ctx=64, max_tree_nodes=4)
    ctx.eval([1, 2, 3, 4])
    with pytest.raises(NativeError, match=r"n_past 5 is not in \[0, 4\]"):
        ctx.truncate(5)
    with pytest.raises(NativeError, match="not in"):
        ctx.truncate(-1)
    assert ctx.n_past == 4
    # a verified tree's rows lie beyond n_past: truncating discards it, so accept has nothing to take
    ctx.verify_tree([4, 5, 6], [-1, 0, 1])
    ctx.truncate(2)
    with pytest.raises(NativeError, match="no verified tree"):
        ctx.accept([0, 1])
    after = ctx.eval([9])
    fresh = model.new_context(n_ctx=64)
    assert np.array_equal(after, fresh.eval([1, 2, 9]))


def test_a_recurrent_model_truncates_only_to_its_saved_state_and_stays_usable(models):
    model = models["qwen35"]
    ctx = model.new_context(n_ctx=64)
    ctx.eval([1, 2, 3])
    with pytest.raises(NativeError, match=r"recurrent .*saved position .*saved: -1\), not to 1"):
        ctx.truncate(1)
    assert ctx.n_past == 3
    fresh = model.new_context(n_ctx=64)
    assert np.array_equal(ctx.eval([4]), fresh.eval([1, 2, 3, 4]))

    ctx.save_state()  # at position 4
    ctx.truncate(4)  # where it stands: nothing to undo
    for extra in ([5, 6, 7], [8], [9, 10]):  # go past the saved point, come back, again and again
        ctx.eval(extra)
        with pytest.raises(NativeError, match="saved: 4"):
            ctx.truncate(3)  # before the saved point: refused
        ctx.truncate(4)
        assert ctx.n_past == 4
    back = ctx.eval([11, 12], logits_all=True)
    fresh = model.new_context(n_ctx=64)
    assert np.array_equal(back, fresh.eval([1, 2, 3, 4, 11, 12], logits_all=True)[4:])
    ctx.reset()  # forgets the saved state with the sequence
    ctx.eval([1, 2, 3, 4, 5])
    with pytest.raises(NativeError, match="saved: -1"):
        ctx.truncate(4)


# --- the drafter itself -----------------------------------------------------------------------------

def log_softmax(logits):
    x = logits.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def expected_proposal(draft, history, n_depths, top_k):
    """What a proposal must be, computed in a fresh context: the draft's greedy spine after the
    history and each depth's top_k by log-softmax (ties to the lowest id)."""
    ctx = draft.new_context(n_ctx=len(history) + n_depths)
    logits = ctx.eval(history)
    tokens, logprobs = [], []
    for _ in range(n_depths):
        lp = log_softmax(logits)
        order = np.lexsort((np.arange(len(lp)), -lp))[:top_k]
        tokens.append(order)
        logprobs.append(lp[order])
        logits = ctx.eval([int(order[0])])
    ctx.close()
    return np.array(tokens, np.int32), np.array(logprobs, np.float32)


@pytest.mark.parametrize("target,draft", [("qwen2", "qwen2_draft"), ("qwen35", "qwen35_q8_0")])
def test_proposals_after_rollbacks_equal_a_fresh_context(models, target, draft):
    """Histories that keep part of the last proposal, diverge from it, or restart (a new list)
    must all give exactly what a fresh context computes: the rollback (dropped KV rows, or for a
    recurrent draft its saved state) loses or keeps nothing it should not."""
    draft, target = models[draft], models[target]
    drafter = ModelDrafter(draft, target, n_ctx=128, max_depth=6, p_min=0.0)
    rng = np.random.default_rng(1)
    history = rng.integers(0, 1024, 9).tolist()
    drafter.history = history
    for step in range(8):
        tokens, logprobs = drafter.propose(None, history[-1], 6, 4)
        want_tokens, want_logprobs = expected_proposal(draft, history, 6, 4)
        assert np.array_equal(tokens, want_tokens) and np.array_equal(logprobs, want_logprobs), f"step {step}"
        assert np.all(np.isfinite(logprobs)) and np.all(logprobs <= 0) and np.all(np.diff(logprobs, axis=1) <= 0)
        kept = step % 4  # accept a prefix of the spine (0..3 tokens), then a token off the spine
        history.extend(int(t) for t in tokens[:kept, 0])
        history.append(int(tokens[kept, 1]))
        if step == 4:  # a new generation sharing only part of the prompt
            history = history[:5] + [7, 8]
            drafter.history = history


def test_p_min_stops_drafting_at_an_unconfident_depth(models):
    draft, target = models["qwen2_draft"], models["qwen2"]
    history = target.tokenize(PROMPTS[0])
    full, full_lp = expected_proposal(draft, history, 8, 3)
    p_top = np.exp(full_lp[:, 0].astype(np.float64))
    for p_min in (0.0, float(np.median(p_top)), 1.0):
        drafter = ModelDrafter(draft, target, n_ctx=64, max_depth=8, p_min=p_min)
        drafter.history = list(history)
        tokens, _ = drafter.propose(None, history[-1], 8, 3)
        confident = int(np.argmax(np.append(p_top < p_min, True)))  # depths before the first below p_min
        assert tokens.shape == (confident, 3) and np.array_equal(tokens, full[:confident])


def test_a_foreign_draft_is_refused(models, files):
    with pytest.raises(UsageError, match="vocabulary of the target"):
        ModelDrafter(models["qwen35"], models["qwen2"])  # another vocabulary
    with pytest.raises(UsageError, match="vocabulary of the target"):
        ModelDrafter(models["qwen35_draft"], models["qwen2"])  # same size, other token strings
    with pytest.raises(UsageError, match="--draft-max"):
        ModelDrafter(models["qwen2_draft"], models["qwen2"], max_depth=0)
    with pytest.raises(UsageError, match="--draft-p-min"):
        ModelDrafter(models["qwen2_draft"], models["qwen2"], p_min=1.5)


# --- (b) lossless, (c) draft = target -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["chain", "ddtree"])
@pytest.mark.parametrize("specla", [True, False])
@pytest.mark.parametrize("target,draft", [("qwen35", "qwen35_draft"), ("qwen2", "qwen2_draft"),
                                          ("qwen35", "qwen35_q8_0")])
def test_speculative_output_equals_autoregressive(models, target, draft, mode, specla):
    target_model = models[target]
    drafter = ModelDrafter(models[draft], target_model, n_ctx=256, max_depth=5, p_min=0.0)
    accepted = []
    for text in PROMPTS[:3]:
        prompt = target_model.tokenize(text)
        reference = target_model.generate(prompt, N_TOKENS)
        config = SpecConfig(mode=mode, specla=specla, max_depth=drafter.max_depth, budget=12)
        stats, ctx = generate(target_model, prompt, N_TOKENS, config, drafter=drafter)
        ctx.close()
        assert stats.tokens == reference, f"{text!r}: speculative output differs from autoregressive"
        accepted += stats.accepted_per_step
    # the draft is right sometimes (>= 2 drafted tokens accepted) and wrong sometimes (a step commits
    # less than the whole chain + bonus): both the kept prefix and the rollback were exercised
    assert max(accepted) >= 3 and min(accepted) <= drafter.max_depth


@pytest.mark.parametrize("specla", [True, False])
@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_the_target_as_its_own_draft_accepts_every_drafted_token(models, mode, specla):
    target = models["qwen2"]
    depth = 8
    drafter = ModelDrafter(target, target, n_ctx=256, max_depth=depth, p_min=0.0)
    for text in PROMPTS[:2]:
        prompt = target.tokenize(text)
        # tau off: the DDTree then always holds the draft's whole top-1 chain
        config = SpecConfig(mode=mode, specla=specla, max_depth=depth, tau=None)
        stats, ctx = generate(target, prompt, 1 + 8 * (depth + 1), config, drafter=drafter)
        ctx.close()
        assert stats.tokens == target.generate(prompt, 1 + 8 * (depth + 1))
        assert stats.accepted_per_step == [depth + 1] * 8


# --- (d), (e) the command line ------------------------------------------------------------------------

def run(capsys, *args):
    code = main(["run", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("target,draft", [("qwen35", "qwen35_draft"), ("qwen2", "qwen2_draft"),
                                          ("qwen35", "qwen35_q8_0")])
def test_cli_run_with_a_draft_model_prints_the_autoregressive_text(files, capsys, tmp_path, target, draft):
    common = ["-p", PROMPTS[0], "-n", "32", "--ignore-eos"]
    code, plain, _ = run(capsys, files[target], *common)
    assert code == 0
    stats_file = tmp_path / "stats.json"
    code, spec, err = run(capsys, files[target], *common, "--draft", files[draft], "--specla",
                          "--stats-json", str(stats_file))
    assert code == 0, err
    assert spec == plain
    record = json.loads(stats_file.read_text())
    assert len(record["tokens"]) == 32 and record["draft"] == files[draft]
    assert record["config"]["max_depth"] == DRAFT_MAX  # the --draft-max default
    assert record["config"]["mode"] == "chain"  # a draft LM's default: its top-1 chain
    code, tree_text, err = run(capsys, files[target], *common, "--draft", files[draft], "--specla",
                               "--ddtree-budget", "6", "--stats-json", str(stats_file))
    assert code == 0, err
    assert tree_text == plain
    record = json.loads(stats_file.read_text())
    assert record["config"]["mode"] == "ddtree" and record["config"]["budget"] == 6  # asked for a tree


def test_cli_the_target_as_its_own_draft(files, capsys, tmp_path):
    stats_file = tmp_path / "stats.json"
    code, _, err = run(capsys, files["qwen2"], "-p", PROMPTS[1], "-n", "41", "--ignore-eos", "--draft", files["qwen2"],
                       "--no-ddtree", "--draft-max", "4", "--draft-p-min", "0", "--stats-json", str(stats_file))
    assert code == 0, err
    record = json.loads(stats_file.read_text())
    assert record["config"]["max_depth"] == 4
    assert record["accepted_per_step"] == [5] * 8  # 1 token from the prompt pass + 8 steps of 4 + 1


@pytest.mark.parametrize(
    "target,args,needles",
    [
        ("qwen2", ["--draft", "{qwen2_other_size}"], ["{qwen2_other_size}", "{qwen2}", "1100 tokens"]),
        ("qwen35", ["--draft", "{qwen2_qwen2vocab}"], ["{qwen2_qwen2vocab}", "{qwen35}", "token "]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-max", "0"], ["--draft-max must be positive"]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-max", "2000"], ["--draft-max must be an integer in"]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-p-min", "1.5"], ["--draft-p-min must be in [0, 1]"]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-p-min", "high"], ["--draft-p-min expects a number"]),
        ("qwen2", ["--draft", "ngram", "--draft-max", "4"], ["--draft-max applies to a draft language model"]),
        ("qwen2", ["--draft-p-min", "0.2"], ["--draft-p-min needs --draft"]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-vocab", "-1"], ["--draft-vocab must be >= 0"]),
        ("qwen2", ["--draft", "{qwen2_draft}", "--draft-vocab", "1k"], ["--draft-vocab expects an integer"]),
        ("qwen2", ["--draft", "ngram", "--draft-vocab", "100"], ["--draft-vocab applies to a draft language model"]),
        ("qwen2", ["--draft-vocab", "100"], ["--draft-vocab needs --draft"]),
    ],
)
def test_cli_bad_drafts_are_one_clear_line(files, capsys, target, args, needles):
    args = [a.format(**files) for a in args]
    try:
        code = main(["run", files[target], "-p", "x", "-n", "4", *args])
    except SystemExit as exc:  # argparse rejects bad flag values itself, also with status 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    for needle in needles:
        assert needle.format(**files) in err
    assert "Traceback" not in err
    assert needles[-1].format(**files) in err.strip().splitlines()[-1]  # the message is one line
