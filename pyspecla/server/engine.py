"""The engine: one model, one worker thread that owns it, a bounded FIFO of requests.

HTTP handlers (asyncio) never touch the model's native state. They submit a GenerationJob; the
worker admits jobs from the FIFO into at most `parallel` slots (one live generation, i.e. one native
context, each) and serves the slots in turn, one step of each. Every token goes back to the job's
asyncio queue through the event loop's call_soon_threadsafe. A full FIFO refuses the submission
at once (QueueFull: the HTTP layer answers 429 with Retry-After) instead of letting it wait.

Cancellation (a client gone, a stop string found): job.cancel() from the event loop sets a flag
and cancels the live generation (thread-safe: Generation.cancel() is read between prefill chunks
and between steps). The worker sees the flag before the job's next step, lets the generation free
its context and drops the job from its slot; a job still in the FIFO is dropped when it comes up.
A generation that raises ends its job with an error event; the worker carries on."""

from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass, field

from ..errors import SpeclaError


class QueueFull(Exception):
    """The FIFO holds `queue_size` waiting requests already."""


@dataclass
class GenerationRequest:
    """What a job generates: the model's generation() arguments."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: object = None        # a pyspecla.sampling.SamplingParams
    stop_at_eos: bool = True
    logprobs: int = 0              # the top alternatives each token lists
    token_logprobs: bool = False   # each token's own log-probability (also when greedy)


@dataclass
class JobEnd:
    finish_reason: str             # "stop" / "length" / "cancelled" / "error"
    stats: dict = field(default_factory=dict)
    error: Exception | None = None


class GenerationJob:
    """One request in the engine. The HTTP side reads `events()` (GeneratedToken objects, then the
    JobEnd in `self.end`) and may call cancel() at any time, from the event loop."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self._generation = None
        self._draft = None  # the draft of the slot serving it
        self.end: JobEnd | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        generation = self._generation
        if generation is not None:
            generation.cancel()

    # --- worker side -----------------------------------------------------------------------
    def _post(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shutting down): nobody listens
            pass

    # --- HTTP side ---------------------------------------------------------------------------
    async def events(self):
        """The generated tokens, in order; afterwards `self.end` says how it ended."""
        while True:
            item = await self._events.get()
            if isinstance(item, JobEnd):
                self.end = item
                return
            yield item


class Engine:
    """Owns `model` and the worker thread. `draft` / `speculative_options` apply to every request
    (the server's --draft / --specla). A draft language model (a GGUF path) is loaded once per slot
    here, with a context of n_ctx tokens plus its drafting depth, and reused by the requests that
    slot serves (loading it costs ~1.6 s for a 0.5B Q4_K_M file on 2 CPU cores); any other draft
    (ngram, a DFlash draft) is handed to each request as given."""

    def __init__(self, model, parallel: int = 1, queue_size: int = 16, draft=None, speculative_options=None,
                 n_ctx: int = 4096):
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {queue_size}")
        self.model = model
        self.parallel = parallel
        self.queue_size = queue_size
        self.draft = draft
        self._free_drafts = [slot_draft(model, draft, n_ctx) for _ in range(parallel)]
        self.speculative_options = dict(speculative_options or {})
        self._lock = threading.Condition()
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._active: list[GenerationJob] = []
        self._closing = False
        self.metrics = EngineMetrics()
        self._thread = threading.Thread(target=self._run, name="pyspecla-engine", daemon=True)
        self._thread.start()

    # --- public ------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> GenerationJob:
        """Queue a job (from the event loop). Raises QueueFull when the FIFO is full."""
        job = GenerationJob(request, asyncio.get_running_loop())
        with self._lock:
            if self._closing:
                raise QueueFull("the server is shutting down")
            # (waiting jobs include those the worker has not yet moved into a free slot)
            if len(self._active) + len(self._waiting) >= self.parallel + self.queue_size:
                self.metrics.requests_rejected += 1
                raise QueueFull(f"{len(self._active)} requests running and {len(self._waiting)} waiting "
                                f"(--parallel {self.parallel}, --queue {self.queue_size})")
            self._waiting.append(job)
            self.metrics.requests_total += 1
            self._lock.notify()
        return job

    @property
    def n_active(self) -> int:
        """Live generations (each holds a native context)."""
        return len(self._active)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel everything and stop the worker."""
        with self._lock:
            self._closing = True
            jobs = list(self._waiting) + list(self._active)
            self._lock.notify()
        for job in jobs:
            job.cancel()
        self._thread.join(timeout)

    # --- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._waiting and not self._active:
                    self._lock.wait()
                if self._closing and not self._active:
                    for job in self._waiting:
                        job._post(JobEnd("cancelled"))
                    self._waiting.clear()
                    return
                while self._waiting and len(self._active) < self.parallel:
                    job = self._waiting.popleft()
                    if job.cancelled:
                        self.metrics.requests_cancelled += 1
                        job._post(JobEnd("cancelled"))
                        continue
                    job._draft = self._free_drafts.pop()
                    self._active.append(job)
                active = list(self._active)
            for job in active:  # one step of each slot in turn
                end = self._step(job)
                if end is not None:
                    with self._lock:  # (the slot is free before the client hears of the end)
                        self._active.remove(job)
                        self._free_drafts.append(job._draft)
                    job._post(end)

    def _step(self, job: GenerationJob) -> JobEnd | None:
        """Advance job by one token; its JobEnd when it is over (its generation has then let go
        of its context)."""
        try:
            generation = job._generation
            if generation is None:
                r = job.request
                generation = self.model.generation(r.prompt_ids, r.max_tokens, sampling=r.sampling, draft=job._draft,
                                                   stop_at_eos=r.stop_at_eos, logprobs=r.logprobs,
                                                   token_logprobs=r.token_logprobs, **self.speculative_options)
                job._generation = generation
                self.metrics.prompt_tokens += len(r.prompt_ids)
            if job.cancelled:
                generation.cancel()
            token = next(generation, None)
        except Exception as exc:  # noqa: BLE001 - the worker must outlive any one request
            generation = job._generation
            if generation is not None:
                generation.cancel()
                next(generation, None)  # (lets it free its context)
            self.metrics.requests_failed += 1
            return JobEnd("error", error=exc if isinstance(exc, SpeclaError) else RuntimeError(repr(exc)))
        if token is not None:
            self.metrics.tokens_generated += 1
            job._post(token)
            return None
        reason = generation.finish_reason or "stop"
        stats = dict(getattr(generation, "stats", {}) or {})
        if job.cancelled or reason == "cancelled":
            reason = "cancelled"
            self.metrics.requests_cancelled += 1
        self.metrics.add_generation(stats)
        return JobEnd(reason, stats)


def slot_draft(model, draft, n_ctx: int):
    """What one slot passes as `draft`: a loaded drafter for a draft language model's path (so it
    is loaded once, not per request), else `draft` unchanged."""
    import os

    if not isinstance(draft, (str, os.PathLike)) or not os.path.isfile(draft):
        return draft
    from ..arch import TARGET_ARCHS
    from ..loader.dflash import file_architecture

    if file_architecture(draft) not in TARGET_ARCHS:
        return draft  # a DFlash draft: its drafter follows one target context, made per request
    from ..speculative.factory import make_drafter

    return make_drafter(model, os.fspath(draft), [], n_ctx, n_ctx)


@dataclass
class EngineMetrics:
    """Counters since the server started (read by /metrics and /props)."""

    requests_total: int = 0
    requests_rejected: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    decode_tokens: int = 0        # tokens after each generation's first (which comes out of the prefill)
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0
    steps: int = 0
    accepted_tokens: int = 0      # sum of accepted_per_step over the finished generations

    def add_generation(self, stats: dict) -> None:
        tokens = int(stats.get("tokens", 0) or 0)
        self.decode_tokens += max(tokens - 1, 0)
        self.decode_seconds += float(stats.get("decode_ms", 0.0) or 0.0) / 1e3
        self.prefill_seconds += float(stats.get("prefill_ms", 0.0) or 0.0) / 1e3
        accepted = stats.get("accepted_per_step") or []
        self.steps += len(accepted)
        self.accepted_tokens += int(sum(accepted))
