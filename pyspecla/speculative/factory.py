"""From the command line's speculative flags to a drafter and a loop configuration: what `--draft`
names (a DFlash draft, a draft language model, ngram, oracle) and the defaults that go with it.
Shared by `pyspecla run` and the benchmark tools."""

from __future__ import annotations

import os

from ..errors import UsageError

# An autoregressive draft model's defaults: a draft forward costs a fair share of a target one on
# the CPU, so a short, confident run is worth more than a long one the target rejects halfway
# (the settings compared: docs/perf.md, "Real weights on the CPU").
DRAFT_MAX = 4
DRAFT_P_MIN = 0.75
# ... and it scores only this many frequent token ids (+ control tokens + the generation's own
# tokens; drafters/vocabulary.py): a small model's LM head is a large share of its cost. A DFlash
# draft too, over the target's head, which it applies to every row of its block (docs/perf.md,
# "DFlash head").
DRAFT_VOCAB = 32768
# DDTree size. A draft language model speculates its top-1 chain unless a budget is given: on the
# CPU every extra verify row costs a good part of a decode step, and its trees lost to its chain
# (docs/perf.md).
DDTREE_BUDGET = 22


def spec_config_from_args(args, max_depth: int = 15, drafter=None):
    from .loop import SpecConfig

    if args.draft is None:
        return SpecConfig(mode="ar")
    chain = args.no_ddtree or (getattr(drafter, "prefers_chain", False) and args.ddtree_budget is None)
    return SpecConfig(
        mode="chain" if chain else "ddtree",
        specla=args.specla,
        budget=args.ddtree_budget or DDTREE_BUDGET,
        tau=args.ddtree_tau if args.ddtree_tau is not None else (6.0 if args.specla else None),
        top_k=args.specla_top_k or (4 if args.specla else 8),
        chain_seed=not args.no_chain_seed,
        max_depth=max_depth,
    )


def make_drafter(model, spec: str, prompt_ids, n_predict: int, n_ctx: int, draft_max: int | None = None,
                 draft_p_min: float | None = None, draft_vocab: int | None = None, sampling=None):
    """--draft value -> drafter. oracle:p=P runs a plain pass first (a benchmark tool; greedy, or
    with `sampling` (SamplingParams, seed set) the plain sampled continuation it will verify);
    ngram / ngram:n=N,max=M is prompt lookup (no file; a name starting with ngram that is an
    existing file is loaded as a draft GGUF). A file is a DFlash draft or, when its architecture is
    one a target may have, an autoregressive draft model (draft_max / draft_p_min / draft_vocab
    apply to it; draft_vocab also to a DFlash draft)."""
    from ..arch import TARGET_ARCHS
    from ..loader.dflash import file_architecture
    from .drafters import DFlashDrafter, ModelDrafter, NgramDrafter, OracleDrafter

    is_file = os.path.exists(spec)
    is_model = is_file and file_architecture(spec) in TARGET_ARCHS
    is_dflash = is_file and not is_model and not spec.startswith("oracle")
    if not is_model:
        for flag, value in (("--draft-max", draft_max), ("--draft-p-min", draft_p_min),
                            ("--draft-vocab", None if is_dflash else draft_vocab)):
            if value is not None:
                raise UsageError(f"{flag} applies to a draft language model (--draft MODEL.gguf), not to --draft "
                                 f"{spec}")
    if spec.startswith("ngram") and not is_file:
        max_n, max_tokens = NgramDrafter.parse(spec)
        return NgramDrafter(max_n=max_n, max_tokens=max_tokens)
    if spec.startswith("oracle"):
        p = OracleDrafter.parse(spec)
        continuation = model.generate(prompt_ids, n_predict + 16, sampling=sampling)
        return OracleDrafter(p, continuation, model.hparams.n_vocab, seed=0)
    if is_model:
        max_depth = DRAFT_MAX if draft_max is None else draft_max
        # the history (prompt + generated) plus all drafted tokens but the last
        n_ctx = len(prompt_ids) + n_predict + max_depth + 1
        return ModelDrafter.load(spec, model, n_ctx=n_ctx, max_depth=max_depth,
                                 p_min=DRAFT_P_MIN if draft_p_min is None else draft_p_min,
                                 vocab=DRAFT_VOCAB if draft_vocab is None else draft_vocab)
    from ..dflash_draft import DFlashDraft

    return DFlashDrafter(DFlashDraft.load(spec, model, n_threads=model.n_threads), n_ctx=n_ctx,
                         vocab=DRAFT_VOCAB if draft_vocab is None else draft_vocab)
