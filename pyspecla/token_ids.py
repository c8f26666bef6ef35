"""Token id lists from the user, checked before they reach the native library."""

from __future__ import annotations

import numpy as np

from .errors import UsageError


def token_id_array(token_ids, what: str = "token ids") -> np.ndarray:
    """token_ids as int32, refusing what would be silently wrong in the conversion: floats (1.9
    would become 1), ids beyond int32 (2**40 would wrap), anything not a 1-D sequence. The native
    forward checks the range against the vocabulary."""
    try:
        values = np.asarray(token_ids)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} must be a 1-D list of integers ({exc})") from None
    if values.ndim != 1 or len(values) == 0:
        raise UsageError(f"{what} must be a non-empty 1-D list of integers, got {token_ids!r:.60}")
    if values.dtype.kind not in "iu":
        raise UsageError(f"{what} must be integers, got {values.dtype} values such as {values[0]!r}")
    low, high = values.min(), values.max()
    if low < 0 or high > np.iinfo(np.int32).max:
        raise UsageError(f"{what}: id {int(low if low < 0 else high)} is outside the vocabulary")
    return np.ascontiguousarray(values, dtype=np.int32)
