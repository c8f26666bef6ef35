"""Checks on real model files fetched by tools/fetch_models.py (never in CI: these tests skip
when the cache is absent). Today: the real Qwen2.5 vocabulary (151,936 tokens, pre `qwen2`)
tokenizes exactly like llama.cpp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PYSPECLA_MODELS", Path.home() / ".cache" / "pyspecla" / "models"))
DRAFT = CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

pytestmark = pytest.mark.skipif(not DRAFT.exists(), reason=f"{DRAFT} absent (python tools/fetch_models.py qwen2.5-coder)")

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    'from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    """ Check if in given list of numbers, are any two numbers closer to each other than\n    given threshold.\n    """\n',
    "你好，世界！こんにちは、元気ですか？",
    "emoji 👩‍👩‍👧‍👦 🇫🇷 👍🏽",
    "e\u0301 Việt Nam नमस्ते café naïve",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "   spaces\t\ttabs\r\n\r\nnewlines 1234567890 3.14159 ",
    "",
]


def test_real_qwen2_vocabulary_tokenizes_like_llama_cpp():
    llama_cpp = pytest.importorskip("llama_cpp")
    from pyspecla.tokenizer import Tokenizer

    ours = Tokenizer.from_gguf(str(DRAFT))
    llm = llama_cpp.Llama(model_path=str(DRAFT), vocab_only=True, verbose=False)
    for text in TEXTS:
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), repr(text)
        if "<|" not in text:
            assert ours.decode(ours.encode(text)) == text
