"""`pyspecla run | serve | inspect | demo`: the command-line surface.

Every user error (bad file, bad flag value) ends as one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from .context_size import plan_run_context, prefill_progress
from .errors import SpeclaError, UsageError
from .speculative.factory import (
    DDTREE_BUDGET,
    DRAFT_MAX,
    DRAFT_P_MIN,
    DRAFT_VOCAB,
    make_drafter,
    spec_config_from_args,
)


def _int_at_least(flag, low: int):
    """An integer >= low (0 or 1; the message says "positive" for 1)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be {'positive' if low == 1 else f'>= {low}'}, got {value}")
        return value

    return parse


def _positive_int(flag):
    return _int_at_least(flag, 1)


def _float_in_range(flag, low: float, high: float | None = None):
    """A finite number in [low, high] (high None: no upper bound); NaN and infinities are refused."""
    def parse(text):
        value = _finite_float(flag)(text)
        if high is None and not value >= low:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {low:g}, got {text}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be in [{low:g}, {high:g}], got {text}")
        return value

    return parse


def _port(text: str) -> int:
    value = _int_at_least("--port", 1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"--port must be at most 65535, got {value}")
    return value


def _open_unit_interval(flag):
    """A number in (0, 1]."""
    def parse(text):
        value = _finite_float(flag)(text)
        if not 0.0 < value <= 1.0:
            raise argparse.ArgumentTypeError(f"{flag} must be in (0, 1], got {text}")
        return value

    return parse


def _positive_float(flag):
    def parse(text):
        value = _finite_float(flag)(text)
        if not value > 0.0:
            raise argparse.ArgumentTypeError(f"{flag} must be > 0, got {text}")
        return value

    return parse


def _sampling_params(args):
    """The run's SamplingParams, its seed drawn now when sampling without one (and printed, so the
    run can be repeated)."""
    from .generation import resolve_sampling
    from .sampling import SamplingParams

    params = resolve_sampling(SamplingParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, penalty_last_n=args.repeat_last_n, seed=args.seed))
    if args.seed is None and params.seed is not None:
        print(f"pyspecla: sampling seed {params.seed}", file=sys.stderr)
    return params


def _device(text: str) -> str:
    from . import _native  # (the library loads only for commands that run a model)

    try:
        _native.parse_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _finite_float(flag):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number, got {text}")
        return value

    return parse


def _threads(text):
    """0 (every core) up to the number of CPUs this machine has."""
    n_cpus = os.cpu_count() or 1
    value = _int_at_least("-t/--threads", 0)(text)
    if value > n_cpus:
        raise argparse.ArgumentTypeError(f"-t/--threads must be at most {n_cpus} (the CPUs of this machine), got {value}")
    return value


def _seed(text):
    """An integer; a negative one means a random seed, as in llama.cpp."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed expects an integer, got {text!r}") from None
    return None if value < 0 else value


def _add_runtime_flags(p: argparse.ArgumentParser, ctx_help: str | None = None) -> None:
    p.add_argument("-t", "--threads", type=_threads, default=0,
                   help="CPU threads, 1 to the number of CPUs (default 0: all cores)")
    p.add_argument(
        "--cpu-kernels",
        choices=["auto", "scalar", "avx2", "avx512"],
        default="auto",
        help="CPU kernel set: auto (fastest this CPU supports), scalar (the reference), avx2, avx512 "
             "(AVX-512 VNNI matmuls, the same results as avx2)",
    )
    p.add_argument("-c", "--ctx-size", type=_positive_int("--ctx-size"), default=None,
                   help=ctx_help or "context length in tokens, prompt and generated ones (default: prompt + new tokens, "
                        "capped by the model's trained context length). A prompt that fills the context is an "
                        "error; generation stops at the end of the context; a -c above the trained context "
                        "is allowed with a warning")
    p.add_argument("--device", type=_device, default="auto",
                   help="where the model runs: auto (a GPU when this build and machine have a working one, else "
                        "the CPU), cpu, cuda or cuda:N")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="pyspecla", description="Exact speculative decoding for qwen35 GGUF models.")
    parser.add_argument("--version", action="version", version=f"pyspecla {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate text from a prompt", description="Generate text from a prompt, "
                         "streaming it to stdout, then print one line of prompt and decode speed to stderr.")
    run.add_argument("model", help="path of a qwen35 GGUF file")
    src = run.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help="prompt text")
    src.add_argument("-f", "--prompt-file", default=None, help="read the prompt from this file (kept byte for byte)")
    run.add_argument("-n", "--n-predict", type=_positive_int("-n/--n-predict"), default=128,
                     help="number of tokens to generate (default 128)")
    run.add_argument("--chat", action="store_true",
                     help="wrap the prompt as one user message with the file's chat template")
    sampling = run.add_argument_group(
        "sampling (applied in this order: penalties, top-k, top-p, min-p, temperature; exact with --draft too: "
        "the same seed gives the same tokens with or without a draft)")
    sampling.add_argument("--temp", type=_float_in_range("--temp", 0.0), default=0.0,
                          help="sampling temperature; 0 = greedy (default)")
    sampling.add_argument("--top-k", type=_int_at_least("--top-k", 0), default=0, metavar="K",
                          help="keep the K most likely tokens (default 0: all)")
    sampling.add_argument("--top-p", type=_open_unit_interval("--top-p"), default=1.0, metavar="P",
                          help="keep the most likely tokens up to probability mass P, in (0, 1] (default 1: all)")
    sampling.add_argument("--min-p", type=_float_in_range("--min-p", 0.0, 1.0), default=0.0, metavar="P",
                          help="keep tokens at least P times as likely as the most likely one (default 0: all)")
    sampling.add_argument("--repeat-penalty", type=_positive_float("--repeat-penalty"), default=1.0, metavar="R",
                          help="divide a recent token's positive logit by R, multiply a negative one (default 1: off)")
    sampling.add_argument("--presence-penalty", type=_finite_float("--presence-penalty"), default=0.0, metavar="A",
                          help="subtract A from the logit of every recent token (default 0: off)")
    sampling.add_argument("--frequency-penalty", type=_finite_float("--frequency-penalty"), default=0.0,
                          metavar="A", help="subtract A per occurrence from a recent token's logit (default 0: off)")
    sampling.add_argument("--repeat-last-n", type=_int_at_least("--repeat-last-n", -1), default=64, metavar="N",
                          help="the penalties look at the last N tokens of prompt and output (default 64; 0: no "
                               "penalties; -1: all)")
    sampling.add_argument("--seed", type=_seed, default=None,
                          help="sampling seed (with --temp > 0); negative, like the default: a random seed, printed "
                               "to stderr")
    run.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    spec = run.add_argument_group("speculative decoding (output identical to plain decoding, greedy or sampled)")
    spec.add_argument("--draft", default=None, metavar="DRAFT",
                      help="a draft GGUF for this target: a DFlash draft, or an ordinary language model (qwen2 or "
                           "qwen35) with the target's vocabulary, decoding greedily ahead (see --draft-max, "
                           "--draft-p-min); or ngram[:n=N,max=M] — prompt lookup, no draft "
                           "model: propose the tokens that followed the latest earlier occurrence of the text's "
                           "longest suffix n-gram (N down to 1, default 3; at most M tokens, default 10; no match "
                           "costs a plain decode step); or oracle:p=P — a BENCHMARK TOOL that proposes "
                           "the target's own greedy continuation (from a prior plain pass) with each token replaced "
                           "by a wrong one with probability 1-P")
    spec.add_argument("--draft-max", type=_positive_int("--draft-max"), default=None, metavar="N",
                      help=f"a draft language model proposes at most N tokens per step (default {DRAFT_MAX})")
    spec.add_argument("--draft-p-min", type=_float_in_range("--draft-p-min", 0.0, 1.0), default=None, metavar="P",
                      help="a draft language model stops proposing at the first token it gives a probability "
                           f"below P (default {DRAFT_P_MIN}; 0 = always the full --draft-max)")
    spec.add_argument("--draft-vocab", type=_int_at_least("--draft-vocab", 0), default=None,
                      metavar="N",
                      help="a draft language model scores only the N lowest token ids (BPE merge order, roughly "
                           "by frequency), the control tokens and the tokens of the prompt and output so far "
                           f"(default {DRAFT_VOCAB}; 0 = the whole vocabulary); a DFlash draft likewise over the "
                           "target's LM head; the output does not change")
    spec.add_argument("--specla", action="store_true",
                      help="verify through the recurrent layers with SpecLA (HLD chains, factor banks, deferred "
                           "commit); without it the tree is verified with dense per-node state checkpoints")
    spec.add_argument("--no-ddtree", action="store_true",
                      help="speculate the draft's top-1 chain only, no tree (the default for a draft language "
                           "model: on the CPU its chain measured fastest; give --ddtree-budget for a tree)")
    spec.add_argument("--ddtree-budget", type=_positive_int("--ddtree-budget"), default=None,
                      help=f"tree nodes per step besides the root (default {DDTREE_BUDGET})")
    spec.add_argument("--ddtree-tau", type=_finite_float("--ddtree-tau"), default=None,
                      help="keep tree nodes whose log-probability is within TAU of the best (default 6 with "
                           "--specla, off otherwise; negative counts as 0)")
    spec.add_argument("--specla-top-k", type=_positive_int("--specla-top-k"), default=None,
                      help="candidates per depth the tree may branch into (default 4 with --specla, else 8)")
    spec.add_argument("--no-chain-seed", action="store_true",
                      help="do not insert the draft's top-1 chain before best-first expansion")
    spec.add_argument("--stats-json", default=None, metavar="FILE",
                      help="write the run's record (tokens, steps, accepted_per_step, draft_ms, verify_ms, "
                           "tokens_per_s, ...) as JSON")
    _add_runtime_flags(run)

    serve = sub.add_parser("serve", help="serve a model over HTTP (OpenAI, llama-server and Anthropic APIs)",
                           description="Serve a model over HTTP: OpenAI's /v1/chat/completions, /v1/completions, "
                           "/v1/models, llama-server's /completion, /tokenize, /detokenize, /props, /health, "
                           "/metrics, and Anthropic's /v1/messages. Needs the `server` extra: "
                           "pip install 'pyspecla[server]'.")
    serve.add_argument("model", help="path of a qwen35 / qwen2 / qwen3 GGUF file")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=_port, default=8080, help="TCP port (default 8080)")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require this key (Authorization: Bearer KEY or x-api-key: KEY) on every endpoint "
                            "but /health")
    serve.add_argument("--alias", default=None, help="the model name the API reports (default: the file name)")
    serve.add_argument("--parallel", type=_positive_int("--parallel"), default=1, metavar="N",
                       help="requests generated at once, served in turn one step each (default 1)")
    serve.add_argument("--queue", type=_int_at_least("--queue", 0), default=16, metavar="N",
                       help="requests that may wait for a slot; beyond that a request gets 429 with Retry-After "
                            "(default 16)")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info",
                       help="uvicorn's log level (default info)")
    serve_spec = serve.add_argument_group("speculative decoding (every request; output identical to plain decoding)")
    serve_spec.add_argument("--draft", default=None, metavar="DRAFT",
                            help="a draft GGUF for this target (DFlash draft or small language model), or "
                                 "ngram[:n=N,max=M] (prompt lookup); see `pyspecla run --help`")
    serve_spec.add_argument("--specla", action="store_true",
                            help="verify through the recurrent layers with SpecLA (see `pyspecla run --help`)")
    serve_spec.add_argument("--no-ddtree", action="store_true", help="speculate the draft's top-1 chain only")
    serve_spec.add_argument("--ddtree-budget", type=_positive_int("--ddtree-budget"), default=None,
                            help=f"tree nodes per step besides the root (default {DDTREE_BUDGET})")
    _add_runtime_flags(serve, ctx_help="tokens one request's context holds, prompt and generated ones (default: "
                                       "the model's trained context, at most 4096); a longer prompt is refused "
                                       "with a 400, a request's max_tokens is capped to what is left")

    inspect = sub.add_parser("inspect", help="print a GGUF's metadata, layer pattern and tensors")
    inspect.add_argument("model", help="path of a GGUF file")

    demo = sub.add_parser("demo", help="build a small synthetic model (cached) and generate from it")
    demo.add_argument("--cache-dir", default=None,
                      help="where the demo model is kept (default: $XDG_CACHE_HOME/pyspecla or ~/.cache/pyspecla)")
    demo.add_argument("-n", "--n-predict", type=_positive_int("-n/--n-predict"), default=48,
                      help="tokens to generate (default 48)")
    _add_runtime_flags(demo)
    return parser


def _generate(model, prompt_ids, args, sampling, out=None) -> dict:
    from .tokenizer import StreamingDetokenizer

    out = out or sys.stdout

    plan = plan_run_context(model, len(prompt_ids), args)
    ctx = model.new_context(n_ctx=plan.n_ctx)
    detok = StreamingDetokenizer(model.tokenizer)
    # the end-of-generation token that stops a run is not part of the text
    hidden = set() if getattr(args, "ignore_eos", False) else model.tokenizer.eos_ids
    t0 = time.perf_counter()
    t_first = None
    n_new = 0
    emitted = []
    for token in model.stream(prompt_ids, plan.n_predict, sampling=sampling,
                              stop_at_eos=not getattr(args, "ignore_eos", False), context=ctx,
                              on_prefill=prefill_progress(len(prompt_ids))):
        if t_first is None:
            t_first = time.perf_counter()
        n_new += 1
        emitted.append(int(token))
        if token not in hidden:
            out.write(detok.push(token))
        out.flush()
    out.write(detok.flush() + "\n")
    t_end = time.perf_counter()
    ctx.close()
    prompt_s = (t_first or t_end) - t0
    decode_s = t_end - (t_first or t_end)
    # the first new token comes out of the prompt pass; the rest are decode steps
    stats = {
        "prompt_tokens": len(prompt_ids),
        "prompt_tokens_per_s": len(prompt_ids) / prompt_s if prompt_s > 0 else 0.0,
        "decode_tokens": max(n_new - 1, 0),
        "decode_tokens_per_s": (n_new - 1) / decode_s if n_new > 1 and decode_s > 0 else 0.0,
        "tokens": emitted,
    }
    print(
        f"prompt: {stats['prompt_tokens']} tokens, {stats['prompt_tokens_per_s']:.1f} tokens/s | "
        f"decode: {stats['decode_tokens']} tokens, {stats['decode_tokens_per_s']:.1f} tokens/s",
        file=sys.stderr,
    )
    return stats


def cmd_run(args) -> int:
    from .model import Model

    if args.prompt_file is not None:
        try:
            prompt = Path(args.prompt_file).read_bytes().decode("utf-8")
        except OSError as exc:
            raise UsageError(f"--prompt-file {args.prompt_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--prompt-file {args.prompt_file}: not valid UTF-8") from None
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise UsageError("run needs a prompt: -p TEXT or -f FILE")
    if args.stats_json is not None:
        _check_writable("--stats-json", args.stats_json)
    speculative = args.draft is not None
    if not speculative:
        for flag, used in (("--specla", args.specla), ("--no-ddtree", args.no_ddtree),
                           ("--no-chain-seed", args.no_chain_seed), ("--ddtree-tau", args.ddtree_tau is not None),
                           ("--specla-top-k", args.specla_top_k is not None),
                           ("--ddtree-budget", args.ddtree_budget is not None),
                           ("--draft-max", args.draft_max is not None),
                           ("--draft-p-min", args.draft_p_min is not None),
                           ("--draft-vocab", args.draft_vocab is not None)):
            if used:
                raise UsageError(f"{flag} needs --draft (speculative decoding)")
    sampling = _sampling_params(args)
    model = Model.load(args.model, n_threads=args.threads, cpu_kernels=args.cpu_kernels, device=args.device)
    if args.chat:
        prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = model.tokenize(prompt)
    if not ids:
        raise UsageError("the prompt tokenizes to nothing; give a non-empty prompt")
    if speculative:
        _generate_speculative(model, ids, args, sampling)
    else:
        stats = _generate(model, ids, args, sampling)
        if args.stats_json:
            with open(args.stats_json, "w") as f:
                json.dump({"mode": "plain", "model": args.model, "seed": sampling.seed, **stats}, f)
    return 0


def _check_writable(flag: str, path: str) -> None:
    """Refuse before generating when the file could not be written afterwards."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory")
    if not os.path.isdir(directory):
        raise UsageError(f"{flag} {path}: directory {directory} does not exist")
    if not os.access(path if os.path.exists(path) else directory, os.W_OK):
        raise UsageError(f"{flag} {path}: not writable")


def _generate_speculative(model, prompt_ids, args, sampling, out=None):
    from .sampling import TokenSampler
    from .speculative.loop import generate
    from .tokenizer import StreamingDetokenizer

    out = out or sys.stdout
    plan = plan_run_context(model, len(prompt_ids), args)
    if args.ddtree_budget is not None and args.ddtree_budget > plan.n_ctx:
        raise UsageError(f"--ddtree-budget {args.ddtree_budget}: a tree cannot be larger than the context "
                         f"({plan.n_ctx} tokens)")
    n_ctx = plan.n_ctx + (args.ddtree_budget or DDTREE_BUDGET) + 64
    drafter = make_drafter(model, args.draft, prompt_ids, plan.n_predict, n_ctx, draft_max=args.draft_max,
                           draft_p_min=args.draft_p_min, draft_vocab=args.draft_vocab,
                           sampling=sampling) if args.draft else None
    config = spec_config_from_args(args, max_depth=getattr(drafter, "max_depth", 15), drafter=drafter)
    detok = StreamingDetokenizer(model.tokenizer)

    eos = set() if args.ignore_eos else model.tokenizer.eos_ids

    def show(tokens):
        for t in tokens:
            if t not in eos:  # the token that stops the run is not part of the text
                out.write(detok.push(t))
        out.flush()

    stats, ctx = generate(model, prompt_ids, plan.n_predict, config, drafter=drafter, eos_ids=eos, on_tokens=show,
                          n_ctx=plan.n_ctx, on_prefill=prefill_progress(len(prompt_ids)),
                          sampler=TokenSampler(sampling))
    ctx.close()
    if stats.cancelled:  # the loop stops cleanly on Ctrl-C; the run still ends as interrupted (130)
        raise KeyboardInterrupt
    out.write(detok.flush() + "\n")
    mode = config.mode + ("+specla" if config.specla and config.mode != "ar" else "")
    print(f"{mode}: {len(stats.tokens)} tokens, {stats.steps} steps, {stats.mean_accepted:.2f} accepted/step, "
          f"draft {stats.draft_ms:.0f} ms, verify {stats.verify_ms:.0f} ms, {stats.tokens_per_s:.1f} tokens/s",
          file=sys.stderr)
    if args.stats_json:
        record = stats.to_json()
        record.update(model=args.model, draft=args.draft, prompt_tokens=len(prompt_ids), config=vars(config),
                      seed=sampling.seed)
        with open(args.stats_json, "w") as f:
            json.dump(record, f)
    return stats


def _print_metadata(mf) -> None:
    print(f"file: {mf.path}")
    print(f"architecture: {mf.arch}")
    for key in sorted(mf.metadata):
        value = mf.metadata[key]
        if isinstance(value, list) and len(value) > 8:
            shown = f"[{', '.join(repr(v) for v in value[:4])}, ...] ({len(value)} items)"
        elif isinstance(value, str) and len(value) > 80:
            shown = repr(value[:77] + "...")
        else:
            shown = repr(value)
        if key == "general.file_type" and isinstance(value, int):
            shown += f" ({_file_type_name(value)})"
        print(f"  {key} = {shown}")


def _file_type_name(value: int) -> str:
    """llama.cpp's name of a general.file_type value (gguf's LlamaFileType, without MOSTLY_)."""
    import gguf

    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return "unknown file type"


def _print_tensors(mf) -> None:
    from .gguf_container import tensor_type_name

    print(f"{'tensor':40s} {'type':6s} {'shape (ne)':>22s} {'bytes':>14s}")
    total = 0
    for name, view in mf.tensors.items():
        total += view.nbytes
        print(f"{name:40s} {tensor_type_name(view.ggml_type):6s} {str(tuple(view.ne)):>22s} {view.nbytes:>14,d}")
    print(f"{len(mf.tensors)} tensors, {total / 2**20:.1f} MiB")


def cmd_inspect(args) -> int:
    from .loader.dflash import DRAFT_ARCHS, DraftFile, file_architecture
    from .loader.target import ModelFile

    if file_architecture(args.model) in DRAFT_ARCHS:
        df = DraftFile.open(args.model)
        _print_metadata(df)
        hp = df.hparams
        print(f"DFlash draft: {hp.n_layer} layers, block {hp.block_size}, mask token {hp.mask_token_id}, "
              f"reads target layers {list(hp.target_layer_ids)}")
        _print_tensors(df)
        return 0
    mf = ModelFile.open(args.model)
    hp = mf.hparams
    _print_metadata(mf)
    pattern = "".join("R" if r else "A" for r in hp.layer_is_recurrent)
    print(f"layers: {hp.n_layer} trunk ({pattern}; R = Gated DeltaNet, A = full attention)"
          + (f", {hp.nextn_predict_layers} MTP layer(s) ignored" if hp.nextn_predict_layers else ""))
    print(f"output: {'tied to token_embd' if mf.tied_output else 'own output.weight'}")
    _print_tensors(mf)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import cmd_demo  # writes synthetic models: pyspecla.testing, only here

            status = cmd_demo(args)
        elif args.command == "serve":
            from .server.run import cmd_serve  # (its dependencies are the optional extra `server`)

            status = cmd_serve(args)
        else:
            status = {"run": cmd_run, "inspect": cmd_inspect}[args.command](args)
        sys.stdout.flush()  # a reader that has gone shows here (below), not in the interpreter's exit
        return status
    except SpeclaError as exc:
        print(f"pyspecla: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\npyspecla: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # whoever read stdout has gone (`pyspecla inspect model.gguf | head`): stop as a process that
        # SIGPIPE ends would, and keep the interpreter's final flush from failing on the same pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
