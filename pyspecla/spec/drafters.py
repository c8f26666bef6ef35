"""Drafters: what proposes candidate tokens for a speculative step. Each returns, for depths
1..n_depths after the root, the top_k candidate tokens and their log-probabilities, best first:
arrays [n_depths][top_k]. The DDTree builder turns them into a tree; the target decides.

- DFlashDrafter: the DFlash block-diffusion draft model (pyspecla.draft), reading the target
  context's captured feature rows.
- OracleDrafter: a BENCHMARK TOOL, not a model. It knows the target's own greedy continuation
  (from a prior autoregressive pass) and corrupts each proposed token with probability 1 − p, so
  speed can be measured at a chosen acceptance rate on synthetic weights.
- NgramDrafter: prompt lookup over the token history (no model); may return zero depths (a miss),
  which the loop verifies as the root alone.
- ModelDrafter: an ordinary small language model (qwen2, or qwen35 with its recurrent layers) with
  the target's vocabulary, decoding greedily ahead of the target in its own context, rolled back
  exactly (KV truncation, or a saved recurrent state) to what the target committed before each
  proposal."""

from __future__ import annotations

import math
import re

import numpy as np

from ..errors import UsageError
from .draft_vocab import check_draft_vocab, reduced_vocabulary


class OracleDrafter:
    """Proposes continuation[g + d − 1] at depth d, where g tokens were generated so far; each
    proposal is replaced by a different random token with probability 1 − p, independently per
    depth and step. Ranks ≥ 1 are random tokens that are never the true continuation, so the
    expected tokens committed per step with a chain of depth D is 1 + Σ_{i=1..D} p^i."""

    capture_layers: list[int] = []

    def __init__(self, p: float, continuation: list[int], n_vocab: int, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"oracle drafter: p must be in [0, 1], got {p}")
        self.p = p
        self.continuation = list(continuation)
        self.n_vocab = n_vocab
        self.rng = np.random.default_rng(seed)
        self.generated = 0  # set by the loop before each proposal

    @staticmethod
    def parse(spec: str) -> float:
        """'oracle:p=0.8' -> 0.8 (a clear error for anything else)."""
        m = re.fullmatch(r"oracle:p=([0-9]*\.?[0-9]+)", spec)
        if not m:
            raise UsageError(f"--draft {spec!r}: the oracle drafter is written oracle:p=P with P in [0, 1]")
        p = float(m.group(1))
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"--draft {spec!r}: p must be in [0, 1]")
        return p

    def _other_token(self, avoid: set[int]) -> int:
        while True:
            t = int(self.rng.integers(0, self.n_vocab))
            if t not in avoid:
                return t

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        tokens = np.empty((n_depths, top_k), dtype=np.int32)
        # log-probs: the proposal is confident, the alternatives fall off by rank
        logprobs = np.tile(-np.arange(top_k, dtype=np.float32) * 2.0 - 0.05, (n_depths, 1))
        for d in range(1, n_depths + 1):
            index = self.generated + d - 1
            true = self.continuation[index] if index < len(self.continuation) else -1
            avoid = {true}
            first = true if (true >= 0 and self.rng.random() < self.p) else self._other_token(avoid)
            avoid.add(first)
            tokens[d - 1, 0] = first
            for r in range(1, top_k):
                tokens[d - 1, r] = self._other_token(avoid)
                avoid.add(int(tokens[d - 1, r]))
        return tokens, logprobs

    def expected_tokens_per_step(self, depth: int) -> float:
        return 1.0 + sum(self.p ** i for i in range(1, depth + 1))


class DFlashDrafter:
    """The DFlash block-diffusion draft: one native call per step proposes top_k tokens for each
    of the block's depths. The target context must capture the draft's target layers.

    Reduced vocabulary (vocab = n, `--draft-vocab`): the block is scored over the target head's
    first n ids, control tokens and the generation's own tokens only (draft_vocab.py; the loop
    keeps `history`); log-probs are then over that set. None or 0: the whole head."""

    def __init__(self, draft, n_ctx: int = 4096, vocab: int | None = None):
        check_draft_vocab(vocab)
        self.draft = draft
        self.capture_layers = list(draft.target_layer_ids)
        self.max_depth = int(draft.hparams.block_size) - 1
        self.context = draft.new_context(n_ctx=n_ctx)
        self.vocabulary = reduced_vocabulary(draft.target_model, self.context, vocab)
        if self.vocabulary is not None:
            self.history: list[int] = []  # set by the loop: prompt + emitted tokens

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        if self.vocabulary is not None:
            self.vocabulary.follow(self.history)
            top_k = min(top_k, len(self.vocabulary))
        return self.context.propose(target_ctx, root_token, min(n_depths, self.max_depth), top_k)


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the history's
    longest suffix n-gram (n = max_n, backing off to 1). No model, no target features: the
    proposal is a few dict look-ups, so it is free to compute, and a miss (no earlier occurrence
    of even the root token) returns zero depths — arrays of shape (0, top_k) — which the loop
    verifies as the root alone, a 1-node tree: exactly a plain decode step, nothing more.

    History. The loop sets `self.history` (a list: the prompt, then every emitted token, so its
    last entry is the step's root) and appends to that same list as it emits; propose() indexes
    only the entries added since its last call: an index per n = 1..max_n from n-gram to the end
    positions (exclusive) of its occurrences, in increasing order. Each emitted token costs max_n
    dict appends; a proposal never rescans the history. A new list object (a new generation)
    resets the index.

    Proposal at depths 1..min(n_depths, max_tokens): the tokens after the most recent earlier
    occurrence (end position e < len(history)) of the longest matching suffix n-gram. Where that
    continuation runs into the end of the history it continues periodically with period
    len(history) − e (the copy keeps copying), so a match always yields the full depth.
    Alternatives (ranks 1..): distinct tokens at the same offset after the other occurrences of
    the matched n-gram (the most recent OCCURRENCE_CAP) whose continuations agree with the
    proposal up to that depth (the DDTree convention: every depth conditioned on the top-1 spine),
    by count; then, to fill up to top_k, tokens that followed the previous spine token (the root
    at depth 1) anywhere in the history (a bigram back-off), by count. Log-probs, from counts: at
    a depth with N agreeing occurrences, token counts c, the spine token's count raised by
    b = max(0, best other count − its own) (recency wins ties with frequency) and D = N + b + 1,
    a matched token gets log(c / D); the back-off shares the reserved 1 / D in proportion to its
    counts. The width is the longest row (≤ top_k): one column, a plain chain, where no depth has
    an alternative. Shorter rows are padded with unrelated tokens at the row's lowest log-prob − 30
    (a tau window drops them; without one a DDTree fills its budget with them as with any draft).
    Everything is finite, ≤ 0 and descending, and deterministic."""

    capture_layers: tuple[int, ...] = ()  # no target features
    guarded = True  # guesses cost verifies: the loop's LossGuard sizes (or skips) each proposal
    OCCURRENCE_CAP = 32  # occurrences (most recent first) looked at for alternatives and back-off
    PAD_LOGPROB = -30.0  # padding: this far below the row's lowest real candidate

    def __init__(self, max_n: int = 3, max_tokens: int = 10):
        for name, value, top in (("n", max_n, 64), ("max", max_tokens, 1024)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise UsageError(f"n-gram drafter: {name} must be an integer in [1, {top}], got {value!r}")
        self.max_n = max_n
        self.max_depth = max_tokens  # the loop's SpecConfig.max_depth (cli.spec_config_from_args)
        self.history: list[int] = []  # set by the loop; see the class docstring
        self._indexed: list[int] | None = None
        self._n_indexed = 0
        self._index: list[dict[tuple[int, ...], list[int]]] = []

    USAGE = ("the n-gram drafter is written ngram or ngram:n=N,max=M (N in [1, 64]: the longest n-gram "
             "matched, default 3; M in [1, 1024]: the most tokens proposed, default 10)")

    @staticmethod
    def parse(spec: str) -> tuple[int, int]:
        """'ngram' -> (3, 10); 'ngram:n=4,max=8' (either key, any order) -> (4, 8); a clear error
        naming --draft for anything else."""
        values = {"n": 3, "max": 10}
        if spec == "ngram":
            return values["n"], values["max"]
        if not spec.startswith("ngram:"):
            raise UsageError(f"--draft {spec!r}: {NgramDrafter.USAGE}")
        seen = set()
        for item in spec[len("ngram:"):].split(","):
            m = re.fullmatch(r"(n|max)=([0-9]+)", item)
            if not m:
                raise UsageError(f"--draft {spec!r}: bad item {item!r}; {NgramDrafter.USAGE}")
            key, value = m.group(1), int(m.group(2))
            if key in seen:
                raise UsageError(f"--draft {spec!r}: {key} is given twice; {NgramDrafter.USAGE}")
            seen.add(key)
            if not 1 <= value <= (64 if key == "n" else 1024):
                raise UsageError(f"--draft {spec!r}: {key}={value} is out of range; {NgramDrafter.USAGE}")
            values[key] = value
        return values["n"], values["max"]

    def _catch_up(self) -> list[int]:
        """Index the history entries added since the last call (all of them for a new list)."""
        h = self.history
        if h is not self._indexed or len(h) < self._n_indexed:
            self._indexed, self._n_indexed = h, 0
            self._index = [{} for _ in range(self.max_n)]
        for i in range(self._n_indexed, len(h)):
            end = i + 1
            for m in range(1, min(self.max_n, end) + 1):
                self._index[m - 1].setdefault(tuple(h[end - m:end]), []).append(end)
        self._n_indexed = len(h)
        return h

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        h = self._catch_up()
        L = len(h)
        if L == 0 or h[-1] != root_token:
            raise UsageError("n-gram drafter: the history must end with the root token (the speculative loop "
                             "keeps drafter.history)")
        n_depths = min(n_depths, self.max_depth)
        empty = np.empty((0, top_k), np.int32), np.empty((0, top_k), np.float32)
        if n_depths <= 0 or top_k < 1:
            return empty
        ends = None
        for m in range(min(self.max_n, L), 0, -1):
            ends = self._index[m - 1].get(tuple(h[L - m:]))
            if ends is not None and len(ends) >= 2:  # ends[-1] == L: the suffix itself
                break
        else:
            return empty  # no earlier occurrence: verify the root alone
        cap = self.OCCURRENCE_CAP
        occurrences = ends[-2:-2 - cap:-1]  # earlier occurrences, most recent first
        e0 = occurrences[0]
        spine: list[int] = []
        for j in range(n_depths):
            i = e0 + j
            spine.append(h[i] if i < L else spine[i - L])

        rows: list[tuple[list[int], list[float]]] = []
        alive = occurrences
        for j in range(n_depths):
            s = spine[j]
            counts: dict[int, int] = {}
            agreeing = []
            for e in alive:  # most recent first, so dict order breaks count ties by recency
                if e == e0:
                    t = s
                elif e + j < L:
                    t = h[e + j]
                else:
                    continue  # its continuation is not in the history yet: no evidence
                counts[t] = counts.get(t, 0) + 1
                if t == s:
                    agreeing.append(e)
            others = sorted((t for t in counts if t != s), key=lambda t: -counts[t])[:top_k - 1]
            best_other = counts[others[0]] if others else 0
            boost = max(0, best_other - counts[s])
            denom = sum(counts.values()) + boost + 1
            tokens = [s] + others
            logprobs = [math.log((counts[s] + boost) / denom)] + [math.log(counts[t] / denom) for t in others]
            if len(tokens) < top_k:  # bigram back-off after the previous spine token
                prev = root_token if j == 0 else spine[j - 1]
                follows = self._index[0].get((prev,), [])
                backoff: dict[int, int] = {}
                considered = 0
                for e in reversed(follows):  # stops after `cap`: never a scan of the whole list
                    if e >= L:
                        continue  # the root's own entry: nothing follows it yet
                    considered += 1
                    backoff[h[e]] = backoff.get(h[e], 0) + 1
                    if considered >= cap:
                        break
                extra = sorted((t for t in backoff if t not in counts), key=lambda t: -backoff[t])
                for t in extra[:top_k - len(tokens)]:
                    tokens.append(t)
                    logprobs.append(math.log(backoff[t] / (considered * denom)))
            rows.append((tokens, logprobs))
            alive = agreeing

        width = max(len(tokens) for tokens, _ in rows)
        out_tokens = np.empty((n_depths, width), np.int32)
        out_logprobs = np.empty((n_depths, width), np.float32)
        for j, (tokens, logprobs) in enumerate(rows):
            pad_lp = logprobs[-1] + self.PAD_LOGPROB
            pad_token = 0
            while len(tokens) < width:
                while pad_token in tokens:
                    pad_token += 1
                tokens.append(pad_token)
                logprobs.append(pad_lp)
            out_tokens[j] = tokens
            out_logprobs[j] = logprobs
        return out_tokens, out_logprobs


def check_same_vocabulary(target_file, draft_file) -> None:
    """UsageError naming both files unless the draft's token ids mean what the target's do: the
    same vocabulary size, the same token strings id for id, the same EOS and BOS ids. (Merges only
    matter for tokenizing text, which the draft never does: it reads the target's ids.)"""
    target, draft = target_file.path, draft_file.path
    prefix = f"--draft {draft}: an autoregressive draft needs the vocabulary of the target {target}"
    tv, dv = target_file.hparams.n_vocab, draft_file.hparams.n_vocab
    if tv != dv:
        raise UsageError(f"{prefix}, but the draft has {dv} tokens and the target {tv}")
    t_tokens = target_file.metadata.get("tokenizer.ggml.tokens")
    d_tokens = draft_file.metadata.get("tokenizer.ggml.tokens")
    if (t_tokens is None) != (d_tokens is None):
        which = "the target has no token list" if t_tokens is None else "the draft has no token list"
        raise UsageError(f"{prefix}, but {which} to compare")
    if t_tokens != d_tokens:
        i = next(i for i, (a, b) in enumerate(zip(t_tokens, d_tokens)) if a != b)
        raise UsageError(f"{prefix}, but token {i} is {d_tokens[i]!r} in the draft and {t_tokens[i]!r} in the target")
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"):
        if target_file.metadata.get(key) != draft_file.metadata.get(key):
            raise UsageError(f"{prefix}, but {key} is {draft_file.metadata.get(key)!r} in the draft and "
                             f"{target_file.metadata.get(key)!r} in the target")


def _top_k(logprobs: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries, largest first, ties to the lowest id (the native argmax's rule,
    so rank 0 is the token the target's greedy choice would be under the same logits)."""
    V = len(logprobs)
    if k >= V:
        candidates = np.arange(V)
    else:
        kth = logprobs[np.argpartition(logprobs, V - k)[V - k:]].min()
        above = np.flatnonzero(logprobs > kth)
        # argpartition picks among equal values arbitrarily: take the lowest ids at the boundary
        candidates = np.concatenate([above, np.flatnonzero(logprobs == kth)[:k - len(above)]])
    return candidates[np.lexsort((candidates, -logprobs[candidates]))]


class ModelDrafter:
    """An autoregressive draft model: a small ordinary language model with the target's vocabulary
    proposes its own greedy continuation, depth by depth, each depth's top_k by log-softmax.

    Sync. The draft context must hold exactly history[:-1] before the root is fed: since the last
    proposal the target accepted a prefix of the drafted tokens plus a bonus token, so the draft
    context is right up to the longest common prefix of what it evaluated and the history, and
    wrong after it. Truncating there (exact: dropping KV rows) and evaluating the rest of the
    history in one batch gives depth 1's distribution. The history is append-only within a
    generation (loop.py), so the prefix compare resumes where the last sync ended; a new history
    list (a new generation) compares from the start and keeps any shared prompt prefix.
    A draft with recurrent layers (qwen35) has no rows to drop: its context saves its state after
    each sync (specla_context_save_state) and goes back to that point instead, re-evaluating the
    accepted tokens with the bonus in one batch; a new generation that leaves the saved point
    starts from an empty context.

    Proposal: depth d's row is the top_k of the distribution after the root and the top-1 tokens of
    depths 1..d-1 (the DDTree convention: every depth conditioned on the top-1 spine). Drafting
    stops before a depth whose top-1 probability is below p_min (not worth verifying; may leave
    zero depths, verified as the root alone), after max_depth depths, or where the draft context
    has no room. The last depth's token is not evaluated: nothing uses the distribution after it.

    Reduced vocabulary (vocab = n, `--draft-vocab`): the draft scores only the first n ids, the
    control tokens and the generation's own tokens (draft_vocab.py); ranks, log-probs and p_min
    are then over that subset. Proposals get cheaper; the output cannot change (the target verifies)."""

    capture_layers: tuple[int, ...] = ()  # no target features
    prefers_chain = True  # the CLI speculates its top-1 chain unless a DDTree budget is given

    def __init__(self, draft, target=None, n_ctx: int = 4096, max_depth: int = 8, p_min: float = 0.5,
                 vocab: int | None = None):
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= 1024:
            raise UsageError(f"--draft-max must be an integer in [1, 1024], got {max_depth!r}")
        if not 0.0 <= p_min <= 1.0:
            raise UsageError(f"--draft-p-min must be in [0, 1], got {p_min!r}")
        check_draft_vocab(vocab)
        if target is not None:
            check_same_vocabulary(target.file, draft.file)
        self.draft = draft
        self.max_depth = max_depth  # the loop's SpecConfig.max_depth (cli.spec_config_from_args)
        self.p_min = p_min
        self.context = draft.new_context(n_ctx=n_ctx)
        # vocab: score only that many frequent ids + control tokens + the generation's own tokens
        # (draft_vocab.py); None, 0 or the whole vocabulary: the whole LM head
        self.vocabulary = reduced_vocabulary(draft, self.context, vocab)
        self.history: list[int] = []  # set by the loop: prompt + emitted tokens, the root last
        self._evaluated: list[int] = []  # tokens in the draft context, position by position
        self._synced: list[int] | None = None  # the history list of the last sync
        self._n_synced = 0  # its entries known to equal _evaluated (append-only: they stay equal)
        self._recurrent = any(draft.hparams.layer_is_recurrent)  # rolled back to a saved state
        self._saved = -1  # recurrent: the position of the context's saved state

    @classmethod
    def load(cls, path, target, n_ctx: int = 4096, max_depth: int = 8, p_min: float = 0.5,
             vocab: int | None = None) -> "ModelDrafter":
        """Open an ordinary GGUF language model as the draft of `target` (a pyspecla.Model), on
        the target's threads and kernels."""
        from ..model import Model

        draft = Model.load(path, n_threads=target.n_threads, cpu_kernels=target.cpu_kernels)
        return cls(draft, target, n_ctx=n_ctx, max_depth=max_depth, p_min=p_min, vocab=vocab)

    def _sync(self, history: list[int]) -> np.ndarray:
        """Bring the draft context to history (all of it) and return the last row's logits."""
        start = self._n_synced if history is self._synced and len(history) >= self._n_synced else 0
        evaluated = self._evaluated
        n = min(len(evaluated), len(history) - 1)  # the root is always fed: its logits are depth 1
        keep = min(start, n)
        while keep < n and evaluated[keep] == history[keep]:
            keep += 1
        if keep < len(evaluated):
            if self._recurrent:  # no rows to drop: back to the saved state, or start over
                keep = self._saved if 0 <= self._saved <= keep else 0
                if keep:
                    self.context.truncate(keep)
                else:
                    self.context.reset()
            else:
                self.context.truncate(keep)
            del evaluated[keep:]
        logits = self.context.eval(history[keep:])
        evaluated.extend(history[keep:])
        if self._recurrent:
            self.context.save_state()
            self._saved = len(evaluated)
        self._synced, self._n_synced = history, len(history)
        return logits

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        h = self.history
        if not h or h[-1] != root_token:
            raise UsageError("draft model: the history must end with the root token (the speculative loop keeps "
                             "drafter.history)")
        if self.vocabulary is not None:
            self.vocabulary.follow(h)
        width = min(top_k, self.context.n_logits)
        # the context holds the history plus every drafted token but the last
        n_depths = min(n_depths, self.max_depth, self.context.n_ctx - len(h) + 1)
        tokens = np.empty((max(n_depths, 0), max(width, 0)), np.int32)
        logprobs = np.empty(tokens.shape, np.float32)
        if n_depths <= 0 or width < 1:
            return tokens, logprobs
        logits = self._sync(h)
        d = 0
        while True:
            if not np.isfinite(logits).all():
                break  # a broken draft row: propose what came before it (the target decides anyway)
            # log-softmax, but only where it is read: the normaliser (float64) once over the
            # vocabulary, the ranking on the raw logits (the same order and ties), the subtraction
            # for the top_k alone
            m = np.float64(logits.max())
            log_norm = m + np.log(np.exp(logits.astype(np.float64) - m).sum())
            best = _top_k(logits, width)
            row = logits[best].astype(np.float64) - log_norm
            if math.exp(row[0]) < self.p_min:
                break
            if self.context.logit_tokens is not None:
                best = self.context.logit_tokens[best]  # head rows -> token ids
            tokens[d], logprobs[d] = best, row
            d += 1
            if d == n_depths:
                break
            token = int(best[0])
            logits = self.context.eval([token])
            self._evaluated.append(token)
        return tokens[:d], logprobs[:d]
