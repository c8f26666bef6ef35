"""The one ranking rule the Python side uses: the k largest entries of a score vector, largest first,
ties to the lowest id — the native argmax's rule, so rank 0 is the token a greedy step picks."""

from __future__ import annotations

import numpy as np


def largest_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries of x, largest first, ties to the lowest id."""
    V = len(x)
    if k >= V:
        candidates = np.arange(V)
    else:
        kth = x[np.argpartition(x, V - k)[V - k:]].min()
        above = np.flatnonzero(x > kth)
        # argpartition picks among equal values arbitrarily: take the lowest ids at the boundary
        candidates = np.concatenate([above, np.flatnonzero(x == kth)[:k - len(above)]])
    return candidates[np.lexsort((candidates, -x[candidates]))]
