"""-c/--ctx-size and the model's trained context: what a run's context holds (context_size.py),
honoured by plain runs, --draft, --stats-json and demo alike, and the prefill progress line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pyspecla.context_size import MAX_CTX_SIZE, PROGRESS_MIN_TOKENS, plan_context
from pyspecla.errors import UsageError

TRAINED = 64  # the small model's context_length


def run_cli(*args, timeout=300):
    """The command's result, stdout and stderr decoded as they are (text=True would turn \r into \n)."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    result = subprocess.run([sys.executable, "-m", "pyspecla", *args], capture_output=True, timeout=timeout, env=env)
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


# ------------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------------


def test_default_context_is_prompt_plus_new_tokens():
    plan = plan_context(10, 20, None, 4096)
    assert (plan.n_ctx, plan.n_predict, plan.warnings) == (30, 20, [])


def test_default_context_is_capped_by_the_trained_context_and_generation_stops_there():
    plan = plan_context(10, 3_000_000_000, None, 4096)  # a huge -n: no overflow, no negative size
    assert (plan.n_ctx, plan.n_predict) == (4096, 4086)
    assert len(plan.warnings) == 1 and "4086" in plan.warnings[0] and "3000000000" in plan.warnings[0]


def test_ctx_size_caps_the_new_tokens():
    plan = plan_context(10, 20, 15, 4096)
    assert (plan.n_ctx, plan.n_predict) == (15, 5)
    assert "at most 5 new tokens" in plan.warnings[0]


def test_ctx_size_above_the_trained_context_is_allowed_with_a_warning():
    plan = plan_context(10, 20, 8192, 4096)
    assert (plan.n_ctx, plan.n_predict) == (8192, 20)
    assert len(plan.warnings) == 1 and "8192" in plan.warnings[0] and "4096" in plan.warnings[0]


@pytest.mark.parametrize("n_prompt,ctx_size,trained,needles", [
    (13202, None, 4096, ["13202", "4096", "trained context"]),
    (3, 3, 4096, ["the prompt is 3 tokens", "holds 3", "-c/--ctx-size 3"]),
    (40, 20, 4096, ["the prompt is 40 tokens", "holds 20"]),
])
def test_a_prompt_that_fills_the_context_is_an_error_naming_both_lengths(n_prompt, ctx_size, trained, needles):
    with pytest.raises(UsageError) as info:
        plan_context(n_prompt, 8, ctx_size, trained)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_ctx_size_out_of_range_is_refused():
    with pytest.raises(UsageError, match=r"-c/--ctx-size must be in \[1, "):
        plan_context(5, 5, MAX_CTX_SIZE + 1, 4096)


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    from pyspecla.testing.models import write_test_model

    path = str(tmp_path_factory.mktemp("ctx") / f"tiny-ctx{TRAINED}.gguf")
    write_test_model(path, preset="tiny", quant="q8_0", seed=0, context_length=TRAINED)
    return path


def _prompt_of(model_path: str, at_least: int) -> tuple[str, int]:
    """A prompt text of at least `at_least` tokens and its token count."""
    from pyspecla import Model

    model = Model.load(model_path)
    text = ""
    while True:
        text += "the quick brown fox jumps over the lazy dog. "
        n = len(model.tokenize(text))
        if n >= at_least:
            return text, n


@pytest.mark.parametrize("extra", [[], ["--draft", "ngram"], ["--stats-json", "{stats}"]])
def test_a_prompt_longer_than_the_trained_context_is_one_line(short_context_model, tmp_path, extra):
    prompt, n = _prompt_of(short_context_model, TRAINED + 1)
    extra = [a.format(stats=tmp_path / "stats.json") for a in extra]
    result = run_cli("run", short_context_model, "-p", prompt, "-n", "4", *extra)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the prompt is {n} tokens" in lines[0] and f"holds {TRAINED}" in lines[0], lines[0]


@pytest.mark.parametrize("extra", [["--draft", "ngram"], ["--draft", "oracle:p=0.9"], ["--stats-json", "{stats}"]])
def test_ctx_size_caps_the_output_with_a_draft_and_with_stats_json(short_context_model, tmp_path, extra):
    stats = tmp_path / "stats.json"
    extra = [a.format(stats=stats) for a in extra] + ["--stats-json", str(stats)]
    _, n_prompt = _prompt_of(short_context_model, 1)
    result = run_cli("run", short_context_model, "-p", "the quick brown fox jumps over the lazy dog. ",
                     "-n", "40", "--ignore-eos", "-c", str(n_prompt + 6), *extra)
    assert result.returncode == 0, result.stderr
    assert "generating at most 6 new tokens, not 40" in result.stderr
    assert len(json.loads(stats.read_text())["tokens"]) == 6
    plain = run_cli("run", short_context_model, "-p", "the quick brown fox jumps over the lazy dog. ",
                    "-n", "6", "--ignore-eos")
    assert result.stdout == plain.stdout


def test_a_huge_n_predict_stops_at_the_trained_context(short_context_model):
    _, n_prompt = _prompt_of(short_context_model, 1)
    for extra in ([], ["--draft", "ngram"]):
        result = run_cli("run", short_context_model, "-p", "the quick brown fox jumps over the lazy dog. ",
                         "-n", "3000000000", "--ignore-eos", *extra)
        assert result.returncode == 0, result.stderr
        assert f"generating at most {TRAINED - n_prompt} new tokens, not 3000000000" in result.stderr


def test_ctx_size_above_the_trained_context_warns(short_context_model):
    result = run_cli("run", short_context_model, "-p", "hi", "-n", "2", "-c", str(2 * TRAINED))
    assert result.returncode == 0, result.stderr
    assert f"-c/--ctx-size {2 * TRAINED} is larger than the model's trained context ({TRAINED} tokens)" \
        in result.stderr


def test_demo_honours_ctx_size(tmp_path):
    result = run_cli("demo", "--cache-dir", str(tmp_path), "-n", "24", "-c", "12", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "generating at most" in result.stderr and "not 24" in result.stderr
    modes = [line for line in result.stdout.splitlines() if line.startswith(("autoregressive", "chain", "DDTree"))]
    assert len(modes) == 6 and all(line.split()[-1] == "yes" for line in modes)


@pytest.mark.parametrize("extra", [[], ["--draft", "ngram"]])
def test_a_long_prompt_shows_prefill_progress_on_one_line(tiny_model_path, extra):
    path = tiny_model_path("q8_0")
    prompt, n = _prompt_of(path, PROGRESS_MIN_TOKENS)
    result = run_cli("run", path, "-p", prompt, "-n", "2", *extra)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.split("\n")  # (splitlines would split at \r too)
    progress = [line for line in lines if f"/{n} tokens" in line]
    assert len(progress) == 1, result.stderr  # one line, rewritten in place with \r
    updates = progress[0].split("\r")[1:]
    assert updates[-1] == f"prompt: {n}/{n} tokens" and len(updates) == -(-n // 64)


def test_a_short_prompt_shows_no_progress(tiny_model_path):
    result = run_cli("run", tiny_model_path("q8_0"), "-p", "hi", "-n", "2")
    assert result.returncode == 0 and "\r" not in result.stderr


def test_python_generate_with_a_huge_max_tokens_names_the_size(tiny_model_path):
    from pyspecla import Model

    model = Model.load(tiny_model_path("q8_0"))
    with pytest.raises(UsageError, match=r"n_ctx 3000000003 is too large"):
        model.generate([1, 2], 3_000_000_000)
