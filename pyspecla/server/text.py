"""From generated text pieces to what a client is shown: stop strings, and for chat, the model's
thinking (`<think>...</think>`) and tool calls (`<tool_call>...</tool_call>`) split out of the
visible content. Both work on a stream of pieces and hold back only the tail that may still turn
into a stop string or a marker, so a stop string or tag split over two tokens is caught."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field


def _held_back(text: str, needles) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of the needles."""
    longest = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), longest, -1):
            if text.endswith(needle[:n]):
                longest = n
                break
    return longest


class StopStrings:
    """push(piece) -> the text that is safe to show; `matched` is the stop string once one appears
    (the text from it on is never shown). flush() -> the held-back tail at the end of generation."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.matched: str | None = None

    def _earliest(self, text: str):
        """(position, stop) of the earliest match in text; at one position the shortest (a stream
        sees it first); None without one."""
        first = None
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0 and (first is None or (at, len(stop)) < (first[0], len(first[1]))):
                first = (at, stop)
        return first

    def push(self, piece: str) -> str:
        if self.matched is not None:
            return ""
        text = self._pending + piece
        if not self.stops:
            return text
        first = self._earliest(text)
        # the tail that may still become a stop string; when it starts before a complete match,
        # a longer stop string may yet complete there, earlier ('ba' of 'bab' before the 'a' of
        # ' bba'): hold back from it and decide with more text, or at flush()
        keep = _held_back(text, self.stops)
        if first is not None and len(text) - keep >= first[0]:
            self.matched = first[1]
            self._pending = ""
            return text[: first[0]]
        self._pending = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back tail at the end of generation: cut at a stop string it holds (one whose
        match waited on an earlier partial one), else shown whole."""
        text, self._pending = self._pending, ""
        if self.matched is not None:
            return ""
        first = self._earliest(text) if self.stops else None
        if first is not None:
            self.matched = first[1]
            return text[: first[0]]
        return text


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


def prompt_opens_thinking(prompt: str) -> bool:
    """A template that ends the prompt inside an open <think> block (Qwen3.5 with thinking on)
    makes the model's first words its reasoning."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's function.arguments)
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)


def parse_tool_call(body: str) -> ToolCall | None:
    """The inside of <tool_call>...</tool_call>: Qwen's JSON {"name": ..., "arguments": {...}} or
    the XML-ish form <function=NAME><parameter=KEY>VALUE</parameter>...</function>. None when it is
    neither (the text is then shown as it is)."""
    text = body.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))
    match = _FUNCTION.fullmatch(text)
    if match is None:
        return None
    arguments = {}
    for key, raw in _PARAMETER.findall(match.group(2)):
        try:
            arguments[key] = json.loads(raw)
        except ValueError:
            arguments[key] = raw
    return ToolCall(match.group(1), json.dumps(arguments, ensure_ascii=False))


@dataclass
class ChatDelta:
    """One step of chat output: any of reasoning text, content text, a finished tool call."""

    reasoning: str = ""
    content: str = ""
    tool_call: ToolCall | None = None


class ChatOutputParser:
    """Splits chat output into reasoning, content and tool calls, piece by piece.

    Reasoning: with `thinking` on, output inside <think>...</think> is reasoning; the block counts
    only at the start of the output (leading whitespace aside) or when the prompt left it open
    (`in_thinking`). Tool calls (with `tools` on): each <tool_call>...</tool_call> block in the
    content becomes a ToolCall when its body parses (else it is shown as text)."""

    def __init__(self, thinking: bool = True, in_thinking: bool = False, tools: bool = False):
        self.thinking = thinking
        self.tools = tools
        self._state = "reasoning" if (thinking and in_thinking) else ("start" if thinking else "content")
        self._pending = ""
        self.tool_calls: list[ToolCall] = []

    def _markers(self) -> list[str]:
        if self._state == "start":
            return [THINK_OPEN] + ([TOOL_OPEN] if self.tools else [])
        if self._state == "reasoning":
            return [THINK_CLOSE]
        if self._state == "tool":
            return [TOOL_CLOSE]
        return [TOOL_OPEN] if self.tools else []

    def push(self, piece: str) -> list[ChatDelta]:
        self._pending += piece
        out: list[ChatDelta] = []
        while True:
            text = self._pending
            if self._state == "start":
                stripped = text.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._pending = stripped[len(THINK_OPEN):]
                    self._state = "reasoning"
                    continue
                if not stripped or THINK_OPEN.startswith(stripped):
                    return out  # may still become <think>
                self._state = "content"
                continue
            if self._state == "tool":
                end = text.find(TOOL_CLOSE)
                if end < 0:
                    return out
                body, self._pending = text[:end], text[end + len(TOOL_CLOSE):]
                self._state = "content"
                call = parse_tool_call(body)
                if call is None:
                    out.append(ChatDelta(content=TOOL_OPEN + body + TOOL_CLOSE))
                else:
                    self.tool_calls.append(call)
                    out.append(ChatDelta(tool_call=call))
                continue
            marker = THINK_CLOSE if self._state == "reasoning" else (TOOL_OPEN if self.tools else None)
            at = text.find(marker) if marker else -1
            if at >= 0:
                before, self._pending = text[:at], text[at + len(marker):]
                if before:
                    out.append(self._delta(before))
                self._state = "content" if self._state == "reasoning" else "tool"
                continue
            keep = _held_back(text, self._markers())
            shown, self._pending = text[: len(text) - keep], text[len(text) - keep:]
            if shown:
                out.append(self._delta(shown))
            return out

    def _delta(self, text: str) -> ChatDelta:
        return ChatDelta(reasoning=text) if self._state == "reasoning" else ChatDelta(content=text)

    def flush(self) -> list[ChatDelta]:
        """End of output: whatever is held back is shown as it is (an unfinished tool call too)."""
        text, self._pending = self._pending, ""
        if not text:
            return []
        if self._state == "tool":
            return [ChatDelta(content=TOOL_OPEN + text)]
        if self._state == "reasoning":
            return [ChatDelta(reasoning=text)]
        return [ChatDelta(content=text)]
