"""Helpers of the server tests: a uvicorn server on 127.0.0.1 in a thread on a free port, a model
wrapper that counts the native contexts still open, and a scripted model that says a given text
(to make a test model produce a tool call or a thinking block, which random weights never do)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="the server's dependencies are not installed: pip install 'pyspecla[server]'")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

import uvicorn  # noqa: E402

from pyspecla import Model  # noqa: E402
from pyspecla.server.app import create_app  # noqa: E402


def module_fixtures(**server_kwargs):
    """The `model` (the tiny F32 test model) and `server` (a RunningServer over it, with
    server_kwargs) fixtures of one server test module, each made once per module:
        model, server = module_fixtures(n_ctx=512)"""

    @pytest.fixture(scope="module")
    def model(tiny_model_path):
        return Model.load(tiny_model_path("f32"))

    @pytest.fixture(scope="module")
    def server(model):
        with RunningServer(model, **server_kwargs) as running:
            yield running

    return model, server


class RunningServer:
    """create_app(model, **options) served by uvicorn in a daemon thread; `url` once started."""

    def __init__(self, model, **options):
        options.setdefault("n_ctx", 1024)
        self.app = create_app(model, **options)
        self.engine = self.app.state.server.engine
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def wait_idle(self, timeout_s: float = 10.0) -> float:
        """Seconds until no generation is active or waiting; fails after timeout_s."""
        t0 = time.monotonic()
        while self.engine.n_active or self.engine.n_waiting:
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"the engine is still busy after {timeout_s} s: {self.engine.n_active} active, "
                                     f"{self.engine.n_waiting} waiting")
            time.sleep(0.01)
        return time.monotonic() - t0

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ContextCounter:
    """Wraps model.new_context (on this instance) to count the contexts made and those still open."""

    def __init__(self, model):
        self.model = model
        self.contexts = []
        original = model.new_context

        def new_context(*args, **kwargs):
            ctx = original(*args, **kwargs)
            self.contexts.append(ctx)
            return ctx

        model.new_context = new_context
        self._original = original

    @property
    def open(self) -> int:
        return sum(1 for ctx in self.contexts if getattr(ctx, "_handle", None))

    def restore(self) -> None:
        del self.model.new_context


@dataclass
class ScriptedToken:
    id: int
    logprob: float | None = None
    top_logprobs: list | None = None


class ScriptedGeneration:
    """The Generation interface over a fixed token list (then the end-of-generation token)."""

    def __init__(self, tokens, eos: int, max_tokens: int, stop_at_eos: bool):
        self._tokens = list(tokens) + ([eos] if stop_at_eos else [])
        self._eos = eos if stop_at_eos else None
        self._max = max_tokens
        self._i = 0
        self._cancelled = threading.Event()
        self.finish_reason = None
        self.stats = {"steps": 0, "tokens": 0, "accepted_per_step": [], "prefill_ms": 0.0, "decode_ms": 0.0}

    def cancel(self):
        self._cancelled.set()

    def __iter__(self):
        return self

    def __next__(self):
        if self.finish_reason is not None:
            raise StopIteration
        if self._cancelled.is_set():
            self.finish_reason = "cancelled"
            raise StopIteration
        if self._i >= self._max:
            self.finish_reason = "length"
            raise StopIteration
        if self._i >= len(self._tokens):
            self.finish_reason = "stop"
            raise StopIteration
        token = self._tokens[self._i]
        self._i += 1
        self.stats["tokens"] = self._i
        if token == self._eos:
            self.finish_reason = "stop"
        return ScriptedToken(token, -0.5, None)


class ScriptedModel:
    """A real model's tokenizer, vocabulary and chat template, whose generation says `text` (set per
    test) whatever the prompt; it records the prompts it was given."""

    def __init__(self, model, text: str = ""):
        self._model = model
        self.text = text
        self.prompts: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self._model, name)

    def generation(self, prompt_ids, max_tokens, sampling=None, draft=None, stop_at_eos=True, logprobs=0, **options):
        self.prompts.append(list(prompt_ids))
        tokenizer = self._model.tokenizer
        return ScriptedGeneration(tokenizer.encode(self.text), tokenizer.eos_id, max_tokens, stop_at_eos)
