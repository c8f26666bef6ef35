"""Verify/accept over a draft tree: greedy (docs/ddtree-dflash.md §3) and sample-and-match
(docs/sampling.md).

The target runs once over [root, node 1..n]; `posterior[i]` is its argmax token after node i (the
token the target itself would emit next if node i's path were committed). Starting at the root,
the walk moves to the child whose token equals the current node's posterior, while one exists.
Everything on that path is what plain greedy decoding would have produced, so speculative greedy
output equals autoregressive greedy output; the last accepted node's posterior is the bonus token,
which the target produced for free and which becomes the next step's root.

Sampling walks the same way with a chosen token in place of the argmax: at each node the target's
token is drawn from that node's own processed distribution (sampled_accept's `choose`), and the
walk moves to the child carrying it, else stops with it as the bonus token.

The step emits tokens[path[1:]] + [bonus]: len(path) tokens, at least 1."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import UsageError
from .tree import DraftTree

__all__ = ["emitted_tokens", "greedy_accept", "sampled_accept"]


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

    after = posterior.tolist()
    return _walk(tree, lambda node: after[node])


def sampled_accept(tree: DraftTree, choose: Callable[[int], int]) -> tuple[list[int], int]:
    """(accepted node path starting with 0, bonus token), choosing the target's token at each node
    the walk reaches with choose(node) (called once per node, root first, in path order) and
    moving to the child that carries it (the lowest index among duplicates), else stopping: the
    token chosen there is the bonus. Each accepted node's token is the token chosen at its parent."""
    if not isinstance(tree, DraftTree):
        raise UsageError(f"sampled_accept: tree must be a DraftTree, got {type(tree).__name__}")
    return _walk(tree, lambda node: int(choose(node)))


def _walk(tree: DraftTree, token_after: Callable[[int], int]) -> tuple[list[int], int]:
    """(path, bonus) of both accepts: from the root, move to the child that carries token_after(the
    current node), asked once per node reached in path order, while one exists. One pass in node
    order: a node's children all come after it (topological order), so the first later node that
    hangs off the current one and carries its token is the lowest-index match, and the next match
    can only come after it. (The loop runs this every step while the GPU waits; a dict of every
    node's children cost several times as much.)"""
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    path = [0]
    current, wanted = 0, token_after(0)
    for node in range(1, len(parents)):
        if parents[node] == current and tokens[node] == wanted:
            path.append(node)
            current, wanted = node, token_after(node)
    return path, int(wanted)


def emitted_tokens(tree: DraftTree, path: list[int], bonus: int) -> list[int]:
    """The tokens one step commits: the accepted nodes after the root, then the bonus token."""
    return [int(tree.tokens[i]) for i in path[1:]] + [int(bonus)]
