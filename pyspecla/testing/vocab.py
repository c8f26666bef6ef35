"""A deterministic synthetic byte-level BPE vocabulary for test models.

llama.cpp loads it as `tokenizer.ggml.model = gpt2`, `tokenizer.ggml.pre = qwen35`, like a real
Qwen3.5 vocabulary but small. Layout, by id:

    0 .. 255           the 256 byte-level symbols (GPT-2 byte → unicode table, GPT-2 order), normal
    256 .. 256+m-1     tokens created by m merges learned from a built-in multilingual corpus
    next 3             <|endoftext|>, <|im_start|>, <|im_end|>                   control (3)
    next 4             <think>, </think>, <tool_call>, </tool_call>               user-defined (4)
    rest               [PAD0], [PAD1], …  up to exactly n_vocab                   unused (5)

The merges come from a small pure-Python BPE training: the corpus is pre-split with the qwen35
regex (so no merge crosses a pre-token boundary), and each round merges the most frequent adjacent
pair, ties broken by the lexicographically smallest (left, right). Training stops when the corpus
has no pair left, at MAX_MERGES, or when the vocabulary has no room; the rest is padding. The same
n_vocab always gives the same vocabulary.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache

from ..tokenizer import (
    PRE_TOKENIZER_PATTERNS,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    bytes_to_unicode,
)

__all__ = [
    "CONTROL_TOKENS",
    "USER_DEFINED_TOKENS",
    "MAX_MERGES",
    "MIN_VOCAB",
    "CHATML_TEMPLATE",
    "TRAINING_CORPUS",
    "SyntheticVocab",
    "build_vocab",
    "write_tokenizer_metadata",
]

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
USER_DEFINED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
# Enough to make realistic multi-byte tokens; small enough that a 248320-row vocabulary builds in
# well under a second (the rest of such a vocabulary is [PAD…]).
MAX_MERGES = 2000
MIN_VOCAB = 256 + len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)

# Compact ChatML: one block per message, the assistant header when a reply is wanted.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is not string %}"
    "{{- raise_exception('message content must be a string') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Multilingual training text: the merges it yields give test models multi-byte tokens in every
# script the tokenizer tests use. Changing it changes every synthetic vocabulary.
TRAINING_CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's sleeping in the sun.\n"
    "Speculative decoding drafts several tokens with a small model, then the target model verifies "
    "them in one pass and keeps the longest accepted prefix. When the draft is good, the runtime "
    "produces more than one token per step; when it is bad, it still produces one.\n"
    "We'll see whether they're right: I'm sure you've heard that the state of a recurrent layer "
    "must be rolled back when a drafted token is rejected.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 -17 +8 0x1F 1e-6 248320\n"
    "\n"
    "def greedy_decode(model, prompt_ids, max_new_tokens=32):\n"
    "    \"\"\"Return the greedy continuation of prompt_ids.\"\"\"\n"
    "    ids = list(prompt_ids)\n"
    "    for _ in range(max_new_tokens):\n"
    "        logits = model.forward(ids)\n"
    "        next_id = int(logits[-1].argmax())\n"
    "        if next_id == model.eos_id:\n"
    "            break\n"
    "        ids.append(next_id)\n"
    "    return ids[len(prompt_ids):]\n"
    "\n"
    "class Cache:\n"
    "\tdef __init__(self, size: int) -> None:\n"
    "\t\tself.size = size\n"
    "\t\tself.items = {}  # key -> value\n"
    "\n"
    "\tdef get(self, key, default=None):\n"
    "\t\treturn self.items.get(key, default)\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    print(greedy_decode(None, [1, 2, 3]))\n"
    "\n"
    "人工智能正在改变我们的生活和工作方式。语言模型可以回答问题、翻译文本、编写代码。"
    "今天天气很好，我们去公园散步吧。中文分词和字节级编码是两个不同的问题。\n"
    "日本語のテキストも扱えます。ひらがな、カタカナ、漢字が混ざっています。"
    "東京は日本の首都です。今日はいい天気ですね。トークナイザーのテストをしましょう。\n"
    "한국어 문장도 조금 있습니다. 안녕하세요!\n"
    "Emoji: 😀 😂 🎉 👍 👍🏽 ❤️ 🚀 🇯🇵 👩‍💻 👨‍👩‍👧‍👦 🤖✨\n"
    "Café, naïve, résumé, façade, über, São Paulo, Ångström, Dvořák, Łódź, smörgåsbord.\n"
    "Combining marks: cafe\u0301, e\u0301te\u0301, n\u0303, a\u0308, Zu\u0308rich.\n"
    "Tiếng Việt có nhiều dấu: người, những, được, trường, Việt Nam.\n"
    "हिन्दी में लिखा गया वाक्य। नमस्ते दुनिया।\n"
    "Ελληνικά: γειά σου κόσμε. Русский: привет, мир! العربية: مرحبا بالعالم.\n"
    "Whitespace:    four spaces,\ttab,\t\ttwo tabs,  \n  \n\n\nlines\r\nwindows\r\n"
    "        indented eight\n"
    "Punctuation!? ... --- ((nested)) [brackets] {braces} <angle> \"quotes\" 'single' `tick`\n"
    "URL https://example.com/path?query=1&x=y#frag and mail someone@example.org\n"
    "A hybrid model interleaves gated delta-net layers with full attention every fourth layer. "
    "Each recurrent layer keeps a convolution window and a matrix state per value head; "
    "attention layers keep keys and values for every position. Quantized weights are stored "
    "in blocks of thirty-two or two hundred fifty-six values with their own scales.\n"
    "import numpy as np\n"
    "\n"
    "def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:\n"
    "    variance = np.mean(x * x, axis=-1, keepdims=True)\n"
    "    return x / np.sqrt(variance + eps) * weight\n"
    "\n"
    "for layer_index, layer in enumerate(model.layers):\n"
    "    hidden = layer(hidden, position=position)  # TODO: batch\n"
    "    assert hidden.shape == (batch_size, embedding_length), hidden.shape\n"
    "机器学习模型需要大量的数据进行训练。北京和上海是中国最大的城市。请把这段话翻译成英文。\n"
    "私は毎朝コーヒーを飲みます。この本はとても面白かったです。明日は雨が降るでしょう。\n"
    "Français: où est la bibliothèque? Español: ¿dónde está la estación? Português: não, obrigado.\n"
)


@dataclass
class SyntheticVocab:
    """Everything write_tokenizer_metadata puts into the tokenizer.ggml.* keys."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]  # "A B", rank order
    eos_id: int
    pad_id: int
    bos_id: int | None
    chat_template: str
    pre: str = "qwen35"
    model: str = field(default="gpt2")

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _pretokenize_corpus(corpus: str, pre: str) -> list[str]:
    """The corpus split by the `pre` regex, each piece in byte-level characters."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS[pre]), behavior="isolated", invert=False)
    byte_to_char = bytes_to_unicode()
    return ["".join(byte_to_char[b] for b in piece.encode("utf-8")) for piece, _ in split.pre_tokenize_str(corpus)]


def _merge_word(symbols: tuple[str, ...], left: str, right: str) -> tuple[str, ...]:
    merged = []
    i = 0
    n = len(symbols)
    while i < n:
        if i + 1 < n and symbols[i] == left and symbols[i + 1] == right:
            merged.append(left + right)
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return tuple(merged)


def _word_pairs(symbols: tuple[str, ...]) -> dict[tuple[str, str], int]:
    pairs: dict[tuple[str, str], int] = {}
    for pair in zip(symbols, symbols[1:]):
        pairs[pair] = pairs.get(pair, 0) + 1
    return pairs


@lru_cache(maxsize=4)
def _train_merges(corpus: str, pre: str, max_merges: int, max_new_tokens: int) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(merges in rank order, new token texts in creation order)."""
    word_counts: dict[str, int] = {}
    for piece in _pretokenize_corpus(corpus, pre):
        word_counts[piece] = word_counts.get(piece, 0) + 1
    words = [tuple(word) for word in sorted(word_counts)]
    freqs = [word_counts[word] for word in sorted(word_counts)]

    pair_counts: dict[tuple[str, str], int] = {}
    pair_words: dict[tuple[str, str], set[int]] = {}
    for index, symbols in enumerate(words):
        for pair, n in _word_pairs(symbols).items():
            pair_counts[pair] = pair_counts.get(pair, 0) + n * freqs[index]
            pair_words.setdefault(pair, set()).add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    known = set(bytes_to_unicode().values()) | set(CONTROL_TOKENS) | set(USER_DEFINED_TOKENS)
    merges: list[tuple[str, str]] = []
    new_tokens: list[str] = []
    while heap and len(merges) < max_merges:
        negative_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count <= 0 or -negative_count != count:
            continue  # stale heap entry
        left, right = pair
        merged_text = left + right
        if merged_text not in known:
            if len(new_tokens) >= max_new_tokens:
                break
            known.add(merged_text)
            new_tokens.append(merged_text)
        merges.append(pair)

        changed: set[tuple[str, str]] = set()
        for index in sorted(pair_words.pop(pair, ())):
            old_symbols = words[index]
            new_symbols = _merge_word(old_symbols, left, right)
            old_pairs = _word_pairs(old_symbols)
            new_pairs = _word_pairs(new_symbols)
            freq = freqs[index]
            for p, n in old_pairs.items():
                pair_counts[p] -= n * freq
                changed.add(p)
                if p not in new_pairs and p in pair_words:
                    pair_words[p].discard(index)
            for p, n in new_pairs.items():
                pair_counts[p] = pair_counts.get(p, 0) + n * freq
                changed.add(p)
                pair_words.setdefault(p, set()).add(index)
            words[index] = new_symbols
        for p in changed:
            count = pair_counts.get(p, 0)
            if count > 0:
                heapq.heappush(heap, (-count, p))
            else:
                pair_counts.pop(p, None)
                pair_words.pop(p, None)
    return tuple(merges), tuple(new_tokens)


def build_vocab(n_vocab: int, *, max_merges: int = MAX_MERGES, pre: str = "qwen35") -> SyntheticVocab:
    """The synthetic vocabulary with exactly n_vocab tokens (see the module docstring).

    n_vocab must be at least MIN_VOCAB (263: bytes + special tokens); 600 or more leaves room for
    ~300 merges, which test models should have."""
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int):
        raise TypeError(f"n_vocab must be an int, got {n_vocab!r}")
    if n_vocab < MIN_VOCAB:
        raise ValueError(f"n_vocab = {n_vocab} is too small: the synthetic vocabulary needs at least {MIN_VOCAB}")
    if pre not in PRE_TOKENIZER_PATTERNS:
        raise ValueError(f"unknown pre-tokenizer {pre!r}")

    byte_symbols = list(bytes_to_unicode().values())  # GPT-2 order: printable bytes first
    room = n_vocab - MIN_VOCAB
    merges, new_tokens = _train_merges(TRAINING_CORPUS, pre, max_merges, room)

    tokens = byte_symbols + list(new_tokens)
    token_types = [TOKEN_TYPE_NORMAL] * len(tokens)
    special_start = len(tokens)
    tokens += CONTROL_TOKENS
    token_types += [TOKEN_TYPE_CONTROL] * len(CONTROL_TOKENS)
    tokens += USER_DEFINED_TOKENS
    token_types += [TOKEN_TYPE_USER_DEFINED] * len(USER_DEFINED_TOKENS)
    n_pad = n_vocab - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(n_pad)]
    token_types += [TOKEN_TYPE_UNUSED] * n_pad
    assert len(tokens) == n_vocab == len(token_types)

    return SyntheticVocab(
        tokens=tokens,
        token_types=token_types,
        merges=[f"{left} {right}" for left, right in merges],
        eos_id=special_start + CONTROL_TOKENS.index("<|im_end|>"),
        pad_id=special_start + CONTROL_TOKENS.index("<|endoftext|>"),
        bos_id=None,
        chat_template=CHATML_TEMPLATE,
        pre=pre,
    )


def write_tokenizer_metadata(writer, vocab: SyntheticVocab) -> None:
    """Add every tokenizer.ggml.* key (and tokenizer.chat_template) for `vocab` to a
    gguf.GGUFWriter, as convert_hf_to_gguf.py writes them for a Qwen3.5 model."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    if vocab.bos_id is not None:
        writer.add_bos_token_id(vocab.bos_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(vocab.chat_template)
