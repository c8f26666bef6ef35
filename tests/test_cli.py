"""The command line as a user meets it: run, inspect, --help, and clean failures (one line on
stderr naming the file or flag, exit status 2, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pyspecla.cli import build_parser, main


def run_cli(*args, timeout=120):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "pyspecla", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_run_streams_text_and_reports_speed(tiny_model_path):
    path = tiny_model_path("q8_0")
    result = run_cli("run", path, "-p", "def add(a, b):\n", "-n", "12", "--ignore-eos")
    assert result.returncode == 0, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("prompt: ") and "tokens/s" in last and "decode: 11 tokens" in last


def test_run_output_equals_greedy_generation(tiny_model_path, capsys):
    from pyspecla import Model

    path = tiny_model_path("f32")
    model = Model.load(path)
    prompt = "Hello, world"
    expected = model.detokenize(model.generate(model.tokenize(prompt), 16))
    assert main(["run", path, "-p", prompt, "-n", "16", "--ignore-eos"]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_run_with_chat_and_sampling_is_reproducible(tiny_model_path):
    path = tiny_model_path("q8_0")
    args = ("run", path, "-p", "hi", "--chat", "-n", "8", "--temp", "0.9", "--seed", "5", "--ignore-eos")
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout


def test_prompt_file_keeps_final_newline(tiny_model_path, tmp_path, capsys):
    from pyspecla import Model

    path = tiny_model_path("f32")
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_bytes("def f(x):\n".encode())
    model = Model.load(path)
    expected = model.detokenize(model.generate(model.tokenize("def f(x):\n"), 6))
    assert main(["run", path, "-f", str(prompt_file), "-n", "6", "--ignore-eos"]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_inspect_lists_metadata_pattern_and_tensors(tiny_model_path):
    result = run_cli("inspect", tiny_model_path("q4_k_m"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "architecture: qwen35" in out
    assert "RRRA" in out
    assert "blk.0.attn_qkv.weight" in out and "Q6_K" in out and "Q4_K" in out


def test_a_reader_that_stops_early_ends_inspect_without_a_traceback(tiny_model_path, monkeypatch, capsys):
    """`pyspecla inspect model.gguf | head -1`: stdout's reader has gone, so the command ends with
    status 141 (as SIGPIPE ends cat) and nothing on stderr. The pipe's read end is closed before the
    first write, so the write fails every time, not only when the reader loses a race."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stdout = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["inspect", tiny_model_path("q4_k_m")]) == 141
    finally:
        stdout.close()  # (its descriptor now points at /dev/null)
    assert capsys.readouterr().err == ""


def test_a_model_whose_weights_hold_nan_is_named_not_run(tiny_model_path, tmp_path):
    """NaN in a weight makes every logit NaN, and the argmax of a NaN row is token 0: without a
    look at the logits a run printed token 0 over and over and exited 0. The prompt's last logits
    row is checked once per generation: the file is named, exit 2, plain and speculative alike."""
    from gguf_fixtures import copy_with_a_nan_weight

    path = copy_with_a_nan_weight(tiny_model_path("f32"), str(tmp_path / "nan.gguf"))
    for extra in ([], ["--draft", "oracle:p=0.9"]):
        result = run_cli("run", path, "-p", "x = ", "-n", "4", *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"{path}: the logits after the prompt are not finite" in result.stderr
        assert "Traceback" not in result.stderr


def test_help_documents_every_flag():
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help text"
    result = run_cli("run", "--help")
    assert result.returncode == 0 and "--n-predict" in result.stdout and "--temp" in result.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "{missing}", "-p", "x"], "{missing}"),
        (["run", "{model}", "-p", "x", "-n", "0"], "-n/--n-predict must be positive"),
        (["run", "{model}", "-p", "x", "--temp", "-1"], "--temp must be >= 0"),
        (["run", "{model}", "-p", "x", "--temp", "hot"], "--temp expects a number"),
        (["run", "{model}"], "needs a prompt"),
        (["run", "{model}", "-f", "{missing}"], "--prompt-file"),
        (["run", "{notgguf}", "-p", "x"], "not a GGUF"),
        (["inspect", "{notgguf}"], "not a GGUF"),
        (["run", "{model}", "-p", "x", "-t", "-1"], "-t/--threads must be >= 0"),
        (["run", "{model}", "-p", "x", "-t", "1000"], "-t/--threads must be at most"),
        (["run", "{model}", "-p", "x", "--temp", "inf"], "--temp must be a finite number"),
        (["run", "{model}", "-p", "x", "--top-p", "0"], "--top-p must be in (0, 1], got 0"),
        (["run", "{model}", "-p", "x", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["run", "{model}", "-p", "x", "--top-k", "-3"], "--top-k must be >= 0, got -3"),
        (["run", "{model}", "-p", "x", "--min-p", "2"], "--min-p must be in [0, 1], got 2"),
        (["run", "{model}", "-p", "x", "--repeat-penalty", "0"], "--repeat-penalty must be > 0, got 0"),
        (["run", "{model}", "-p", "x", "--presence-penalty", "nan"], "--presence-penalty must be a finite number"),
        (["run", "{model}", "-p", "x", "--frequency-penalty", "x"], "--frequency-penalty expects a number"),
        (["run", "{model}", "-p", "x", "--repeat-last-n", "-2"], "--repeat-last-n must be >= -1, got -2"),
        (["run", "{model}", "-p", "x", "--seed", "1.5"], "--seed expects an integer"),
        (["run", "{model}", "-p", "x", "--draft", "ngram", "--ddtree-tau", "nan"], "--ddtree-tau must be a finite number"),
        (["run", "{model}", "-p", "x", "--stats-json", "{missing_dir}/run.json"], "does not exist"),
        (["run", "{model}", "-p", "x", "--stats-json", "{tmp}"], "is a directory"),
    ],
)
def test_bad_input_is_one_clear_line(tiny_model_path, tmp_path, args, needle):
    paths = {
        "model": tiny_model_path("q8_0"),
        "missing": str(tmp_path / "no-such-file.gguf"),
        "notgguf": str(tmp_path / "notes.txt"),
        "missing_dir": str(tmp_path / "no-such-dir"),
        "tmp": str(tmp_path),
    }
    (tmp_path / "notes.txt").write_text("this is not a model\n")
    args = [a.format(**paths) for a in args]
    needle = needle.format(**paths)
    result = run_cli(*args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_negative_seed_means_a_random_seed(tiny_model_path):
    path = tiny_model_path("q8_0")
    result = run_cli("run", path, "-p", "x", "-n", "4", "--temp", "0.8", "--seed", "-1", "--ignore-eos")
    assert result.returncode == 0, result.stderr
    assert "negative" in run_cli("run", "--help").stdout


def test_stats_json_of_a_plain_run_stays_on_the_plain_path(tiny_model_path, tmp_path, monkeypatch):
    import json

    import pyspecla.speculative.loop as loop

    def no_loop(*args, **kwargs):
        raise AssertionError("a plain run went through the speculative loop")

    monkeypatch.setattr(loop, "generate", no_loop)
    out = tmp_path / "run.json"
    assert main(["run", tiny_model_path("q8_0"), "-p", "x", "-n", "5", "--ignore-eos", "--stats-json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["mode"] == "plain" and record["decode_tokens"] == 4


class _InterruptingOut:
    """A stdout on which the first written text raises KeyboardInterrupt (Ctrl-C mid-stream)."""

    def write(self, text):
        if text:
            raise KeyboardInterrupt
        return 0

    def flush(self):
        pass


@pytest.mark.parametrize("extra", [[], ["--draft", "oracle:p=0.8"]], ids=["plain", "speculative"])
def test_ctrl_c_exits_130_in_both_modes(tiny_model_path, monkeypatch, extra):
    monkeypatch.setattr(sys, "stdout", _InterruptingOut())
    assert main(["run", tiny_model_path("f32"), "-p", "x", "-n", "8", "--ignore-eos", *extra]) == 130


def test_demo_builds_its_models_once_and_runs_every_mode(tmp_path):
    first = run_cli("demo", "--cache-dir", str(tmp_path), "-n", "24", timeout=600)
    assert first.returncode == 0, first.stderr
    assert "building the demo target" in first.stderr and "building the demo draft" in first.stderr
    table = first.stdout.splitlines()
    modes = [line for line in table if line.startswith(("autoregressive", "chain", "DDTree"))]
    assert len(modes) == 6
    assert all(line.split()[-1] == "yes" for line in modes), "a mode's output differs from autoregressive"
    second = run_cli("demo", "--cache-dir", str(tmp_path), "-n", "24", timeout=600)
    assert second.returncode == 0 and "building" not in second.stderr
    assert second.stdout.splitlines()[-3:] == first.stdout.splitlines()[-3:], "the demo text is deterministic"


@pytest.fixture(scope="module")
def draft_pair(tiny_model_path, tmp_path_factory):
    from pyspecla.testing.drafts import write_test_draft

    target = tiny_model_path("q8_0", preset="tiny8")
    draft = str(tmp_path_factory.mktemp("draft") / "draft.gguf")
    write_test_draft(draft, target, seed=2)
    return target, draft


@pytest.mark.parametrize("cache_dir", ["{file}", "{file}/below"])
def test_demo_cache_dir_that_cannot_be_a_directory_is_named(tmp_path, cache_dir):
    (tmp_path / "notes.txt").write_text("a file, not a directory\n")
    cache_dir = cache_dir.format(file=tmp_path / "notes.txt")
    result = run_cli("demo", "--cache-dir", cache_dir, "-n", "2")
    assert result.returncode == 2, result.stderr
    assert f"demo cache directory {cache_dir}: cannot create it" in result.stderr and "--cache-dir" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("extra", [[], ["--specla"], ["--no-ddtree", "--specla"], ["--specla", "--ddtree-budget", "5",
                                                                                   "--ddtree-tau", "0"],
                                   ["--specla", "--draft-vocab", "64"]])  # a DFlash draft over part of the head
def test_run_with_a_draft_equals_plain_run_and_writes_stats(draft_pair, tmp_path, extra):
    import json

    target, draft = draft_pair
    plain = run_cli("run", target, "-p", "x = ", "-n", "20", "--ignore-eos")
    stats_file = tmp_path / "stats.json"
    spec = run_cli("run", target, "-p", "x = ", "-n", "20", "--ignore-eos", "--draft", draft, *extra,
                   "--stats-json", str(stats_file))
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    record = json.loads(stats_file.read_text())
    for key in ("tokens", "steps", "accepted_per_step", "draft_ms", "verify_ms", "tokens_per_s"):
        assert key in record
    assert len(record["tokens"]) == 20 and len(record["accepted_per_step"]) == record["steps"]
    last = spec.stderr.strip().splitlines()[-1]
    assert "accepted/step" in last and "verify" in last and "tokens/s" in last


@pytest.mark.parametrize("draft,extra", [("{draft}", ["--specla"]), ("oracle:p=0.9", []), ("ngram", ["--no-ddtree"])])
def test_sampled_run_with_a_draft_equals_the_sampled_plain_run(draft_pair, tmp_path, draft, extra):
    import json

    target, dflash = draft_pair
    sampling = ["--temp", "0.8", "--top-p", "0.95", "--min-p", "0.01", "--repeat-penalty", "1.1", "--seed", "7",
                "-t", "1"]
    plain_stats, spec_stats = tmp_path / "plain.json", tmp_path / "spec.json"
    plain = run_cli("run", target, "-p", "x = ", "-n", "24", "--ignore-eos", *sampling, "--stats-json",
                    str(plain_stats))
    spec = run_cli("run", target, "-p", "x = ", "-n", "24", "--ignore-eos", *sampling,
                   "--draft", draft.format(draft=dflash), *extra, "--stats-json", str(spec_stats))
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    plain_record, spec_record = json.loads(plain_stats.read_text()), json.loads(spec_stats.read_text())
    assert spec_record["tokens"] == plain_record["tokens"] and len(plain_record["tokens"]) == 24
    assert spec.stdout == plain.stdout
    assert plain_record["seed"] == spec_record["seed"] == 7
    greedy = run_cli("run", target, "-p", "x = ", "-n", "24", "--ignore-eos", "-t", "1", "--stats-json",
                     str(plain_stats))
    assert greedy.returncode == 0, greedy.stderr
    assert json.loads(plain_stats.read_text())["tokens"] != spec_record["tokens"], "sampling changed nothing"


def test_run_with_the_oracle_drafter(draft_pair):
    target, _ = draft_pair
    plain = run_cli("run", target, "-p", "x = ", "-n", "30", "--ignore-eos")
    spec = run_cli("run", target, "-p", "x = ", "-n", "30", "--ignore-eos", "--draft", "oracle:p=0.9", "--specla")
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--specla"], "--specla needs --draft"),
        (["--no-ddtree"], "--no-ddtree needs --draft"),
        (["--ddtree-budget", "8"], "--ddtree-budget needs --draft"),
        (["--draft", "{draft}", "--ddtree-budget", "0"], "--ddtree-budget must be positive"),
        (["--draft", "{draft}", "--ddtree-budget", "100000000"], "--ddtree-budget 100000000: a tree cannot be"),
        (["--draft", "{draft}", "--specla-top-k", "-2"], "--specla-top-k must be positive"),
        (["--draft", "oracle:p=1.5"], "oracle"),
        (["--draft", "oracle:q"], "oracle:p=P"),
        (["--draft", "{other_draft}"], "{other_draft}"),
        (["--draft", "{draft}", "--draft-max", "3"], "--draft-max applies to a draft language model"),
        (["--draft", "oracle:p=0.5", "--draft-vocab", "64"], "--draft-vocab applies to a draft language model"),
    ],
)
def test_speculative_bad_input_is_one_clear_line(draft_pair, tiny_model_path, tmp_path, args, needle):
    from pyspecla.testing.drafts import write_test_draft
    from pyspecla.testing.models import write_test_model

    target, draft = draft_pair
    other_target, other_draft = str(tmp_path / "other.gguf"), str(tmp_path / "other-draft.gguf")
    write_test_model(other_target, "tiny", "f32", seed=3, n_vocab=1100)  # another vocabulary
    write_test_draft(other_draft, other_target, seed=3)
    paths = {"target": target, "draft": draft, "other_draft": other_draft}
    args = [a.format(**paths) for a in args]
    result = run_cli("run", target, "-p", "x", "-n", "4", *args)
    assert result.returncode == 2, result.stderr
    assert needle.format(**paths) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_draft_passed_as_the_target_is_named(draft_pair):
    _, draft = draft_pair
    result = run_cli("run", draft, "-p", "x", "-n", "4")
    assert result.returncode == 2 and "is a DFlash draft" in result.stderr


def test_inspect_describes_a_draft(draft_pair):
    _, draft = draft_pair
    result = run_cli("inspect", draft)
    assert result.returncode == 0, result.stderr
    assert "DFlash draft:" in result.stdout and "dflash.fc.weight" in result.stdout


def test_make_drafter_gives_a_dflash_draft_its_reduced_vocabulary(draft_pair):
    from pyspecla import Model
    from pyspecla.speculative.factory import DRAFT_VOCAB, make_drafter

    target, draft = draft_pair
    model = Model.load(target)
    assert model.hparams.n_vocab <= DRAFT_VOCAB  # so the default keeps this tiny target's whole head
    assert make_drafter(model, draft, [1, 2], 8, 64).vocabulary is None
    drafter = make_drafter(model, draft, [1, 2], 8, 64, draft_vocab=100)
    assert drafter.vocabulary.n_frequent == 100 and drafter.history == []
    assert make_drafter(model, draft, [1, 2], 8, 64, draft_vocab=0).vocabulary is None


def test_version_and_file_type_names(tiny_model_path):
    from pyspecla import __version__

    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"pyspecla {__version__}"
    shown = run_cli("inspect", tiny_model_path("q8_0"))
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if "general.file_type" in line)
    assert line.strip() == "general.file_type = 7 (Q8_0)"
