"""The server's text stages, piece by piece: stop strings and the thinking / tool-call parser give
the same result however the text is cut into pieces (pieces split markers and stop strings
anywhere), and hold back nothing at the end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import seeded_rng
from pyspecla.server.text import ChatOutputParser, StopStrings, parse_tool_call, prompt_opens_thinking


def random_cuts(text: str, rng) -> list[str]:
    """text cut at random places (some pieces empty)."""
    cuts = sorted(rng.integers(0, len(text) + 1, size=int(rng.integers(0, len(text) + 2))).tolist())
    edges = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])]


def run_stops(pieces, stops):
    f = StopStrings(stops)
    shown = "".join(f.push(p) for p in pieces) + f.flush()
    return shown, f.matched


@pytest.mark.parametrize("text,stops,shown,matched", [
    ("hello world. Bye", ["."], "hello world", "."),
    ("abc STOP def STOP", ["STOP"], "abc ", "STOP"),
    ("no match here", ["zzz"], "no match here", None),
    ("ends with a partial ST", ["STOP"], "ends with a partial ST", None),  # held back, then shown at the end
    ("first 'b' wins over 'a b'", ["b'", "a b"], "first '", "b'"),
    ("x>ab", [">a", ">"], "x", ">"),  # one position, two stop strings: the shorter
    (" bbab> ", ["a", "bab"], " b", "bab"),  # 'bab' starts before 'a', though 'a' ends first
    (" bba", ["a", "bab"], " bb", "a"),  # the partial 'ba' never completes: 'a' at the end
    ("x", [], "x", None),
])
def test_stop_strings(text, stops, shown, matched):
    assert run_stops([text], stops) == (shown, matched)


def test_stop_strings_are_found_however_the_text_is_cut():
    rng, _ = seeded_rng()
    alphabet = list("ab \n<>/")
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        stops = ["".join(rng.choice(alphabet, size=int(rng.integers(1, 4)))) for _ in range(int(rng.integers(1, 3)))]
        expected = run_stops([text], stops)
        # the one-piece result against the definition: the earliest occurrence of any stop string
        hits = [(text.find(s), len(s), s) for s in stops if s in text]
        if hits:
            at, _, first = min(hits)  # at one position the shortest: a stream sees it first
            assert expected == (text[:at], first)
        else:
            assert expected == (text, None)
        assert run_stops(random_cuts(text, rng), stops) == expected, (text, stops)


def run_parser(pieces, **kwargs):
    parser = ChatOutputParser(**kwargs)
    reasoning, content, calls = [], [], []
    for piece in pieces:
        for delta in parser.push(piece):
            reasoning.append(delta.reasoning)
            content.append(delta.content)
            if delta.tool_call:
                calls.append((delta.tool_call.name, json.loads(delta.tool_call.arguments)))
    for delta in parser.flush():
        reasoning.append(delta.reasoning)
        content.append(delta.content)
    return "".join(reasoning), "".join(content), calls


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
            "</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("text,kwargs,expected", [
    ("<think>\nhmm</think>\n\nHello", {}, ("\nhmm", "\n\nHello", [])),
    ("  <think>a</think>b", {}, ("a", "b", [])),
    ("Hello <think>not at the start</think>", {}, ("", "Hello <think>not at the start</think>", [])),
    ("<think>a</think>b", {"thinking": False}, ("", "<think>a</think>b", [])),
    ("plan</think>answer", {"in_thinking": True}, ("plan", "answer", [])),
    ("unfinished thought", {"in_thinking": True}, ("unfinished thought", "", [])),
    ("Sure. " + CALL, {"tools": True}, ("", "Sure. ", [("get_weather", {"city": "Paris", "days": 2})])),
    (XML_CALL, {"tools": True}, ("", "", [("get_weather", {"city": "Paris", "days": 2})])),
    (CALL, {"tools": False}, ("", CALL, [])),
    ("<tool_call>not json</tool_call>", {"tools": True}, ("", "<tool_call>not json</tool_call>", [])),
    ("text <tool_call>{\"name\": \"f\"", {"tools": True}, ("", "text <tool_call>{\"name\": \"f\"", [])),
    ("<think>x</think>" + CALL + CALL, {"tools": True},
     ("x", "", [("get_weather", {"city": "Paris", "days": 2})] * 2)),
])
def test_chat_output_parser(text, kwargs, expected):
    assert run_parser([text], **kwargs) == expected


def test_chat_output_parser_gives_the_same_split_however_the_text_is_cut():
    rng, _ = seeded_rng()
    parts = ["<think>", "</think>", CALL, XML_CALL, "<tool_call>", "</tool_call>", "a", " b", "\n", "<", "think"]
    for _ in range(300):
        text = "".join(rng.choice(parts, size=int(rng.integers(0, 8))))
        kwargs = {name: bool(rng.integers(2)) for name in ("thinking", "in_thinking", "tools")}
        expected = run_parser([text], **kwargs)
        got = run_parser(random_cuts(text, rng), **kwargs)
        assert got == expected, (text, kwargs)
        # nothing is lost: reasoning + content + calls account for the text (markers aside)
        assert len(expected[0]) + len(expected[1]) <= len(text)


def test_tool_call_bodies():
    assert parse_tool_call('{"name": "f", "arguments": "{\\"x\\": 1}"}').arguments == '{"x": 1}'
    assert parse_tool_call('{"name": "f"}').arguments == "{}"
    assert parse_tool_call('{"arguments": {}}') is None
    assert parse_tool_call('{"name": "f", "arguments": [1]}') is None
    assert parse_tool_call("<function=f>\n<parameter=s>\nsome text\n</parameter>\n</function>").arguments == \
        '{"s": "some text"}'


def test_a_prompt_left_inside_a_think_block_opens_the_reasoning():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    assert np.all([not prompt_opens_thinking(""), prompt_opens_thinking("</think><think>")])
