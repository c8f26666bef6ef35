"""One request's generation as text: tokens from the engine → UTF-8-safe text pieces → stop strings.
Shared by every endpoint (OpenAI, llama-server, Anthropic), which only format what comes out.

The end-of-generation token that stops a run is not part of the text; control tokens
(<|im_end|>, ...) are not rendered, as llama-server renders them. When a stop string shows up the
generation is cancelled at once (finish "stop"); the text from the stop string on is never shown.
A client that goes away cancels the generation too (watch_disconnect)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from ..errors import UsageError
from ..tokenizer import StreamingDetokenizer
from .engine import Engine, GenerationRequest
from .errors import APIError
from .text import StopStrings


@dataclass
class Piece:
    text: str
    tokens: list = field(default_factory=list)  # the GeneratedToken objects consumed for it


class TextGeneration:
    """Iterate `pieces()`; afterwards finish_reason ("stop" / "length" / "cancelled"), stop_word,
    n_generated (tokens used, up to the stop string), stats and error are set."""

    def __init__(self, engine: Engine, request: GenerationRequest, stop=(), timeout_s: float | None = None):
        self.engine = engine
        self.request = request
        self.tokenizer = engine.model.tokenizer
        self._stops = StopStrings(stop)
        self._detok = StreamingDetokenizer(self.tokenizer, skip_special=True)
        self._hidden = self.tokenizer.eos_ids if request.stop_at_eos else set()
        self.job = engine.submit(request)  # raises QueueFull
        self.finish_reason: str | None = None
        self.stop_word: str | None = None
        self.n_generated = 0
        self.tokens: list[int] = []
        self.stats: dict = {}
        self.error: Exception | None = None

    @property
    def n_prompt(self) -> int:
        return len(self.request.prompt_ids)

    def cancel(self) -> None:
        self.job.cancel()

    def failure(self) -> APIError | None:
        """After pieces(): the error of a generation that failed in the engine (a usage error is
        the client's: 400; anything else, a native failure included, is the server's: 500), else
        None."""
        if self.error is None:
            return None
        status = 400 if isinstance(self.error, UsageError) else 500
        return APIError(status, f"generation failed: {self.error}", code="generation_failed")

    async def pieces(self):
        try:
            async for token in self.job.events():
                if self._stops.matched is not None:
                    continue  # cancelled: tokens already under way
                self.n_generated += 1
                self.tokens.append(int(token.id))
                text = "" if token.id in self._hidden else self._detok.push(token.id)
                shown = self._stops.push(text)
                if self._stops.matched is not None:
                    self.job.cancel()
                    self.stop_word = self._stops.matched
                if shown or token.id in self._hidden or self._stops.matched is not None:
                    yield Piece(shown, [token])
                else:
                    yield Piece("", [token])
            tail = self._stops.push(self._detok.flush()) if self._stops.matched is None else ""
            tail += self._stops.flush()
            if self._stops.matched is not None:  # a stop string settled by the end of generation
                self.stop_word = self._stops.matched
            if tail:
                yield Piece(tail)
            end = self.job.end
            self.stats = end.stats
            self.error = end.error
            if self._stops.matched is not None:
                self.finish_reason = "stop"
            else:
                self.finish_reason = end.finish_reason
        finally:
            if self.job.end is None:  # the consumer went away before the end
                self.job.cancel()


@contextlib.asynccontextmanager
async def watch_disconnect(request, generation: TextGeneration, interval_s: float = 0.05):
    """Cancel the generation when the HTTP client disconnects (polled: the handler of a
    non-streaming request is not told otherwise)."""

    async def watch():
        while True:
            if await request.is_disconnected():
                generation.cancel()
                return
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if generation.job.end is None:
            generation.cancel()


async def collect(request, generation: TextGeneration) -> tuple[str, list]:
    """A non-streaming answer: the whole text and its tokens, the generation cancelled if the client
    goes away first; a failed generation raises its error (rendered by the app)."""
    texts, tokens = [], []
    async with watch_disconnect(request, generation):
        async for piece in generation.pieces():
            texts.append(piece.text)
            tokens += piece.tokens
    if generation.failure() is not None:
        raise generation.failure()
    return "".join(texts), tokens
