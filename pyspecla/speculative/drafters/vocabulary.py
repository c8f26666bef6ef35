"""A draft model's reduced vocabulary: the draft scores only the tokens it is likely to need.

Why: a small draft's LM head is a large share of what a drafted token costs (Qwen2.5-Coder-0.5B:
the Q8_0 head is 145 MB of the 397 MB read per token), yet a draft only has to guess the target's
next token, and the target verifies every guess: a token the draft cannot propose costs a shorter
accepted run, never a wrong output. So the draft's context scores a subset of the head's rows
(specla_context_set_logit_rows; a DFlash draft context, which scores the target's head,
specla_draft_context_set_logit_rows), named by token id:
- the first `n_frequent` ids: Qwen-family vocabularies are in BPE merge order, which roughly
  follows how often a token occurs (FR-Spec, Zhao et al. 2025, restricts the draft head to
  frequent tokens in the same way);
- every control and user-defined token (end of turn, end of text, the chat markers);
- every token of the current generation's prompt and output, added as they appear: identifiers a
  prompt introduces are rare in general and frequent right here.
The ids only grow within a generation, so the native side gathers only the rows added since the
last call; a new generation (a new history list, see loop.py) starts again from the fixed part."""

from __future__ import annotations

import numpy as np

from ...errors import UsageError
from ...tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED

_KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"


class DraftVocabulary:
    """The reduced head of one draft context. `follow(history)` before each proposal; then the
    context's logits are over `context.logit_tokens` (token ids, in head order)."""

    def __init__(self, model, context, n_frequent: int, spare_rows: int = 1024):
        V = model.hparams.n_vocab
        if isinstance(n_frequent, bool) or not isinstance(n_frequent, int) or n_frequent < 1:
            raise UsageError(f"--draft-vocab must be a positive integer, got {n_frequent!r}")
        self.model, self.context = model, context
        self.n_frequent = min(n_frequent, V)
        self._member = np.zeros(V, dtype=bool)
        self._member[: self.n_frequent] = True
        types = model.file.metadata.get(_KEY_TOKEN_TYPE)
        if types is not None:
            types = np.asarray(types)
            if len(types) == V:
                self._member |= (types == TOKEN_TYPE_CONTROL) | (types == TOKEN_TYPE_USER_DEFINED)
        self._n_fixed = n = int(self._member.sum())
        # ids [0, n) are the fixed part, in id order; the generation's own tokens follow
        self._ids = np.empty(n + spare_rows, dtype=np.int32)
        self._ids[:n] = np.flatnonzero(self._member)
        self._n = n
        self._history: list[int] | None = None
        self._n_followed = 0
        self._publish()

    def __len__(self) -> int:
        return self._n

    def _restart(self) -> None:
        """Back to the fixed part (a new generation)."""
        self._member[self._ids[self._n_fixed : self._n]] = False
        self._n = self._n_fixed
        self._publish()

    def _publish(self) -> None:
        self.context.set_logit_rows(self._ids[: self._n])

    def follow(self, history: list[int]) -> None:
        """Make sure every token of history is scored (history: prompt + emitted tokens, append-only
        within a generation; a different list object is a new generation)."""
        if history is not self._history or len(history) < self._n_followed:
            if self._n > self._n_fixed:
                self._restart()
            self._history, self._n_followed = history, 0
        fresh = np.asarray(history[self._n_followed :], dtype=np.int64)
        self._n_followed = len(history)
        if fresh.size == 0:
            return
        fresh = np.unique(fresh[~self._member[fresh]])  # (order within one call does not matter)
        if fresh.size == 0:
            return
        need = self._n + fresh.size
        if need > self._ids.shape[0]:
            ids = np.empty(max(need, 2 * self._ids.shape[0]), dtype=np.int32)
            ids[: self._n] = self._ids[: self._n]
            self._ids = ids
        self._ids[self._n : need] = fresh
        self._member[fresh] = True
        self._n = need
        self._publish()


def check_draft_vocab(vocab) -> None:
    """--draft-vocab: None or 0 (the whole head), or how many frequent ids to score."""
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 0):
        raise UsageError(f"--draft-vocab must be an integer >= 0, got {vocab!r}")


def reduced_vocabulary(model, context, vocab) -> DraftVocabulary | None:
    """The DraftVocabulary that makes `context` score `vocab` frequent ids of model's head (+ control
    and the generation's tokens), or None where it keeps the whole head (vocab None, 0, or not
    below the vocabulary size)."""
    check_draft_vocab(vocab)
    if not vocab or vocab >= model.hparams.n_vocab:
        return None
    return DraftVocabulary(model, context, vocab)
