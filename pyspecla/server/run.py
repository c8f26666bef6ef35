"""The `pyspecla serve` command: load the model, check the draft, build the app, run uvicorn."""

from __future__ import annotations

import os
import sys

from ..errors import UsageError
from . import INSTALL_HINT, missing_dependencies

# A request's context when -c is not given: the model's trained context, capped here because a
# context's cache is allocated up front and a request that leaves max_tokens out may fill it.
DEFAULT_CTX = 4096


def server_context_size(model, ctx_size: int | None) -> int:
    """-c, or min(trained context, DEFAULT_CTX); warns above the trained context as `run` does."""
    from ..context_size import MAX_CTX_SIZE

    n_ctx_train = model.hparams.n_ctx_train
    if ctx_size is None:
        return min(n_ctx_train, DEFAULT_CTX)
    if ctx_size > MAX_CTX_SIZE:
        raise UsageError(f"-c/--ctx-size must be at most {MAX_CTX_SIZE}, got {ctx_size}")
    if ctx_size > n_ctx_train:
        print(f"pyspecla: warning: -c/--ctx-size {ctx_size} is larger than the model's trained context "
              f"({n_ctx_train} tokens); output past {n_ctx_train} tokens may degrade", file=sys.stderr)
    return ctx_size


def check_draft(spec: str | None) -> str | None:
    """--draft: an existing draft GGUF, or ngram[:n=N,max=M]; the benchmark-only oracle is refused."""
    if spec is None:
        return None
    from ..speculative.drafters import NgramDrafter

    if os.path.exists(spec):
        return spec
    if spec.startswith("ngram"):
        NgramDrafter.parse(spec)
        return spec
    if spec.startswith("oracle"):
        raise UsageError("--draft oracle:... is a benchmark tool (it needs the answer in advance); the server takes "
                         "a draft GGUF or ngram")
    raise UsageError(f"--draft {spec}: no such file (give a draft GGUF or ngram[:n=N,max=M])")


def speculative_options(args) -> dict:
    options = {}
    if args.specla:
        options["specla"] = True
    if args.no_ddtree:
        options["no_ddtree"] = True
    if args.ddtree_budget is not None:
        options["ddtree_budget"] = args.ddtree_budget
    if args.draft is None and options:
        raise UsageError(f"--{next(iter(options)).replace('_', '-')} needs --draft (speculative decoding)")
    return options


def cmd_serve(args) -> int:
    missing = missing_dependencies()
    if missing:
        raise UsageError(f"pyspecla serve needs {', '.join(missing)}, not installed here: {INSTALL_HINT}")
    import uvicorn

    from ..model import Model
    from .app import create_app

    draft = check_draft(args.draft)
    options = speculative_options(args)
    model = Model.load(args.model, n_threads=args.threads, cpu_kernels=args.cpu_kernels, device=args.device)
    # one token through the model before serving (llama-server warms up too): a file whose weights
    # hold NaN or Inf fails here, named (Context.prefill checks the logits), not in every request
    ctx = model.new_context(n_ctx=16, max_batch=1)
    try:
        ctx.prefill([0])
    finally:
        ctx.close()
    n_ctx = server_context_size(model, args.ctx_size)
    app = create_app(model, n_ctx=n_ctx, model_path=args.model, model_id=args.alias, parallel=args.parallel,
                     queue_size=args.queue, draft=draft, speculative_options=options, api_key=args.api_key)
    mode = f"draft {draft}" + (" +specla" if options.get("specla") else "") if draft else "plain decoding"
    print(f"pyspecla: serving {args.model} on http://{args.host}:{args.port} ({mode}; context {n_ctx} tokens per "
          f"request; {args.parallel} slot(s), queue {args.queue}{'; API key required' if args.api_key else ''})",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
