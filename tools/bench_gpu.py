"""GPU benchmark of the target forward: decode tokens/s and the cost of a batch of N tokens (a
verify or a prefill chunk) in decode steps, at depth 0 and at a given depth, on one model file.
Writes one JSON row per figure (commit, device, model, mode, figures) and prints a table.

    python tools/bench_gpu.py --model 27b-q4_k_m-speed-only.gguf --out rows.jsonl

Method: times come from the host clock around calls that end with the one read-back a step needs
(argmax), after warm-up; each figure is the median of --reps repetitions. Decode is the plain path
(`Context.eval_argmax`, one token per call). A batch of N is one `specla_forward` of N tokens
continuing the sequence at the depth, then the context goes back to the depth
(`save_state` / `truncate`, not timed). Each batch runs twice before its timed repetitions: causal
batches are recorded steps on CUDA (docs/gpu-steps.md; SPECLA_CUDA_RECORDED_BATCHES=0 runs them
eagerly), so the second run records it and the timed ones replay it. The bandwidth figure divides
the bytes of every weight a token reads (all but the embedding table, of which it reads one row) by
the decode time, and its fraction is against a device-to-device copy measured in the same run
(bytes read + written).

--settings VAR=V1:V2:... runs every figure once per value of the environment variable VAR, which
the backend reads when a context opens (e.g. SPECLA_CUDA_UNFINISHED_MATMUL=0:1), in
--rounds interleaved rounds (V1, V2, ..., V1, V2, ...) with the model loaded once: an A/B of backend
settings without a model load per variant. Rows then carry `setting` and `round` (`round` alone
with --rounds above 1 and no --settings)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyspecla import Model  # noqa: E402


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def timed_context_size(parser: argparse.ArgumentParser, requested: int | None, needed: int, needs: str) -> int:
    """--n-ctx of the GPU benchmarks: the timed contexts' size, `needed` tokens (what `needs` take)
    when not given; a smaller one is a usage error naming the flag, before any model is loaded."""
    if requested is not None and requested < needed:
        parser.error(f"--n-ctx {requested} is smaller than the {needed} tokens {needs} need")
    return needed if requested is None else requested


def append_rows(path: str | None, rows: list[dict]) -> None:
    """One JSON object per line, appended (a device call's benchmarks share one rows file)."""
    if path:
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def copy_bandwidth_gbs() -> float | None:
    """Device-to-device copy of 4 GiB through PyTorch (if present): (bytes read + written) / time."""
    try:
        import torch
    except ImportError:
        return None
    n = 1 << 30
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    a.uniform_()
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 4 * n / statistics.median(times) / 1e9


def weight_bytes_per_token(model: Model) -> int:
    """Bytes of every weight one decoded token reads: all tensors but the embedding table."""
    total = 0
    for name, view in model.file.tensors.items():
        if name != "token_embd.weight":
            total += int(view.data.nbytes)
    if "output.weight" not in model.file.tensors:  # tied head: the embedding table is read as the head
        total += int(model.file.tensors["token_embd.weight"].data.nbytes)
    return total


def timed(fn, reps: int, reset=None) -> list[float]:
    """Seconds of each of reps calls of fn; reset(), when given, runs after each call, off the clock."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if reset:
            reset()
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="append JSON rows here")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,2,4,8,16,23,32,64")
    parser.add_argument("--depths", default="0,4096")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD here)")
    parser.add_argument("--settings", default=None, help="VAR=V1:V2:...: every figure once per value, interleaved")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the --settings values (default 1)")
    parser.add_argument("--n-ctx", type=int, default=None,
                        help="the timed context's size in tokens (default: what the depths and batches need); a "
                             "larger one shows what a user's -c costs a step at the same depth")
    args = parser.parse_args(argv)
    settings: list[tuple[str | None, str | None]] = [(None, None)]
    if args.settings is not None:
        var, sep, values = args.settings.partition("=")
        if not sep or not var or not values:
            parser.error(f"--settings takes VAR=V1:V2:..., got {args.settings!r}")
        settings = [(var, v) for v in values.split(":")]
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    batches = [int(b) for b in args.batches.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    n_ctx = timed_context_size(parser, args.n_ctx, max(depths) + max(batches) + args.decode_tokens + 16,
                               "the depths, batches and decode tokens")

    base = {"commit": args.commit or commit(), "device": device_name(), "model": os.path.basename(args.model),
            "backend": args.device, "n_ctx": n_ctx}
    try:
        from pyspecla.loader.target import ModelFile

        base["synthetic_mode"] = ModelFile.open(args.model).metadata.get("pyspecla.synthetic.mode")
    except Exception:  # noqa: BLE001 - a file without the key is simply not synthetic
        base["synthetic_mode"] = None
    rows = []
    tags: dict = {}  # the setting and round of the figures being measured

    def emit(mode: str, **figures):
        row = dict(base, **tags, mode=mode, **figures)
        rows.append(row)
        print(json.dumps(row), flush=True)

    copy_gbs = copy_bandwidth_gbs()
    if copy_gbs:
        emit("copy-bandwidth", gbs=round(copy_gbs, 1))

    from pyspecla.errors import SpeclaError

    t0 = time.perf_counter()
    try:
        model = Model.load(args.model, device=args.device)
    except (SpeclaError, OSError) as e:
        print(f"bench_gpu: {e}", file=sys.stderr)
        return 2
    probe = model.new_context(n_ctx=16)  # the backend a context resolves to (a GPU, or the CPU's fallback)
    emit("load", seconds=round(time.perf_counter() - t0, 2), ctx_device=probe.device)
    probe.close()
    bytes_per_token = weight_bytes_per_token(model)
    V = model.hparams.n_vocab

    # decode: one token per call, the plain path; a GPU replays the recorded step ("decode"), and
    # the same step run op by op is the "decode-eager" row (its launches are the step's kernels)
    def decode(context, mode):
        context.eval([1, 2, 3, 4])
        for t in range(8):
            context.eval_argmax([(t * 7919) % V])
        context.launch_counters()
        per_token = []
        for t in range(args.decode_tokens):
            t1 = time.perf_counter()
            context.eval_argmax([(t * 104729) % V])
            per_token.append(time.perf_counter() - t1)
        launches, waits, kernels = context.step_counters()
        step = statistics.median(per_token)
        emit(mode, depth=context.n_past, tokens=args.decode_tokens, ms_per_token=round(step * 1e3, 3),
             tokens_per_s=round(1 / step, 1), weight_gb=round(bytes_per_token / 1e9, 3),
             gbs=round(bytes_per_token / step / 1e9, 1),
             fraction_of_copy=round(bytes_per_token / step / 1e9 / copy_gbs, 3) if copy_gbs else None,
             launches_per_token=launches / args.decode_tokens if launches >= 0 else None,
             kernels_per_token=kernels / args.decode_tokens if kernels >= 0 else None,
             host_waits_per_token=waits / args.decode_tokens if waits >= 0 else None)

    def measure():
        """every figure once, in contexts opened now (under the current setting)"""
        ctx = model.new_context(n_ctx=n_ctx, max_batch=max(64, max(batches)))
        eager = model.new_context(n_ctx=256, max_batch=16, recorded_steps=False)
        decode(eager, "decode-eager")
        eager.close()
        decode(ctx, "decode")

        # batches of N at each depth, in decode steps measured at that depth
        for depth in depths:
            ctx.reset()
            fill = [(i * 7 + 3) % V for i in range(depth)]
            for i in range(0, len(fill), 64):
                ctx.eval(fill[i:i + 64])
            ctx.save_state()
            # the decode step alone: the truncate back to the depth is outside the timer, as for the
            # batches below (the rows up to 542b789 timed it inside, which flattered decode_steps ~5 %)
            back = lambda: ctx.truncate(depth)  # noqa: E731
            decode_at_depth = statistics.median(timed(lambda: ctx.eval_argmax([11]), args.reps, reset=back))
            for n in batches:
                tokens = [(depth + i * 31) % V for i in range(n)]
                for _ in range(2):  # warm-up; a context that records batches records it at the second run
                    ctx.eval_argmax(tokens)
                    ctx.truncate(depth)
                batch = statistics.median(timed(lambda: ctx.eval_argmax(tokens), args.reps, reset=back))
                emit("batch", depth=depth, n_tokens=n, ms=round(batch * 1e3, 3),
                     decode_ms_at_depth=round(decode_at_depth * 1e3, 3),
                     decode_steps=round(batch / decode_at_depth, 3))
        ctx.close()

    for rnd in range(args.rounds):
        for var, value in settings:
            if var is not None:
                os.environ[var] = value
                tags["setting"] = f"{var}={value}"
            if var is not None or args.rounds > 1:
                tags["round"] = rnd
            measure()
    model.close()

    append_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
