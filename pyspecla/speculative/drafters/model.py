"""ModelDrafter: an ordinary small language model with the target's vocabulary, decoding greedily
ahead of the target and rolled back exactly to what the target committed."""

from __future__ import annotations

import math

import numpy as np

from ...errors import UsageError
from ...ranking import largest_ids
from .vocabulary import check_draft_vocab, reduced_vocabulary


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
        self.max_depth = max_depth  # the loop's SpecConfig.max_depth (factory.spec_config_from_args)
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
        from ...model import Model

        draft = Model.load(path, n_threads=target.n_threads, cpu_kernels=target.cpu_kernels,
                           device=getattr(target, "device", "auto"))
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
            best = largest_ids(logits, width)
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
