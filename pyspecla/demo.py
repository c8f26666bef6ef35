"""`pyspecla demo`: build a small synthetic target + DFlash draft pair once (cached), then run every
decoding mode on it side by side and check each against plain decoding. The one command that
writes test models, so the only runtime module that imports pyspecla.testing (lazily)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import UsageError


def demo_cache_dir(cache_dir: str | None) -> Path:
    return Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyspecla"


def demo_models(cache_dir: str | None) -> tuple[Path, Path]:
    """The demo's synthetic target + DFlash draft pair, written once (deterministic) and cached."""
    from .testing.drafts import write_test_draft
    from .testing.models import write_test_model

    base = demo_cache_dir(cache_dir)
    target, draft = base / "demo-tiny8-q8_0-seed1.gguf", base / "demo-dflash-draft-seed1.gguf"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"demo cache directory {base}: cannot create it ({exc.strerror or exc}); "
                         "give another with --cache-dir") from None
    if not os.access(base, os.W_OK | os.X_OK) and not (target.exists() and draft.exists()):
        raise UsageError(f"demo cache directory {base}: not writable; give another with --cache-dir")
    if not target.exists():
        print(f"building the demo target (synthetic weights, once): {target}", file=sys.stderr)
        tmp = target.with_suffix(".tmp")
        write_test_model(str(tmp), preset="tiny8", quant="q8_0", seed=1)
        tmp.replace(target)
    if not draft.exists():
        print(f"building the demo draft (synthetic weights, once): {draft}", file=sys.stderr)
        tmp = draft.with_suffix(".tmp")
        write_test_draft(str(tmp), str(target), seed=1)
        tmp.replace(draft)
    return target, draft


def cmd_demo(args) -> int:
    """Every mode on one prompt, side by side. Random weights make the text noise and the DFlash
    draft a poor guesser; the oracle rows show the loop at a realistic acceptance."""
    from .model import Model
    from .speculative.drafters import DFlashDrafter, OracleDrafter
    from .speculative.loop import SpecConfig, generate

    target_path, draft_path = demo_models(args.cache_dir)
    model = Model.load(str(target_path), n_threads=args.threads, cpu_kernels=args.cpu_kernels, device=args.device)
    prompt = "def fibonacci(n):\n"
    ids = model.tokenize(prompt)
    from .context_size import plan_run_context

    plan = plan_run_context(model, len(ids), args)
    n = plan.n_predict
    print(f"target: {target_path.name}, draft: {draft_path.name} (random weights: the text is noise, the "
          f"machinery is real)", file=sys.stderr)
    reference = model.generate(ids, n + 16)
    from .dflash_draft import DFlashDraft

    draft = DFlashDraft.load(str(draft_path), model, n_threads=args.threads)
    rows = [
        ("autoregressive", SpecConfig(mode="ar"), None),
        ("chain, DFlash draft, SpecLA", SpecConfig(mode="chain", specla=True), "dflash"),
        ("DDTree, DFlash draft, SpecLA off", SpecConfig(mode="ddtree", specla=False, tau=None, top_k=8), "dflash"),
        ("DDTree, DFlash draft, SpecLA", SpecConfig(mode="ddtree", specla=True), "dflash"),
        ("DDTree, oracle p=0.9, SpecLA off", SpecConfig(mode="ddtree", specla=False, tau=None, top_k=8), 0.9),
        ("DDTree, oracle p=0.9, SpecLA", SpecConfig(mode="ddtree", specla=True), 0.9),
    ]
    print(f"{'mode':36s} {'tokens/s':>9s} {'steps':>6s} {'accepted/step':>14s} {'same as AR':>10s}")
    for name, config, source in rows:
        if source == "dflash":
            drafter = DFlashDrafter(draft, n_ctx=plan.n_ctx + 64)
        elif source is None:
            drafter = None
        else:
            drafter = OracleDrafter(source, reference, model.hparams.n_vocab, seed=0)
        stats, ctx = generate(model, ids, n, config, drafter=drafter, n_ctx=plan.n_ctx)
        ctx.close()
        same = "yes" if stats.tokens == reference[:n] else "NO"
        print(f"{name:36s} {stats.tokens_per_s:9.1f} {stats.steps:6d} {stats.mean_accepted:14.2f} {same:>10s}")
    print("\n" + prompt + model.detokenize(reference[:n]))
    return 0
