"""The speculative decoding loop: draft → tree → verify → accept → commit, one loop for every mode.

Modes
- "ar":     no drafter; each step verifies the root alone (a plain decode step).
- "chain":  the drafter's top-1 chain, no tree.
- "ddtree": a DDTree built from the drafter's per-depth top-K.
State handling (orthogonal): SpecLA (HLD chains + deferred factor commit) or, with specla off, the
baseline the paper and lucebox compare with: dense per-node checkpoints restored at accept.

Greedy speculative output equals greedy autoregressive output token for token: the target's
verify computes every node exactly as plain decoding would (see tests/test_tree_verify.py).

Drafter hooks (duck-typed; a drafter without the attribute is left alone):
- `drafter.generated`: set before each proposal to the number of tokens emitted so far.
- `drafter.history`: set once per generate() call to a list holding the prompt, to which the loop
  appends every emitted token (O(1) each), so at each proposal it is prompt + emitted tokens, the
  last one being the step's root. The same list object all along: a drafter can index it
  incrementally and tell a new generation by the object changing.
- An empty proposal (zero depth rows, e.g. the n-gram drafter finding no match) is verified as
  the root alone: a 1-node tree, i.e. exactly a plain decode step. Depth rows from the first one
  with a NaN/infinite log-prob or an out-of-vocabulary token on are dropped (usable_proposal).
- `drafter.guarded = True`: the loop sizes each step with a LossGuard (guard.py), which bounds
  what wrong guesses can cost against plain decoding (the n-gram drafter sets it)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..errors import UsageError
from ..sampling import SamplingParams, TokenSampler
from .accept import greedy_accept, sampled_accept
from .tree import DraftTree, build_chain, build_ddtree
from .guard import LossGuard


@dataclass
class SpecConfig:
    mode: str = "ddtree"          # "ar" | "chain" | "ddtree"
    specla: bool = True           # SpecLA state handling; False = dense checkpoints + restore
    budget: int = 22              # tree nodes besides the root
    tau: float | None = 6.0       # confidence window; None = off
    top_k: int = 4
    chain_seed: bool = True
    max_depth: int = 15           # depths a draft block gives (block size − 1)

    def validate(self) -> None:
        if self.mode not in ("ar", "chain", "ddtree"):
            raise UsageError(f"mode must be ar, chain or ddtree, got {self.mode!r}")
        if self.budget < 1:
            raise UsageError(f"--ddtree-budget must be >= 1, got {self.budget}")
        if self.top_k < 1:
            raise UsageError(f"--specla-top-k must be >= 1, got {self.top_k}")
        if self.max_depth < 1:
            raise UsageError(f"the draft depth must be >= 1, got {self.max_depth}")

    @property
    def max_tree_nodes(self) -> int:
        if self.mode == "ar":
            return 1
        if self.mode == "chain":
            return min(self.max_depth, self.budget) + 1
        return self.budget + 1

    @property
    def methods(self) -> tuple[str, str]:
        return ("hld_chains", "deferred_factors") if self.specla else ("dense_checkpoints", "checkpoint_restore")


@dataclass
class SpecStats:
    mode: str
    specla: bool
    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)  # tokens committed by each step
    tree_nodes_per_step: list[int] = field(default_factory=list)
    side_branch_steps: int = 0  # steps whose accepted path holds a node that was not a first choice
    compacted_steps: int = 0    # steps whose accepted path is not the tree's first nodes in order
                                # (accept moves KV rows and captured features into place)
    prompt_ms: float = 0.0
    draft_ms: float = 0.0    # the drafter's proposal and the tree built from it
    tree_ms: float = 0.0     # of draft_ms: building the tree
    verify_ms: float = 0.0   # verify_tree, the greedy walk and accept
    accept_ms: float = 0.0   # of verify_ms: the greedy walk and accept (on a GPU, accept's queued
                             # device work finishes inside the next verify)
    decode_s: float = 0.0
    tokens_per_s: float = 0.0
    cancelled: bool = False
    finish_reason: str = ""    # "length", "stop" (an end-of-generation token) or "cancelled"

    @property
    def mean_accepted(self) -> float:
        return float(np.mean(self.accepted_per_step)) if self.accepted_per_step else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["mean_accepted"] = self.mean_accepted
        return d


def _root_only_tree(root: int) -> DraftTree:
    """The 1-node tree: verifying it is a plain decode step (mode ar, or an empty proposal)."""
    return DraftTree(tokens=np.array([root], np.int32), parents=np.array([-1], np.int32),
                     depths=np.zeros(1, np.int32), scores=np.zeros(1), ranks=np.array([-1], np.int32))


def usable_proposal(top_tokens, top_logprobs, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The proposal's depth rows before the first that holds a NaN or infinite log-prob or a token
    outside [0, n_vocab): a draft whose numbers went bad (NaN weights or activations) proposes
    nothing from there on, so its step is shorter (or a plain decode step), never an error; the
    output stays that of plain decoding, which verification guarantees anyway."""
    tokens = np.asarray(top_tokens)
    logprobs = np.asarray(top_logprobs, dtype=np.float64)
    if tokens.ndim != 2 or tokens.shape != logprobs.shape or len(tokens) == 0:
        return tokens, logprobs  # the tree builder names a malformed proposal
    finite = np.isfinite(logprobs)
    if finite.all() and tokens.min() >= 0 and tokens.max() < n_vocab:
        return tokens, logprobs  # every step but a broken draft's: three reductions, no row search
    bad = ~finite.all(axis=1) | ((tokens < 0) | (tokens >= n_vocab)).any(axis=1)
    if bad.any():
        cut = int(np.argmax(bad))
        return tokens[:cut], logprobs[:cut]
    return tokens, logprobs


def _build_tree(config: SpecConfig, root: int, top_tokens, top_logprobs, budget: int) -> DraftTree:
    if len(top_tokens) == 0:  # the drafter proposes nothing this step: verify the root alone
        return _root_only_tree(root)
    if config.mode == "chain":
        return build_chain(root, top_tokens, top_logprobs, min(config.max_depth, budget))
    return build_ddtree(root, top_tokens, top_logprobs, budget, tau=config.tau, chain_seed=config.chain_seed)


def generate(model, prompt_ids, max_tokens: int, config: SpecConfig, drafter=None, eos_ids=(),
             on_tokens: Callable[[list[int]], None] | None = None, context=None, n_ctx: int | None = None,
             on_prefill: Callable[[int, int], None] | None = None, sampler=None) -> tuple[SpecStats, object]:
    """Generation of up to max_tokens tokens after prompt_ids: greedy, or with a TokenSampler
    (pyspecla.sampling) the tokens plain sampling with its seed gives. Returns (stats, context);
    the context's pending path is folded (finish) before returning, also on Ctrl-C.
    n_ctx: the tokens the context holds, prompt and generated ones (default prompt + max_tokens;
    it must hold both); the context made here gets room for one verify tree on top.
    on_prefill(done, total) reports the prompt pass chunk by chunk."""
    ctx = context or make_context(model, prompt_ids, max_tokens, config, drafter, n_ctx)
    stats = SpecStats(mode=config.mode, specla=config.specla)
    t0 = time.perf_counter()
    try:
        for records in speculative_steps(model, ctx, prompt_ids, max_tokens, config, stats, drafter=drafter,
                                         sampler=sampler, eos_ids=eos_ids, on_prefill=on_prefill):
            if not stats.tokens:
                t_decode = time.perf_counter()
            taken = [r[0] for r in records]
            stats.tokens.extend(taken)
            if on_tokens:
                on_tokens(taken)
        stats.decode_s = time.perf_counter() - t_decode if stats.tokens else 0.0
    except KeyboardInterrupt:
        stats.cancelled = True
        stats.finish_reason = "cancelled"
        stats.decode_s = time.perf_counter() - t0
    finally:
        ctx.finish()  # the durable state equals plain decoding of the committed tokens
    # the first token comes from the prompt pass; the rest are decode steps
    n_decoded = max(len(stats.tokens) - 1, 0)
    stats.tokens_per_s = n_decoded / stats.decode_s if stats.decode_s > 0 else 0.0
    return stats, ctx


def make_context(model, prompt_ids, max_tokens: int, config: SpecConfig, drafter=None, n_ctx: int | None = None):
    """The target context a speculative generation runs in (validating its arguments first): room
    for the prompt, max_tokens (or n_ctx tokens in all) and one verify tree; the SpecLA or baseline
    verify methods of config; the feature layers a drafter reads."""
    config.validate()
    if config.mode != "ar" and drafter is None:
        raise UsageError(f"mode {config.mode!r} needs a drafter (--draft)")
    if len(prompt_ids) == 0:
        raise UsageError("the prompt must contain at least one token")
    needed = len(prompt_ids) + max_tokens
    if n_ctx is not None and n_ctx < needed:
        raise UsageError(f"n_ctx {n_ctx} cannot hold the {len(prompt_ids)}-token prompt and {max_tokens} new tokens")
    verify_method, commit_method = config.methods
    return model.new_context(
        n_ctx=(n_ctx or needed) + config.max_tree_nodes + 1, max_tree_nodes=config.max_tree_nodes,
        verify_method=verify_method, commit_method=commit_method,
        capture_layers=getattr(drafter, "capture_layers", None) or None)


def speculative_steps(model, ctx, prompt_ids, max_tokens: int, config: SpecConfig, stats: SpecStats, drafter=None,
                      sampler=None, eos_ids=(), n_top: int = 0, token_logprobs: bool = False,
                      should_stop: Callable[[], bool] | None = None,
                      on_prefill: Callable[[int, int], None] | None = None):
    """The loop as a generator: yields, per target pass (the prompt pass, then each step), the
    records (token, logprob, top_logprobs) it commits, cut at max_tokens and after the first token
    of eos_ids; sets stats.finish_reason ("length", "stop" or "cancelled") before it ends.

    sampler None (or a greedy TokenSampler without penalties) decides by the native argmax and
    copies no logits unless n_top > 0 or token_logprobs asks for log-probabilities. Otherwise every
    node the accept walk reaches is sampled from its verified logits (sampled_accept) with history
    = prompt + committed tokens + the walk's path and position = the length of that history.
    should_stop() is asked between prompt chunks and before every step; the context is left as the
    committed tokens made it (call ctx.finish())."""
    config.validate()
    if config.mode != "ar" and drafter is None:
        raise UsageError(f"mode {config.mode!r} needs a drafter (--draft)")
    sampler = sampler or TokenSampler(SamplingParams())
    if sampler.needs_logits and ctx.logit_tokens is not None:
        raise UsageError("sampling needs the target's logits over the whole vocabulary (set_logit_rows is set)")
    sampled = sampler.needs_logits
    greedy_logprobs = not sampled and (n_top > 0 or token_logprobs)  # the argmax decides; logits copied
    # a drafter that guesses without a model is kept from costing more than it saves (guard.py)
    guard = LossGuard(config.max_tree_nodes) if getattr(drafter, "guarded", False) else None
    eos = set(eos_ids)
    history = [int(t) for t in prompt_ids]  # prompt + every committed token (+ the walk's path)
    if drafter is not None and hasattr(drafter, "history"):
        drafter.history = history
    n_out = 0

    def cut(records):
        """records up to max_tokens / the first EOS, and whether generation is over (why)."""
        nonlocal n_out
        taken = []
        for record in records:
            if n_out >= max_tokens:
                break
            taken.append(record)
            n_out += 1
            if record[0] in eos:
                return taken, "stop"
        return taken, ("length" if n_out >= max_tokens else None)

    def pick(logits_row):
        """The sampler's record for the token after the whole history, at position len(history)."""
        return sampler.pick(logits_row, history, len(history), n_top=n_top, want_logprob=token_logprobs)

    stop = should_stop or (lambda: False)
    if max_tokens == 0:
        stats.finish_reason = "length"
        return
    t0 = time.perf_counter()
    first = ctx.prefill(prompt_ids, want_logits=sampled or greedy_logprobs, on_progress=on_prefill, should_stop=stop)
    stats.prompt_ms = (time.perf_counter() - t0) * 1e3
    if first is None:
        stats.finish_reason = "cancelled"
        return
    if sampled or greedy_logprobs:
        record = pick(first)
    else:
        record = (int(first), None, None)
    history.append(record[0])
    taken, reason = cut([record])
    yield taken
    root = record[0]
    while reason is None:
        if stop():
            stats.finish_reason = "cancelled"
            return
        t_step = time.perf_counter()
        allowed = guard.allowed_nodes() if guard else config.max_tree_nodes
        if config.mode == "ar" or allowed <= 1:
            tree = _root_only_tree(root)
        else:
            if hasattr(drafter, "generated"):
                drafter.generated = n_out
            top_tokens, top_logprobs = usable_proposal(
                *drafter.propose(ctx, root, min(config.max_depth, allowed - 1), config.top_k),
                model.hparams.n_vocab)
            t_tree = time.perf_counter()
            tree = _build_tree(config, root, top_tokens, top_logprobs, min(config.budget, allowed - 1))
            stats.tree_ms += (time.perf_counter() - t_tree) * 1e3
        t_verify = time.perf_counter()
        stats.draft_ms += (t_verify - t_step) * 1e3
        base = len(history)  # the root is history[-1]; the token chosen at node i lands at base + depth(i)
        if sampled:
            _, logits = ctx.verify_tree(tree.tokens, tree.parents, want_logits=True)
            t_accept = time.perf_counter()  # the sample-and-match walk and accept
            picks = []

            def choose(node):
                record = pick(logits[node])
                picks.append(record)
                history.append(record[0])  # the walk's path so far: the next node's history
                return record[0]

            path, bonus = sampled_accept(tree, choose)
            records = picks
        elif greedy_logprobs:
            posterior, logits = ctx.verify_tree(tree.tokens, tree.parents, want_logits=True)
            t_accept = time.perf_counter()
            path, bonus = greedy_accept(tree, posterior)
            chosen = [int(tree.tokens[i]) for i in path[1:]] + [bonus]
            history.extend(chosen)
            records = [(token, *sampler.logprobs_of(logits[node], history[:base + k], token, n_top))
                       for k, (node, token) in enumerate(zip(path, chosen))]
        else:
            posterior = ctx.verify_tree(tree.tokens, tree.parents)
            t_accept = time.perf_counter()
            path, bonus = greedy_accept(tree, posterior)
            records = [(int(tree.tokens[i]), None, None) for i in path[1:]] + [(bonus, None, None)]
            history.extend(r[0] for r in records)
        ctx.accept(path)
        t_done = time.perf_counter()
        stats.verify_ms += (t_done - t_verify) * 1e3
        stats.accept_ms += (t_done - t_accept) * 1e3
        if guard:
            guard.record(len(tree.tokens), len(path), t_done - t_step)
        stats.steps += 1
        stats.accepted_per_step.append(len(path))
        stats.tree_nodes_per_step.append(len(tree.tokens))
        stats.side_branch_steps += bool(np.any(tree.ranks[path[1:]] > 0))
        stats.compacted_steps += list(path) != list(range(len(path)))
        taken, reason = cut(records)
        root = records[-1][0]
        yield taken
    stats.finish_reason = reason

