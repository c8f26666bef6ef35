"""Naming the LM head rows a context scores (a draft's reduced vocabulary) through the native
set_logit_rows calls of a target context or a DFlash draft context."""

from __future__ import annotations

import numpy as np

from . import _native
from .errors import UsageError


def apply_logit_rows(native_set_rows, handle, n_vocab: int, token_ids) -> np.ndarray | None:
    """Make a context score only the LM head rows of token_ids (a draft's reduced vocabulary) through
    its native set_logit_rows call (`native_set_rows`: specla_context_set_logit_rows or
    specla_draft_context_set_logit_rows; the rows are named by id and gathered where the context's
    backend keeps the head, so nothing is re-uploaded as the set grows). Returns the ids as int32
    (the token id of each logit entry), or None for token_ids = None: the whole head again."""
    if token_ids is None:
        _native.check(native_set_rows(handle, None, 0))
        return None
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise UsageError("set_logit_rows: token ids must be a non-empty 1-D list of integers")
    if ids.min() < 0 or ids.max() >= n_vocab:
        raise UsageError(f"set_logit_rows: token ids must be in [0, {n_vocab})")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    _native.check(native_set_rows(handle, _native.int32_ptr(ids), len(ids)))
    return ids
