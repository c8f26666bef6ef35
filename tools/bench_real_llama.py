"""The llama.cpp baseline of tools/bench_real.py: greedy decoding, prompt lookup and llama.cpp's
draft-model scheme driven through llama-cpp-python, the k-node verify cost, and llama.cpp's own
llama-speculative-simple program run per prompt (bench_real.py's docstring describes the settings)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_real_report import _describe, acceptance_figures, first_difference
from prompts_real import Prompt

LLAMA_SETTINGS = ("ar", "lookup", "draft")
DRAFT_P_TOP_K = 10  # llama.cpp's draft sampler: top-k 10, so its p is a softmax over the top 10 logits


def emit_tokens(out: list[int], new, max_tokens: int, eos_ids) -> bool:
    """Append new tokens to out up to max_tokens / the first EOS (kept); True when generation is over."""
    for t in new:
        if len(out) >= max_tokens:
            return True
        out.append(int(t))
        if int(t) in eos_ids:
            return True
    return len(out) >= max_tokens


def eval_prompt(llm, tokens) -> np.ndarray:
    """Evaluate a prompt computing the logits of its last token only, as llama.cpp's own prompt pass
    does (Llama(logits_all=True).eval would run the LM head on every row), and return them.
    Relies on llama-cpp-python 0.3.x internals: Llama.eval reads self._logits_all per call and marks
    the batch's last token as an output either way; llama_get_logits_ith(ctx, -1) is that row.
    llm.scores is not written for these rows."""
    saved = llm._logits_all
    llm._logits_all = False
    try:
        llm.eval(list(tokens))
    finally:
        llm._logits_all = saved
    return last_logits(llm)


def last_logits(llm) -> np.ndarray:
    """The logits of the last evaluated token, read through llama.cpp's C API (llama_get_logits_ith
    -1): Llama.eval always marks a batch's last token as an output, with or without logits_all."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def _argmax_rows(llm, first: int, n: int) -> np.ndarray:
    # Llama(logits_all=True).eval copies every row's logits into llm.scores[n_past : n_past + n]
    return np.argmax(llm.scores[first:first + n], axis=1)


class PromptLookupProposer:
    """llama-cpp-python's prompt lookup proposal (LlamaPromptLookupDecoding.find_candidate_pred_tokens:
    the earliest occurrence of the longest suffix n-gram, n = max_ngram down to 1)."""

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def start(self, prompt_ids) -> float:
        return 0.0

    def propose(self, history: list[int]) -> list[int]:
        found = self.find(np.asarray(history, dtype=np.intc), self.max_ngram, self.max_tokens)
        return [int(t) for t in found]


class DraftModelProposer:
    """llama.cpp's draft-model proposal (common_speculative_gen_draft): the draft's KV cache keeps the
    longest prefix it shares with the history; it evaluates the rest (the last token included), then
    greedily proposes up to n_max tokens while its top-1 probability (softmax over its top-10 logits)
    is at least p_min, evaluating each kept token except the last. Only the last row's logits are
    ever read, so the draft is loaded without logits_all (its LM head runs on that row only, as in
    llama.cpp's own program)."""

    def __init__(self, draft_llm, n_max: int, p_min: float):
        self.llm, self.n_max, self.p_min = draft_llm, n_max, p_min

    def start(self, prompt_ids) -> float:
        """Prefill the draft with the prompt (all but its last token, which the first propose
        evaluates with the first root); returns the ms it took."""
        t0 = time.perf_counter()
        self.llm.reset()
        if len(prompt_ids) > 1:
            eval_prompt(self.llm, prompt_ids[:-1])
        return (time.perf_counter() - t0) * 1e3

    @staticmethod
    def top1_probability(logits: np.ndarray, top_k: int = DRAFT_P_TOP_K) -> float:
        top = np.partition(logits, -top_k)[-top_k:].astype(np.float64)
        return float(1.0 / np.exp(top - top.max()).sum())

    def propose(self, history: list[int]) -> list[int]:
        llm = self.llm
        n = llm.n_tokens
        have = np.asarray(llm.input_ids[:n])
        want = np.asarray(history[:n], dtype=have.dtype)
        differ = np.flatnonzero(have[:len(want)] != want)
        common = int(differ[0]) if len(differ) else min(n, len(want))
        common = min(common, len(history) - 1)  # re-evaluate at least the last token: its logits
        llm.n_tokens = common  # the next eval drops the KV rows from here on
        llm.eval(history[common:])
        drafts: list[int] = []
        while len(drafts) < self.n_max:
            row = last_logits(llm)
            token = int(np.argmax(row))
            if self.top1_probability(row) < self.p_min:
                break
            drafts.append(token)
            if len(drafts) >= self.n_max:
                break
            llm.eval([token])
        return drafts


def llama_generate(llm, prompt_ids, max_tokens: int, eos_ids, proposer=None) -> dict:
    """Greedy generation with llama.cpp: token by token (proposer None) or speculative (one batch
    eval of [last token + drafts], longest agreeing prefix + the target's next token accepted, the
    rest of the KV cache dropped). llm must be built with logits_all=True."""
    llm.reset()
    draft_prompt_ms = proposer.start(prompt_ids) if proposer is not None else 0.0
    t0 = time.perf_counter()
    root = int(np.argmax(eval_prompt(llm, prompt_ids)))
    prompt_ms = (time.perf_counter() - t0) * 1e3
    t_decode = time.perf_counter()
    out: list[int] = []
    done = emit_tokens(out, [root], max_tokens, eos_ids)
    history = list(prompt_ids) + out
    accepted, drafted = [], []
    draft_ms = verify_ms = 0.0
    while not done:
        t_step = time.perf_counter()
        drafts = proposer.propose(history) if proposer is not None else []
        t_verify = time.perf_counter()
        draft_ms += (t_verify - t_step) * 1e3
        base = llm.n_tokens
        llm.eval([root] + drafts)
        predictions = _argmax_rows(llm, base, 1 + len(drafts))
        n_ok = 0
        while n_ok < len(drafts) and int(predictions[n_ok]) == drafts[n_ok]:
            n_ok += 1
        new = drafts[:n_ok] + [int(predictions[n_ok])]
        llm.n_tokens = base + 1 + n_ok  # the root and the accepted drafts stay; Llama.eval drops the rest
        verify_ms += (time.perf_counter() - t_verify) * 1e3
        accepted.append(len(new))
        drafted.append(len(drafts))
        before = len(out)
        done = emit_tokens(out, new, max_tokens, eos_ids)
        history.extend(out[before:])
        root = new[-1]
    decode_s = time.perf_counter() - t_decode
    n_decoded = max(len(out) - 1, 0)
    return {"tokens": out, "tokens_per_s": n_decoded / decode_s if decode_s > 0 else 0.0, "prompt_ms": prompt_ms,
            "decode_s": decode_s, "draft_ms": draft_ms, "verify_ms": verify_ms, "draft_prompt_ms": draft_prompt_ms,
            **acceptance_figures(accepted, drafted)}


def verify_cost_llama(llm, prompt_ids, continuation, ks, repeats: int) -> list[dict]:
    """llama.cpp's cost of evaluating k tokens in one batch (all logits) at the same position as
    verify_cost_pyspecla, the KV cache trimmed back after each, against a 1-token eval."""
    ks = sorted(set(ks))
    k_max = max(ks)
    half = len(continuation) // 2
    chain = ((list(continuation[half:]) + list(prompt_ids)) * (k_max + 1))[:k_max]
    llm.reset()
    eval_prompt(llm, list(prompt_ids) + list(continuation[:half]))
    base = llm.n_tokens
    times = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            llm.n_tokens = base
            t0 = time.perf_counter()
            llm.eval(chain[:k])
            np.argmax(llm.scores[base:base + k], axis=1)
            times[k].append((time.perf_counter() - t0) * 1e3)
    llm.n_tokens = base
    step = statistics.median(times[1]) if 1 in times else None
    return [{"runtime": "llama.cpp", "mode": "verify_cost", "k": k, "verify_ms": statistics.median(times[k]),
             "decode_step_ms": step, "verify_in_decode_steps": statistics.median(times[k]) / step if step else None,
             "n_past": base, "repeats": repeats} for k in ks]


# ---------------------------------------------------------------------------------------------
# llama.cpp's own speculative program (llama-speculative-simple)


_BINARY_FIGURES = {  # what llama-speculative-simple prints to stderr at the end of a run
    "encoded": r"encoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "decoded": r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "n_drafted": r"n_drafted\s*=\s*(\d+)",
    "n_accept": r"n_accept\s*=\s*(\d+)",
}


def llama_binary_command(binary, model_path, draft_path, prompt: str, n_predict: int, threads: int, n_max: int,
                         p_min: float, n_ctx: int) -> list[str]:
    """llama-speculative-simple greedy (top-k 1, temperature 0), both models on `threads` threads,
    F16 KV cache and no flash attention as in the llama-cpp-python rows. The prompt goes in with
    -p: -f would drop a final newline, and HumanEval prompts end with one."""
    t = str(threads)
    return [str(binary), "-m", str(model_path), "-md", str(draft_path), "-p", prompt, "-n", str(n_predict),
            "-c", str(n_ctx), "-t", t, "-tb", t, "-td", t, "-tbd", t, "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(n_max),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{p_min:g}", "--top-k", "1", "--temp", "0",
            "-fa", "off", "-ngl", "0", "-ngld", "0", "--seed", "0"]


def parse_llama_binary_run(stdout: bytes, stderr: str, prompt_bytes: bytes) -> dict:
    """Figures and generated text of one llama-speculative-simple run. stdout is two newlines, the
    prompt's pieces, the generated pieces up to (not including) an end-of-generation token, then
    two newlines after the loop and two more at exit; stderr ends with its counters. Every step
    commits its accepted drafts + one target token, so steps = decoded tokens − accepted drafts.
    ValueError when a figure or the prompt echo is missing."""

    found = {}
    for key, pattern in _BINARY_FIGURES.items():
        match = re.search(pattern, stderr)
        if match is None:
            raise ValueError(f"llama-speculative-simple printed no '{key}' figure")
        found[key] = match.groups()
    echo, ending = b"\n\n" + prompt_bytes, b"\n\n\n\n"
    if not stdout.startswith(echo):
        raise ValueError("llama-speculative-simple's echo of the prompt differs from the prompt's text")
    if not stdout.endswith(ending) or len(stdout) < len(echo) + len(ending):
        raise ValueError("llama-speculative-simple's output does not end with its four newlines")
    n_decoded, decode_s = int(found["decoded"][0]), float(found["decoded"][1])
    n_drafted, n_accept = int(found["n_drafted"][0]), int(found["n_accept"][0])
    steps = n_decoded - n_accept
    return {"text": stdout[len(echo):-len(ending)], "n_generated": n_decoded, "n_prompt_tokens_llama": int(found["encoded"][0]),
            "prompt_ms": float(found["encoded"][1]) * 1e3, "decode_s": decode_s,
            "tokens_per_s": n_decoded / decode_s if decode_s > 0 else 0.0, "steps": steps,
            "mean_accepted": n_decoded / steps if steps else None, "drafted_tokens": n_drafted,
            "accepted_drafted_tokens": n_accept, "acceptance_rate": n_accept / n_drafted if n_drafted else None}


def text_agrees(generated: bytes, reference: bytes, reference_hit_eos: bool) -> bool:
    """Whether a run that printed `generated` (stopping at EOS or a little past the token budget)
    produced the reference tokens' text: the same text when the reference ended at EOS, else a text
    that starts with it."""
    return generated == reference if reference_hit_eos else generated.startswith(reference)


def run_llama_binary(command: list[str], prompt_bytes: bytes) -> dict:
    done = subprocess.run(command, capture_output=True, timeout=1800)
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(command[0]).name} exited with {done.returncode}: {tail}")
    return parse_llama_binary_run(done.stdout, stderr, prompt_bytes)


# ---------------------------------------------------------------------------------------------
# the run


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _reference_text(tokenizer, tokens, eos_ids) -> tuple[bytes, bool]:
    """A token list's text as llama.cpp prints it (an ending EOS token not printed) and whether it ended at EOS."""
    hit_eos = bool(tokens) and tokens[-1] in eos_ids
    return tokenizer.decode_bytes(tokens[:-1] if hit_eos else tokens), hit_eos


def bench_llama_binary_prompt(prompt: Prompt, prompt_ids, tokenizer, binary_command, n_max_list, p_min_list,
                              max_tokens: int, eos_ids, py_ar, llama_ar, base: dict, draft_name: str) -> list[dict]:
    """llama-speculative-simple on one prompt (stop at EOS), per draft setting; exactness by text
    against pyspecla's and llama-cpp-python's AR tokens."""
    rows = []
    for n_max in n_max_list:
        for p_min in p_min_list:
            result = run_llama_binary(binary_command(prompt.id, max_tokens, n_max, p_min),
                                      tokenizer.decode_bytes(prompt_ids))
            text = result.pop("text")
            n_prompt_llama = result.pop("n_prompt_tokens_llama")
            row = {**base, "runtime": "llama.cpp", "setting": f"llama-bin-draft:n={n_max},p={p_min:g}",
                   "mode": "llama-spec", "draft": draft_name, "n_max": n_max, "p_min": p_min, "eos": "stop",
                   "prompt": prompt.id, "prompt_kind": prompt.kind, "n_prompt_tokens": len(prompt_ids),
                   "llama_tokens_match": n_prompt_llama == len(prompt_ids), **result,
                   # it stops past --tokens or at EOS, counting whole steps: at most --tokens means EOS;
                   # more leaves it open (EOS may have come in the last step)
                   "hit_eos": True if result["n_generated"] <= max_tokens else None,
                   "exact": None if llama_ar is None else text_agrees(text, *_reference_text(tokenizer, llama_ar, eos_ids)),
                   "exact_vs_pyspecla_ar": text_agrees(text, *_reference_text(tokenizer, py_ar, eos_ids)),
                   "text": text.decode("utf-8", "replace")}
            rows.append(row)
            _log(_describe(row))
    return rows


class LlamaBaseline:
    """The llama.cpp settings (--llama-settings: ar, lookup, draft) on llama-cpp-python's copy of the
    target (and of the draft model for `draft`), per prompt, with the same token ids as pyspecla."""

    def __init__(self, model_path: Path, draft_path: Path, settings, threads: int, max_history: int,
                 n_max_list, p_min_list, lookup_ngram: int, lookup_tokens: int):
        import llama_cpp

        self.settings, self.draft_path = list(settings), draft_path
        self.n_max_list, self.p_min_list = list(n_max_list), list(p_min_list)
        self.lookup_ngram, self.lookup_tokens = lookup_ngram, lookup_tokens
        self.version = llama_cpp.__version__
        longest_draft = max([*self.n_max_list, lookup_tokens])
        n_ctx = max_history + longest_draft + 16
        # the target's verify batch needs every row's logits (logits_all; its prompt passes skip them:
        # eval_prompt); the draft reads only its last row (last_logits), so it computes only that
        kwargs = {"n_ctx": n_ctx, "n_threads": threads, "n_threads_batch": threads, "n_batch": 512,
                  "flash_attn": False, "verbose": False}
        self.llm = llama_cpp.Llama(model_path=str(model_path), logits_all=True, **kwargs)
        self.draft_llm = (llama_cpp.Llama(model_path=str(draft_path), logits_all=False, **kwargs)
                          if "draft" in self.settings else None)
        self.tokens_match: dict[str, bool] = {}

    def check_tokenizer(self, texts: dict[str, str], prompt_ids: dict[str, list[int]]) -> None:
        """Whether llama.cpp's tokenizer gives each prompt pyspecla's ids (recorded per row)."""
        for prompt_id, text in texts.items():
            self.tokens_match[prompt_id] = (
                self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == prompt_ids[prompt_id])

    def warm_up(self, prompt_ids) -> None:
        llama_generate(self.llm, prompt_ids, 4, set())

    def proposers(self):
        """(setting name, proposer or None for plain decoding, extra row fields) per setting."""
        for name in self.settings:
            if name == "ar":
                yield "llama-ar", None, {}
            elif name == "lookup":
                yield "llama-lookup", PromptLookupProposer(self.lookup_ngram, self.lookup_tokens), {
                    "draft": f"prompt lookup n={self.lookup_ngram} max={self.lookup_tokens}"}
            else:
                for n_max in self.n_max_list:
                    for p_min in self.p_min_list:
                        yield (f"llama-draft:n={n_max},p={p_min:g}", DraftModelProposer(self.draft_llm, n_max, p_min),
                               {"draft": self.draft_path.name, "n_max": n_max, "p_min": p_min})

    def bench_prompt(self, prompt: Prompt, ids, max_tokens: int, eos: str, eos_ids, py_ar, base: dict, record):
        """Every llama.cpp setting on one prompt, each row handed to record([row]) as it is made;
        returns the llama.cpp AR tokens (None when `ar` is not among the settings)."""
        llama_ar = None
        for name, proposer, extra in self.proposers():
            result = llama_generate(self.llm, ids, max_tokens, eos_ids, proposer)
            tokens = result.pop("tokens")
            if name == "llama-ar":
                llama_ar = tokens
            row = {**base, "runtime": "llama.cpp", "setting": name, "mode": "llama-ar" if proposer is None else
                   "llama-spec", "draft": None, **extra, "eos": eos, "prompt": prompt.id, "prompt_kind": prompt.kind,
                   "n_prompt_tokens": len(ids), "llama_tokens_match": self.tokens_match[prompt.id], **result,
                   "n_generated": len(tokens), "hit_eos": bool(tokens) and tokens[-1] in eos_ids,
                   "exact": None if llama_ar is None else tokens == llama_ar,
                   "first_diff": None if llama_ar is None else first_difference(tokens, llama_ar),
                   "exact_vs_pyspecla_ar": tokens == py_ar,
                   "first_diff_vs_pyspecla_ar": first_difference(tokens, py_ar), "tokens": tokens}
            record([row])
            _log(_describe(row))
        return llama_ar

    def close(self) -> None:
        self.llm.close()
        if self.draft_llm is not None:
            self.draft_llm.close()
