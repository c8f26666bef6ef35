#!/usr/bin/env python3
"""A bounded load test of `pyspecla serve` on loopback: N concurrent streaming clients for a fixed
time against a server this script starts (a subprocess), then three checks:

- no error: every request answered 200 (a 429 is retried after its Retry-After and counted);
- no leaked context: afterwards /metrics shows 0 active generations and 0 queued requests;
- exactness: every stream's tokens equal a solo run of the same request (same prompt, same seed),
  sent alone to the same server after the load phase.

and one JSON row per client count (commit, device, model, mode, clients, seconds, requests, p50/p99
time to first token, aggregate tokens/s) printed and appended to --out.

    python tools/load_test_server.py --clients 1 2 4 --seconds 20 --out results/server-load.jsonl
    python tools/load_test_server.py --model M.gguf --draft ngram --temperature 0.7 --parallel 2

Without --model a synthetic model is written to a temporary directory (tools/make_test_model.py's
presets, --preset). Requests go to /completion with return_tokens, n_predict --max-tokens,
prompts from a fixed list, seeds from --seed on."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_cpu import cpu_name, emit_rows, git_commit  # noqa: E402

PROMPTS = [
    "def greedy_decode(model, prompt_ids, max_new_tokens=32):\n",
    "The cache keeps the most recent entries and",
    "import numpy as np\n\ndef rms_norm(x, weight, eps=1e-6):\n",
    "class LRUCache:\n\tdef __init__(self, size: int) -> None:\n",
    "Once upon a time, in a small village by the sea,",
    "SELECT name, count(*) FROM orders GROUP BY",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, model_path: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "pyspecla", "serve", model_path, "--port", str(port), "--parallel",
               str(args.parallel), "--queue", str(args.queue), "-t", str(args.threads), "--log-level", "warning"]
    if args.draft:
        command += ["--draft", args.draft]
    if args.specla:
        command.append("--specla")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def wait_healthy(client, url: str, server: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode}:\n{server.stderr.read()}")
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"the server did not come up within {timeout_s:.0f} s")


def request_body(args, i: int) -> dict:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "n_predict": args.max_tokens, "temperature": args.temperature,
            "seed": args.seed + i, "stream": True, "return_tokens": True}


async def one_stream(client, url: str, body: dict) -> dict:
    """One streaming /completion: its tokens, time to first token, 429 retries."""
    retries = 0
    while True:
        t0 = time.perf_counter()
        ttft, tokens = None, []
        async with client.stream("POST", url + "/completion", json=body) as response:
            if response.status_code == 429:
                retries += 1
                await response.aread()
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"}
            final = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                item = json.loads(line[len("data: "):])
                if "error" in item:
                    return {"error": item["error"]}
                if item.get("tokens") and ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += item.get("tokens", [])
                if item.get("stop"):
                    final = item
            if final is None:
                return {"error": "the stream ended without its final item"}
            return {"tokens": tokens, "ttft_s": ttft, "elapsed_s": time.perf_counter() - t0, "retries": retries}


async def client_loop(client, url: str, args, index: int, stop_at: float, results: list) -> None:
    k = 0
    while time.monotonic() < stop_at:
        i = index * 1000 + k  # a distinct request (prompt, seed) per client and turn
        k += 1
        result = await one_stream(client, url, request_body(args, i))
        result["request"] = i
        results.append(result)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def metrics(client, url: str) -> dict[str, float]:
    text = (await client.get(url + "/metrics")).text
    return {name: float(value) for name, value in (line.split() for line in text.splitlines()
                                                   if line and not line.startswith("#"))}


async def run(args, model_path: str) -> list[dict]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, model_path, port)
    rows = []
    try:
        limits = httpx.Limits(max_connections=max(args.clients) + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
            await wait_healthy(client, url, server)
            await one_stream(client, url, request_body(args, 10**6))  # warm-up (first-use costs), not counted
            for n_clients in args.clients:
                results: list[dict] = []
                load_before = os.getloadavg()[0]
                t0 = time.monotonic()
                stop_at = t0 + args.seconds
                await asyncio.gather(*(client_loop(client, url, args, c, stop_at, results) for c in range(n_clients)))
                wall = time.monotonic() - t0
                errors = [r["error"] for r in results if "error" in r]
                after = await metrics(client, url)
                leaked = int(after["pyspecla_active_generations"] + after["pyspecla_queue_depth"])
                # exactness: each request alone, same prompt and seed
                mismatches = 0
                for r in results:
                    if "error" in r:
                        continue
                    solo = await one_stream(client, url, request_body(args, r["request"]))
                    mismatches += solo.get("tokens") != r["tokens"]
                ok = [r for r in results if "error" not in r]
                ttfts = [r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]
                n_tokens = sum(len(r["tokens"]) for r in ok)
                row = {
                    "commit": git_commit(), "device": f"cpu: {cpu_name()} ({os.cpu_count()} cores)",
                    "model": os.path.basename(model_path), "mode": args.draft or "plain",
                    "specla": args.specla, "temperature": args.temperature, "threads": args.threads,
                    "parallel": args.parallel, "clients": n_clients, "seconds": round(wall, 2),
                    "requests": len(results), "max_tokens": args.max_tokens, "errors": len(errors),
                    "retries_429": sum(r.get("retries", 0) for r in ok), "leaked": leaked,
                    "exact": mismatches == 0 and not errors, "mismatches": mismatches,
                    "p50_ttft_ms": round(statistics.median(ttfts), 1) if ttfts else None,
                    "p99_ttft_ms": round(percentile(ttfts, 0.99), 1) if ttfts else None,
                    "tokens_per_s": round(n_tokens / wall, 2),
                    # the machine's 1-minute load average before and after the load phase (a shared
                    # machine: figures taken under other people's load say so here)
                    "loadavg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                }
                rows.append(row)
                emit_rows([row], args.out)
                if errors:
                    print(f"errors: {errors[:3]}", file=sys.stderr)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF to serve (default: a synthetic --preset model)")
    parser.add_argument("--preset", default="tiny", help="synthetic model preset when --model is not given")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4], help="concurrent clients (one row each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="load phase per client count (default 20)")
    parser.add_argument("--max-tokens", type=int, default=32, help="n_predict of each request (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first request (each has its own)")
    parser.add_argument("--parallel", type=int, default=1, help="the server's --parallel (default 1)")
    parser.add_argument("--queue", type=int, default=16, help="the server's --queue (default 16)")
    parser.add_argument("--draft", default=None, help="the server's --draft (e.g. ngram)")
    parser.add_argument("--specla", action="store_true", help="the server's --specla")
    parser.add_argument("-t", "--threads", type=int, default=0, help="the server's CPU threads (default 0: all)")
    parser.add_argument("--out", default=None, help="append the JSON rows to this file")
    args = parser.parse_args(argv)
    if min(args.clients) < 1 or args.seconds <= 0 or args.max_tokens < 1:
        parser.error("--clients, --seconds and --max-tokens must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if model_path is None:
            from pyspecla.testing.models import write_test_model

            model_path = os.path.join(tmp, f"{args.preset}-f32-0.gguf")
            write_test_model(model_path, preset=args.preset, quant="f32", seed=0)
        rows = asyncio.run(run(args, model_path))
    bad = [r for r in rows if r["errors"] or r["leaked"] or not r["exact"]]
    if bad:
        print(f"FAILED: {len(bad)} row(s) with errors, leaked contexts or inexact streams", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
