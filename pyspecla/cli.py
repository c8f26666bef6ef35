"""`pyspecla run | inspect | demo`: the command-line surface.

Every user error (bad file, bad flag value) ends as one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .errors import SpeclaError, UsageError


def _positive_int(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects an integer, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be positive, got {value}")
        return value

    return parse


def _non_negative_float(flag):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects a number, got {text!r}") from None
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be >= 0, got {text}")
        return value

    return parse


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument(
        "--cpu-kernels",
        choices=["auto", "scalar", "avx2"],
        default="auto",
        help="CPU kernel set: auto (fastest this CPU supports), scalar (the reference), avx2",
    )
    p.add_argument("-c", "--ctx-size", type=_positive_int("--ctx-size"), default=None,
                   help="context length in tokens (default: prompt + new tokens)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyspecla", description="Exact speculative decoding for qwen35 GGUF models.")
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
    run.add_argument("--temp", type=_non_negative_float("--temp"), default=0.0,
                     help="sampling temperature; 0 = greedy (default)")
    run.add_argument("--seed", type=int, default=None, help="sampling seed (with --temp > 0)")
    run.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    _add_runtime_flags(run)

    inspect = sub.add_parser("inspect", help="print a GGUF's metadata, layer pattern and tensors")
    inspect.add_argument("model", help="path of a GGUF file")

    demo = sub.add_parser("demo", help="build a small synthetic model (cached) and generate from it")
    demo.add_argument("--cache-dir", default=None,
                      help="where the demo model is kept (default: $XDG_CACHE_HOME/pyspecla or ~/.cache/pyspecla)")
    demo.add_argument("-n", "--n-predict", type=_positive_int("-n/--n-predict"), default=48,
                      help="tokens to generate (default 48)")
    _add_runtime_flags(demo)
    return parser


def _generate(model, prompt_ids, args, out=None) -> dict:
    from .tokenizer import StreamingDetokenizer

    out = out or sys.stdout

    ctx = model.new_context(n_ctx=args.ctx_size or (len(prompt_ids) + args.n_predict + 1))
    detok = StreamingDetokenizer(model.tokenizer)
    t0 = time.perf_counter()
    t_first = None
    n_new = 0
    for token in model.stream(prompt_ids, args.n_predict, temperature=getattr(args, "temp", 0.0),
                              seed=getattr(args, "seed", None),
                              stop_at_eos=not getattr(args, "ignore_eos", False), context=ctx):
        if t_first is None:
            t_first = time.perf_counter()
        n_new += 1
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
    model = Model.load(args.model, n_threads=args.threads, cpu_kernels=args.cpu_kernels)
    if args.chat:
        prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = model.tokenize(prompt)
    if not ids:
        raise UsageError("the prompt tokenizes to nothing; give a non-empty prompt")
    _generate(model, ids, args)
    return 0


def cmd_inspect(args) -> int:
    from .gguf_model import ModelFile, tensor_type_name

    mf = ModelFile.open(args.model)
    hp = mf.hparams
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
        print(f"  {key} = {shown}")
    pattern = "".join("R" if r else "A" for r in hp.layer_is_recurrent)
    print(f"layers: {hp.n_layer} trunk ({pattern}; R = Gated DeltaNet, A = full attention)"
          + (f", {hp.nextn_predict_layers} MTP layer(s) ignored" if hp.nextn_predict_layers else ""))
    print(f"output: {'tied to token_embd' if mf.tied_output else 'own output.weight'}")
    print(f"{'tensor':40s} {'type':6s} {'shape (ne)':>22s} {'bytes':>14s}")
    total = 0
    for name, view in mf.tensors.items():
        total += view.nbytes
        print(f"{name:40s} {tensor_type_name(view.ggml_type):6s} {str(tuple(view.ne)):>22s} {view.nbytes:>14,d}")
    print(f"{len(mf.tensors)} tensors, {total / 2**20:.1f} MiB")
    return 0


def demo_model_path(cache_dir: str | None) -> Path:
    base = Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyspecla"
    return base / "demo-tiny-q8_0-seed1.gguf"


def cmd_demo(args) -> int:
    from .model import Model
    from .testmodels import write_test_model

    path = demo_model_path(args.cache_dir)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        print(f"building the demo model (synthetic weights, once): {path}", file=sys.stderr)
        write_test_model(str(tmp), preset="tiny", quant="q8_0", seed=1)
        tmp.replace(path)
    model = Model.load(str(path), n_threads=args.threads, cpu_kernels=args.cpu_kernels)
    prompt = "def fibonacci(n):\n"
    print(f"model: {path.name} (random weights: the text is noise, the machinery is real)", file=sys.stderr)
    ids = model.tokenize(prompt)
    sys.stdout.write(prompt)
    args.temp, args.seed, args.ignore_eos = 0.0, None, True
    _generate(model, ids, args)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return {"run": cmd_run, "inspect": cmd_inspect, "demo": cmd_demo}[args.command](args)
    except SpeclaError as exc:
        print(f"pyspecla: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\npyspecla: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
