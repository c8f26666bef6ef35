#!/usr/bin/env python3
"""What a draft's LM head and a recurrent draft's state copy cost at real model shapes (synthetic
weights: timings do not depend on the values). Never run in CI.

    python tools/bench_draft_head.py --target q08b.gguf --out rows.jsonl

--target: a qwen35 GGUF; absent, the synthetic Qwen3.5-0.8B shape (preset 0.8b, Q4_K_M) is
written there first (several minutes). A synthetic DFlash draft for it is written next to it,
unless --draft names one.
Rows (JSON lines: commit, device, model, mode, figures):
  dflash-propose  one DFlash block (block_size - 1 depths, top-4) after a --context-token prompt,
                  with the target's whole LM head and with a reduced vocabulary (DraftVocabulary,
                  --draft-vocab rows), interleaved, median of --repeats; on a GPU also the kernel
                  launches and host waits per propose call of each (draft launch counters)
  save-state      specla_context_save_state on the target context against one decode step of it
                  (what a qwen35 model pays per step as an autoregressive draft), interleaved"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_name, emit_rows, git_commit  # noqa: E402


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="qwen35 GGUF (written with preset 0.8b when absent)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (the draft runs where the target runs)")
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--context-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", default=None, help="append JSON rows here")
    ap.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD here)")
    # the synthetic draft's shape (FFN 2E; the defaults are write_test_draft's small ones). A 27B
    # target's draft at z-lab's published shape: --draft-layers 5 --draft-heads 32 --draft-kv-heads 8
    # --draft-head-dim 128 --draft-quant f16
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--draft-heads", type=int, default=4)
    ap.add_argument("--draft-kv-heads", type=int, default=2)
    ap.add_argument("--draft-head-dim", type=int, default=64)
    ap.add_argument("--draft-quant", default="q8_0", help="f32, f16, q8_0 or q4_k_m")
    ap.add_argument("--draft", default=None,
                    help="a DFlash draft GGUF for the target (its rows take the shape and weight type from the file, "
                         "the --draft-* options are not used); absent, a synthetic one of the --draft-* shape is "
                         "written next to the target")
    args = ap.parse_args(argv)
    if args.draft and not Path(args.draft).is_file():
        ap.error(f"--draft {args.draft}: no such file")

    from pyspecla import Model
    from pyspecla.dflash_draft import DFlashDraft
    from pyspecla.speculative.drafters.vocabulary import DraftVocabulary
    from pyspecla.testing.drafts import write_test_draft
    from pyspecla.testing.models import write_test_model

    target_path = Path(args.target)
    if not target_path.exists():
        write_test_model(target_path, preset="0.8b", quant="q4_k_m", seed=0)
    if args.draft:
        draft_path = Path(args.draft)
    else:
        shape = (args.draft_layers, args.draft_heads, args.draft_kv_heads, args.draft_head_dim, args.draft_quant)
        suffix = "" if shape == (2, 4, 2, 64, "q8_0") else "-L{}-h{}-kv{}-d{}-{}".format(*shape)
        draft_path = target_path.with_name(target_path.stem + "-dflash-draft" + suffix + ".gguf")
        if not draft_path.exists():
            write_test_draft(draft_path, target_path, seed=1, quant=args.draft_quant, n_layer=args.draft_layers,
                             n_head=args.draft_heads, n_head_kv=args.draft_kv_heads, head_dim=args.draft_head_dim)

    model = Model.load(str(target_path), n_threads=args.threads, device=args.device)
    draft = DFlashDraft.load(str(draft_path), model)
    # a given draft is labelled by its own first layer's ffn_up type (a written one by its quant mix)
    draft_quant = draft.file.tensor("blk.0.ffn_up.weight").type_name.lower() if args.draft else args.draft_quant
    prompt = np.random.default_rng(0).integers(0, min(30000, model.hparams.n_vocab), args.context_tokens).tolist()
    ctx = model.new_context(n_ctx=args.context_tokens + 4 * args.repeats + 64, capture_layers=draft.target_layer_ids)
    ctx.eval(prompt)
    whole = draft.new_context(n_ctx=ctx.n_ctx)
    reduced = draft.new_context(n_ctx=ctx.n_ctx)
    vocabulary = DraftVocabulary(model, reduced, args.draft_vocab)
    vocabulary.follow(prompt)
    n_depths = draft.hparams.block_size - 1
    for dctx in (whole, reduced):  # ingest the prompt's feature rows once, outside the clock
        dctx.propose(ctx, prompt[-1], n_depths, 4)
    times: dict[str, list[float]] = {"whole": [], "reduced": [], "step": [], "save": []}
    for dctx in (whole, reduced):
        dctx.launch_counters()  # from here on: the timed calls only
    for _ in range(args.repeats):
        times["whole"].append(_ms(lambda: whole.propose(ctx, prompt[-1], n_depths, 4)))
        times["reduced"].append(_ms(lambda: reduced.propose(ctx, prompt[-1], n_depths, 4)))
    per_propose = {}
    for name, dctx in (("whole", whole), ("reduced", reduced)):
        launches, waits = dctx.launch_counters()  # -1 each on the CPU, which counts nothing
        per_propose[name] = (launches / args.repeats if launches >= 0 else None,
                             waits / args.repeats if waits >= 0 else None)
    token = prompt[-1]
    for _ in range(args.repeats):
        times["step"].append(_ms(lambda: ctx.eval_argmax([token])))
        times["save"].append(_ms(ctx.save_state))

    where = (f"cpu: {cpu_name()} ({os.cpu_count()} cores, {args.threads} threads)" if whole.device == "cpu"
             else whole.device)
    base = {"commit": args.commit or git_commit(), "device": where,
            "model": target_path.name, "draft": draft_path.name, "draft_layers": draft.hparams.n_layer,
            "draft_heads": draft.hparams.n_head, "draft_kv_heads": draft.hparams.n_head_kv,
            "draft_head_dim": draft.hparams.head_dim, "draft_quant": draft_quant, "n_vocab": model.hparams.n_vocab, "n_embd": model.hparams.n_embd,
            "repeats": args.repeats}
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        {**base, "mode": "dflash-propose", "n_depths": n_depths, "top_k": 4, "context_tokens": args.context_tokens,
         "whole_head_ms": med["whole"], "reduced_head_ms": med["reduced"], "reduced_rows": len(vocabulary),
         "ratio": med["whole"] / med["reduced"], "decode_step_ms": med["step"],
         "whole_launches_per_propose": per_propose["whole"][0], "whole_host_waits_per_propose": per_propose["whole"][1],
         "reduced_launches_per_propose": per_propose["reduced"][0],
         "reduced_host_waits_per_propose": per_propose["reduced"][1]},
        {**base, "mode": "save-state", "save_state_ms": med["save"], "decode_step_ms": med["step"],
         "fraction_of_step": med["save"] / med["step"]},
    ]
    emit_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
