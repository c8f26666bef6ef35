"""The DDTree builder in Python: the oracle of the library's specla_ddtree_build (native/src/ddtree.c),
which pyspecla.speculative.tree.build_ddtree calls. The same enumeration with Python's heapq and
tuple keys; tests/test_ddtree.py compares the two node for node, and both with an exhaustive
enumeration of docs/ddtree-dflash.md §2's definitions.

Why the enumeration is exact: pyspecla/speculative/tree.py's module docstring."""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import UsageError
from ..speculative.tree import DraftTree, _count, _tau_floor, _top_tables, _tree

__all__ = ["build_ddtree"]


def build_ddtree(root_token: int, top_tokens: np.ndarray, top_logprobs: np.ndarray, budget: int,
                 tau: float | None = None, chain_seed: bool = True) -> DraftTree:
    """pyspecla.speculative.tree.build_ddtree's tree, built in Python (the same arguments, checks
    and messages)."""
    root_token, tokens, logprobs = _top_tables(root_token, top_tokens, top_logprobs, "build_ddtree")
    budget = _count(budget, "budget", "build_ddtree")
    if not isinstance(chain_seed, (bool, np.bool_)):
        raise UsageError(f"build_ddtree: chain_seed must be a bool, got {chain_seed!r}")
    n_depths, k = tokens.shape
    floor = _tau_floor(tau, float(logprobs[0, 0]))

    node_tokens, parents, depths, scores, ranks = [root_token], [-1], [0], [0.0], [-1]
    paths: list[tuple[int, ...]] = [()]
    inserted: set[tuple[int, ...]] = {()}

    def insert(path: tuple[int, ...], parent: int, score: float) -> int:
        if path in inserted:  # the enumeration pushes every node once; this would be a bug
            raise AssertionError(f"build_ddtree: node {path} inserted twice")
        inserted.add(path)
        depth, rank = len(path), path[-1]
        node_tokens.append(int(tokens[depth - 1, rank]))
        parents.append(parent)
        depths.append(depth)
        scores.append(score)
        ranks.append(rank)
        paths.append(path)
        return len(paths) - 1

    # Heap entries: (-score, depth, rank path, parent node index, parent score). The tuple order is
    # the tie rule; rank paths are distinct, so the comparison never reaches the trailing ints.
    heap: list[tuple[float, int, tuple[int, ...], int, float]] = []

    def push(path: tuple[int, ...], parent: int, parent_score: float) -> None:
        depth, rank = len(path), path[-1]
        if depth > n_depths or rank >= k:
            return
        score = parent_score + float(logprobs[depth - 1, rank])
        heapq.heappush(heap, (-score, depth, path, parent, parent_score))

    def push_successors(node: int) -> None:
        """The node's next-ranked sibling and its rank-0 child (its LCRS children)."""
        path = paths[node]
        parent = parents[node]
        push(path[:-1] + (path[-1] + 1,), parent, scores[parent])
        push(path + (0,), node, scores[node])

    if budget == 0:
        return _tree(node_tokens, parents, depths, scores, ranks)

    if chain_seed:
        node, path = 0, ()
        while len(paths) - 1 < budget and len(path) < n_depths:
            path = path + (0,)
            score = scores[node] + float(logprobs[len(path) - 1, 0])
            if score < floor:
                break
            node = insert(path, node, score)
        # The chain nodes' LCRS children that are not chain nodes: every rank-1 sibling, and the
        # rank-0 child of the last chain node (out of the window when the chain stopped at tau).
        for chain_node in range(1, len(paths)):
            chain_path = paths[chain_node]
            push(chain_path[:-1] + (1,), parents[chain_node], scores[parents[chain_node]])
        push(paths[node] + (0,), node, scores[node])
    else:
        push((0,), 0, 0.0)

    while heap and len(paths) - 1 < budget:
        negative_score, _, path, parent, _ = heapq.heappop(heap)
        score = -negative_score
        if score < floor:
            break  # pops come in descending score order: nothing later is in the window
        node = insert(path, parent, score)
        push_successors(node)

    return _tree(node_tokens, parents, depths, scores, ranks)
