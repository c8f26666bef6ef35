"""Greedy verify/accept over a draft tree (docs/ddtree-dflash.md §3).

The target runs once over [root, node 1..n]; `posterior[i]` is its argmax token after node i (the
token the target itself would emit next if node i's path were committed). Starting at the root,
the walk moves to the child whose token equals the current node's posterior, while one exists.
Everything on that path is what plain greedy decoding would have produced, so speculative greedy
output equals autoregressive greedy output; the last accepted node's posterior is the bonus token,
which the target produced for free and which becomes the next step's root.

The step emits tokens[path[1:]] + [bonus]: len(path) tokens, at least 1."""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .tree import DraftTree

__all__ = ["emitted_tokens", "greedy_accept"]


def greedy_accept(tree: DraftTree, posterior: np.ndarray) -> tuple[list[int], int]:
    """(accepted node path starting with 0, bonus token = posterior[last accepted node]).

    posterior: integer [n_nodes], the target's argmax token at every node. If several children of
    a node carry the matching token (only possible with duplicate tokens among siblings), the one
    with the lowest index is taken."""
    if not isinstance(tree, DraftTree):
        raise UsageError(f"greedy_accept: tree must be a DraftTree, got {type(tree).__name__}")
    posterior = np.asarray(posterior)
    if posterior.shape != (tree.n_nodes,):
        raise UsageError(f"greedy_accept: posterior must have shape ({tree.n_nodes},) (one token per "
                         f"tree node), got {posterior.shape}")
    if not np.issubdtype(posterior.dtype, np.integer):
        raise UsageError(f"greedy_accept: posterior must hold integer token ids, got dtype {posterior.dtype}")

    # First child (lowest index) per (parent, token): later duplicates never win.
    child_by_token: dict[tuple[int, int], int] = {}
    for i in range(1, tree.n_nodes):
        child_by_token.setdefault((int(tree.parents[i]), int(tree.tokens[i])), i)

    path = [0]
    current = 0
    while True:
        child = child_by_token.get((current, int(posterior[current])))
        if child is None:
            break
        path.append(child)
        current = child
    return path, int(posterior[current])


def emitted_tokens(tree: DraftTree, path: list[int], bonus: int) -> list[int]:
    """The tokens one step commits: the accepted nodes after the root, then the bonus token."""
    return [int(tree.tokens[i]) for i in path[1:]] + [int(bonus)]
