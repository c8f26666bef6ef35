"""Tokenizer tests: the synthetic vocabulary, our `tokenizers`-based Tokenizer, and (where
llama-cpp-python is installed) token-for-token agreement with llama.cpp's own tokenizer."""

from __future__ import annotations

import random
import time

import gguf
import pytest

from pyspecla.errors import GGUFError
from pyspecla.testing.vocab import (
    CONTROL_TOKENS,
    MIN_VOCAB,
    USER_DEFINED_TOKENS,
    build_vocab,
    write_tokenizer_metadata,
)
from pyspecla.tokenizer import (
    PRE_TOKENIZER_PATTERNS,
    StreamingDetokenizer,
    Tokenizer,
    bytes_to_unicode,
)

# Texts without special tokens: must round-trip through encode/decode and match llama.cpp.
PLAIN_TEXTS = [
    "",
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they're sure, I'M DONE, YOU'VE.",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass  # tab-indented\n",
    "class A:\n    def __init__(self):\n        self.items = {}\n",
    "人工智能正在改变我们的生活。今天天气很好！",
    "日本語のテキスト、ひらがなとカタカナ。東京。",
    "한국어 문장입니다.",
    "emoji 😀😂 👍🏽 👍🏿 ❤️ 🇯🇵 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🤖✨",
    "cafe\u0301 e\u0301te\u0301 n\u0303 a\u0308 Zu\u0308rich \u0301leading mark",
    "Tiếng Việt: người, những, được, trường.",
    "हिन्दी में लिखा गया वाक्य। नमस्ते",
    "Ελληνικά γειά σου. Русский привет. العربية مرحبا.",
    "1234567890 3.14159265358979 1,000,000 12345678901234567890 ٣٤٥ ²³ ½",
    "spaces    between   words \t tabs\t\tand\u00a0nbsp\u3000ideographic",
    "line\r\nwindows\r\n\r\nmore\n\n\n  \n end  ",
    "trailing spaces   ",
    "\n\n\n",
    "   ",
    "Punctuation!? ... --- ((nested)) [x] {y} <z> \"q\" 'single' `tick` @#$%^&*",
    "https://example.com/path?q=1&x=y#frag someone@example.org",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'LL 'D",
    "<|im_start without closing |> and <think but not a tag",
]

# Texts with special tokens written in them.
SPECIAL_TEXTS = [
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "before<|im_end|>after",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|><|im_start|><|im_end|><think></think>",
    "x<|im_end|>y<think>z",
]


def _write_vocab_gguf(path, vocab) -> str:
    writer = gguf.GGUFWriter(str(path), "qwen35")
    write_tokenizer_metadata(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _fields(vocab) -> dict:
    fields = {
        "general.architecture": "qwen35",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": vocab.pre,
        "tokenizer.ggml.tokens": list(vocab.tokens),
        "tokenizer.ggml.token_type": list(vocab.token_types),
        "tokenizer.ggml.merges": list(vocab.merges),
        "tokenizer.ggml.eos_token_id": vocab.eos_id,
        "tokenizer.ggml.padding_token_id": vocab.pad_id,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": vocab.chat_template,
    }
    if vocab.bos_id is not None:
        fields["tokenizer.ggml.bos_token_id"] = vocab.bos_id
    return fields


@pytest.fixture(scope="module")
def vocab():
    return build_vocab(600)


@pytest.fixture(scope="module")
def tokenizer(vocab):
    return Tokenizer.from_gguf_fields(_fields(vocab), "synthetic-600.gguf")


# ---------------------------------------------------------------------------------------------
# synthetic vocabulary


def test_build_vocab_is_deterministic(vocab):
    again = build_vocab(600)
    assert again.tokens == vocab.tokens
    assert again.token_types == vocab.token_types
    assert again.merges == vocab.merges
    assert (again.eos_id, again.pad_id, again.bos_id) == (vocab.eos_id, vocab.pad_id, vocab.bos_id)
    assert again.chat_template == vocab.chat_template


@pytest.mark.parametrize("n_vocab", [MIN_VOCAB, MIN_VOCAB + 1, 600, 1000, 1777, 5000])
def test_build_vocab_layout(n_vocab):
    vocab = build_vocab(n_vocab)
    assert len(vocab.tokens) == len(vocab.token_types) == n_vocab
    assert len(set(vocab.tokens)) == n_vocab, "token texts must be unique"
    # the 256 byte symbols first, normal
    assert vocab.tokens[:256] == list(bytes_to_unicode().values())
    special_start = vocab.token_types.index(3)
    assert vocab.token_types[:special_start] == [1] * special_start
    assert special_start - 256 <= len(vocab.merges)  # a merge may rebuild an existing token
    specials = vocab.tokens[special_start : special_start + 7]
    assert specials == list(CONTROL_TOKENS + USER_DEFINED_TOKENS)
    assert vocab.token_types[special_start : special_start + 7] == [3, 3, 3, 4, 4, 4, 4]
    pads = vocab.tokens[special_start + 7 :]
    assert pads == [f"[PAD{i}]" for i in range(len(pads))]
    assert set(vocab.token_types[special_start + 7 :]) <= {5}
    assert vocab.tokens[vocab.eos_id] == "<|im_end|>"
    assert vocab.tokens[vocab.pad_id] == "<|endoftext|>"
    assert vocab.bos_id is None
    assert vocab.pre == "qwen35"
    # every merge joins two known tokens into a known token
    known = set(vocab.tokens)
    for merge in vocab.merges:
        left, right = merge.split(" ")
        assert left in known and right in known and left + right in known


def test_build_vocab_merge_budget():
    vocab = build_vocab(600)
    assert len(vocab.merges) >= 300
    # the corpus has more to give: every free slot holds a merged token, no padding
    assert vocab.token_types.count(1) == 256 + 600 - MIN_VOCAB
    assert vocab.token_types.count(5) == 0
    assert len(build_vocab(MIN_VOCAB).merges) == 0
    with pytest.raises(ValueError):
        build_vocab(MIN_VOCAB - 1)


def test_build_vocab_full_size_is_fast():
    start = time.perf_counter()
    vocab = build_vocab(248320, max_merges=2000 + 1)  # a fresh cache entry: really trains
    elapsed = time.perf_counter() - start
    assert len(vocab.tokens) == 248320
    assert 1000 <= len(vocab.merges) <= 2001
    assert elapsed < 10.0, elapsed


def test_merges_stay_inside_pre_tokens(vocab):
    """A merged token that is whole UTF-8 text must be a single qwen35 pre-token."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS["qwen35"]), behavior="isolated")
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    checked = 0
    for text, kind in zip(vocab.tokens[256:], vocab.token_types[256:]):
        if kind != 1:
            break
        try:
            decoded = bytes(byte_of[c] for c in text).decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a multi-byte character
        pieces = [p for p, _ in split.pre_tokenize_str(decoded)]
        assert pieces == [decoded], (text, pieces)
        checked += 1
    assert checked > 100


def test_write_tokenizer_metadata_round_trip(tmp_path, vocab):
    path = _write_vocab_gguf(tmp_path / "vocab.gguf", vocab)
    reader = gguf.GGUFReader(path)
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert reader.fields["tokenizer.ggml.pre"].contents() == "qwen35"
    assert reader.fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert "tokenizer.ggml.bos_token_id" not in reader.fields
    loaded = Tokenizer.from_gguf(path)
    assert loaded.tokens == vocab.tokens
    assert loaded.token_types == vocab.token_types
    assert (loaded.eos_id, loaded.pad_id, loaded.bos_id) == (vocab.eos_id, vocab.pad_id, None)
    assert loaded.chat_template == vocab.chat_template
    text = "Hello <|im_start|>world 人工智能 👍🏽"
    direct = Tokenizer.from_gguf_fields(_fields(vocab), "x")
    assert loaded.encode(text) == direct.encode(text)


# ---------------------------------------------------------------------------------------------
# tokenizer without llama.cpp


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_decode_inverts_encode(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text, special=False) == ids  # nothing special in these texts


def test_special_tokens_in_text(tokenizer, vocab):
    im_start = vocab.tokens.index("<|im_start|>")
    im_end = vocab.tokens.index("<|im_end|>")
    think = vocab.tokens.index("<think>")
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == im_start and ids[-1] == im_end
    assert im_start not in ids[1:-1] and im_end not in ids[1:-1]
    # special=False: control tokens are plain text, user-defined tokens still match
    plain = tokenizer.encode("<|im_start|><think>", special=False)
    assert im_start not in plain and plain[-1] == think
    assert tokenizer.decode(plain) == "<|im_start|><think>"
    for text in SPECIAL_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert tokenizer.decode(tokenizer.encode(text, special=False)) == text


def test_token_bytes_and_end_of_generation(tokenizer, vocab):
    byte_ids = {b: i for i, b in enumerate(bytes_to_unicode())}
    for b in range(256):
        assert tokenizer.token_bytes(byte_ids[b]) == bytes([b])
    assert tokenizer.token_bytes(vocab.eos_id) == b"<|im_end|>"
    assert tokenizer.token_bytes(vocab.tokens.index("<think>")) == b"<think>"
    padded = build_vocab(2000)
    padded_tokenizer = Tokenizer.from_gguf_fields(_fields(padded), "padded.gguf")
    assert padded_tokenizer.token_bytes(padded.tokens.index("[PAD0]")) == b""
    assert tokenizer.eos_ids == {vocab.eos_id, vocab.pad_id}
    ids = tokenizer.encode("a<|im_end|>b")
    assert tokenizer.decode(ids, skip_special=True) == "ab"
    with pytest.raises(IndexError):
        tokenizer.token_bytes(len(vocab.tokens))


def test_streaming_detokenizer_never_emits_partial_characters(tokenizer):
    text = "Zürich 人工智能 👩‍💻 e\u0301 नमस्ते 🇯🇵 done"
    ids = tokenizer.encode(text)
    # the test is only meaningful if some tokens end inside a character
    assert any(_is_partial_utf8(tokenizer.token_bytes(i)) for i in ids)
    stream = StreamingDetokenizer(tokenizer)
    chunks = [stream.push(i) for i in ids]
    chunks.append(stream.flush())
    assert "".join(chunks) == text
    assert all("\ufffd" not in chunk for chunk in chunks)

    # one byte-level token per byte: characters come out exactly when their last byte arrives
    byte_ids = {b: i for i, b in enumerate(bytes_to_unicode())}
    stream = tokenizer.streaming_detokenizer()
    emitted = ""
    for ch in text:
        encoded = ch.encode("utf-8")
        outputs = [stream.push(byte_ids[b]) for b in encoded]
        assert outputs[:-1] == [""] * (len(encoded) - 1)
        assert outputs[-1] == ch
        emitted += outputs[-1]
    assert emitted == text and stream.flush() == ""


def test_streaming_detokenizer_invalid_and_truncated_bytes(tokenizer):
    byte_ids = {b: i for i, b in enumerate(bytes_to_unicode())}
    stream = StreamingDetokenizer(tokenizer)
    assert stream.push(byte_ids[ord("a")]) == "a"
    assert stream.push(byte_ids[0xFF]) == "\ufffd"  # never valid UTF-8
    assert stream.push(byte_ids[0xE4]) == ""  # start of a 3-byte character
    assert stream.push(byte_ids[0xBA]) == ""
    assert stream.flush() == "\ufffd"  # truncated at the end
    assert stream.push(byte_ids[ord("b")]) == "b"  # usable again after flush
    # a special token in the middle of a held-back character
    stream = StreamingDetokenizer(tokenizer)
    assert stream.push(byte_ids[0xE4]) == ""
    im_end = tokenizer.token_id("<|im_end|>")
    assert stream.push(im_end) == "\ufffd<|im_end|>"
    assert StreamingDetokenizer(tokenizer, skip_special=True).push(im_end) == ""


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "多少?"},
    ]
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\n多少?<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    rendered = tokenizer.apply_chat_template(messages)
    assert rendered == expected + "<|im_start|>assistant\n"
    ids = tokenizer.encode(rendered)
    assert ids.count(tokenizer.token_id("<|im_start|>")) == 5
    assert ids.count(tokenizer.token_id("<|im_end|>")) == 4

    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="must be a string"):
        tokenizer.apply_chat_template([{"role": "user", "content": ["not", "a", "string"]}])


def test_chat_template_sandbox_and_kwargs(vocab):
    fields = _fields(vocab)
    fields["tokenizer.chat_template"] = (
        "{% for m in messages %}{{ m.role }}={{ m.content | tojson }};{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>{% endif %}"
        "{{ eos_token }}"
    )
    tok = Tokenizer.from_gguf_fields(fields, "t.gguf")
    out = tok.apply_chat_template([{"role": "user", "content": "é\""}], enable_thinking=False)
    assert out == 'user="é\\"";<think>\n\n</think><|im_end|>'
    fields["tokenizer.chat_template"] = "{{ ''.__class__.__mro__ }}"
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        Tokenizer.from_gguf_fields(fields, "t.gguf").apply_chat_template([])
    del fields["tokenizer.chat_template"]
    with pytest.raises(GGUFError, match=r"t\.gguf.*tokenizer\.chat_template"):
        Tokenizer.from_gguf_fields(fields, "t.gguf").apply_chat_template([])


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


@pytest.mark.parametrize(
    "change, key",
    [
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.pre": None}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.pre": "gpt-4o"}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.merges": ["Ġt"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.merges": ["Ġ nonexistent"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.token_type": [1, 1, 3]}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.eos_token_id": 600}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer.ggml.padding_token_id": -1}, "tokenizer.ggml.padding_token_id"),
        ({"tokenizer.ggml.bos_token_id": "x"}, "tokenizer.ggml.bos_token_id"),
        ({"tokenizer.chat_template": 5}, "tokenizer.chat_template"),
    ],
)
def test_bad_metadata_names_file_and_key(vocab, change, key):
    fields = _fields(vocab)
    for k, v in change.items():
        if v is None:
            del fields[k]
        else:
            fields[k] = v
    with pytest.raises(GGUFError) as info:
        Tokenizer.from_gguf_fields(fields, "/models/broken.gguf")
    message = str(info.value)
    assert message.startswith("/models/broken.gguf: "), message
    assert key in message, message


def test_bad_file_names_file_and_key(tmp_path, vocab):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(GGUFError, match="missing.gguf"):
        Tokenizer.from_gguf(missing)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="garbage.gguf"):
        Tokenizer.from_gguf(garbage)
    no_vocab = tmp_path / "no_vocab.gguf"
    writer = gguf.GGUFWriter(str(no_vocab), "qwen35")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match=r"no_vocab\.gguf: missing key tokenizer\.ggml\.tokens"):
        Tokenizer.from_gguf(no_vocab)


def test_qwen2_pre_keeps_marks_out_of_letter_runs():
    qwen35 = build_vocab(600)
    qwen2 = build_vocab(600, pre="qwen2")
    t35 = Tokenizer.from_gguf_fields(_fields(qwen35), "a")
    t2 = Tokenizer.from_gguf_fields(_fields(qwen2), "b")
    assert t2.pre == "qwen2"
    from tokenizers import Regex, pre_tokenizers

    def pieces(pre, text):
        split = pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS[pre]), behavior="isolated")
        return [p for p, _ in split.pre_tokenize_str(text)]

    assert pieces("qwen35", "cafe\u0301 ok") == ["cafe\u0301", " ok"]
    assert pieces("qwen2", "cafe\u0301 ok") == ["cafe", "\u0301", " ok"]
    for text in PLAIN_TEXTS:
        assert t2.decode(t2.encode(text)) == text
        assert t35.decode(t35.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# agreement with llama.cpp (llama-cpp-python)


def _random_texts(seed: int, count: int) -> list[str]:
    """Seeded random strings over the character classes where split rules differ, with special
    tokens (whole or broken) mixed in."""
    rng = random.Random(seed)
    pools = [
        "abcxyzABCXYZ",
        "0123456789",
        "'sStTrReEvVmMlLdDſ\u212a",
        " ",
        "  \t\n\r\u00a0\u3000\u2009\u000b\u000c\u0085\u2028\u1680\x1c\x1f",
        ".,;:!?-_()[]{}<>/\\\"`~@#$%^&*+=|",
        "人工智能日本語のテキスト한국어",
        "éèüßçñøåœ",
        "\u0301\u0303\u0308\u0327\u093f\u094d\u0902\u20dd\u0488",  # marks (Mn, Mc, Me)
        "😀👍🏽❤️🇯🇵\u200d\ufe0f🤖",
        "²³½٣४",  # other numbers
        "ʰˈ々〆",  # modifier letters
        "\ue000\u0378\U000e0001\u00ad\u200b\ufeff\x00\x7f",  # private use, unassigned, format
        list(CONTROL_TOKENS + USER_DEFINED_TOKENS) + ["<|im_", "|>", "</", "think>"],
    ]
    texts = []
    for _ in range(count):
        length = rng.randint(1, 40)
        texts.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return texts


def _llama_vocab_model(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module", params=[("qwen35", 600), ("qwen35", 4096), ("qwen2", 1500)], ids=lambda p: f"{p[0]}-{p[1]}")
def llama_pair(request, tmp_path_factory):
    """(llama.cpp vocab-only model, our Tokenizer) for the same synthetic GGUF."""
    pytest.importorskip("llama_cpp")
    pre, n_vocab = request.param
    vocab = build_vocab(n_vocab, pre=pre)
    path = _write_vocab_gguf(tmp_path_factory.mktemp("vocab") / f"{pre}-{n_vocab}.gguf", vocab)
    llama = _llama_vocab_model(path)
    return llama, Tokenizer.from_gguf(path)


def _llama_tokenize(llama, text: str, special: bool) -> list[int]:
    return llama.tokenize(text.encode("utf-8"), add_bos=False, special=special)


def _llama_detokenize(llama, ids: list[int], special: bool) -> bytes:
    """llama.cpp's llama_detokenize (remove_special=False). Llama.detokenize is not used: it
    renders each token through a 32-byte buffer and silently drops longer pieces."""
    import ctypes

    import llama_cpp

    tokens = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 8 * len(ids)
    while True:
        buffer = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(llama_cpp.llama_model_get_vocab(llama.model), tokens, len(ids), buffer, size, False, special)
        if n >= 0:
            return buffer.raw[:n]
        size = -n


@pytest.mark.llama
def test_llama_loads_synthetic_vocab(llama_pair):
    llama, ours = llama_pair
    assert llama.n_vocab() == ours.n_vocab
    assert llama.token_eos() == ours.eos_id
    # every token renders to the same bytes (normal, control, user-defined, unused)
    for token_id in range(ours.n_vocab):
        assert _llama_detokenize(llama, [token_id], special=True) == ours.token_bytes(token_id), token_id


@pytest.mark.llama
@pytest.mark.parametrize("text", PLAIN_TEXTS + SPECIAL_TEXTS)
def test_encode_matches_llama(llama_pair, text):
    llama, ours = llama_pair
    ids = ours.encode(text)
    assert ids == _llama_tokenize(llama, text, special=True)
    assert ours.encode(text, special=False) == _llama_tokenize(llama, text, special=False)
    assert _llama_detokenize(llama, ids, special=True) == ours.decode_bytes(ids)
    assert _llama_detokenize(llama, ids, special=False) == ours.decode_bytes(ids, skip_special=True)


@pytest.mark.llama
def test_encode_matches_llama_on_random_texts(llama_pair):
    llama, ours = llama_pair
    mismatches = []
    for text in _random_texts(seed=1234, count=1000):
        for special in (True, False):
            ids = ours.encode(text, special=special)
            reference = _llama_tokenize(llama, text, special=special)
            if ids != reference:
                mismatches.append((text, special, ids, reference))
            assert ours.decode(ids) == text
    assert not mismatches, mismatches[:5]
