"""The GGUF vocabulary as a `tokenizers` byte-level BPE, tokenising exactly like llama.cpp.

Contract (docs/qwen35.md §5):
- `tokenizer.ggml.model` must be `gpt2` (byte-level BPE); `tokenizer.ggml.pre` picks the split
  regex: `qwen35` (letter runs include \\p{M}) or a qwen2-family name (no \\p{M}).
- Special tokens are split out of the text first: control tokens (type 3) only when
  `special=True`, user-defined tokens (type 4) always, as llama.cpp does. Each remaining stretch is
  pre-split by the regex, mapped byte → unicode (GPT-2 table) and merged by merge rank.
- No NFC normalisation (llama.cpp has none; HF's tokenizer.json would apply NFC).
- No BOS is ever added (`add_bos_token` is false for qwen35).

Token pieces follow llama.cpp's `token_to_piece(special=True)`: normal tokens map back through the
byte table, control / user-defined / unknown tokens are their UTF-8 text, unused (`[PAD…]`) and
undefined tokens are empty.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from .errors import GGUFError

__all__ = [
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_UNKNOWN",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED",
    "TOKEN_TYPE_UNUSED",
    "TOKEN_TYPE_BYTE",
    "PRE_TOKENIZER_PATTERNS",
    "bytes_to_unicode",
    "pretokenizer_pattern",
    "Tokenizer",
    "StreamingDetokenizer",
]

# tokenizer.ggml.token_type values (llama_token_type)
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# The split regexes exactly as llama.cpp spells them (llama-vocab.cpp). The tokenizer.json
# originals start with `(?i:'s|'t|…)`; llama.cpp writes the case-insensitivity out as ASCII
# classes, which also keeps Unicode case folding (e.g. "'ſ" matching "'s") out of the match.
_QWEN2_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre values → split regex. The qwen2 names are those llama.cpp maps to
# LLAMA_VOCAB_PRE_TYPE_QWEN2 with clean_spaces off (decoding is then plain concatenation).
PRE_TOKENIZER_PATTERNS: dict[str, str] = {
    "qwen35": _QWEN35_PATTERN,
    "qwen2": _QWEN2_PATTERN,
    "deepseek-r1-qwen": _QWEN2_PATTERN,
    "kormo": _QWEN2_PATTERN,
    "f2llmv2": _QWEN2_PATTERN,
    "megrez": _QWEN2_PATTERN,
}

_KEY_MODEL = "tokenizer.ggml.model"
_KEY_PRE = "tokenizer.ggml.pre"
_KEY_TOKENS = "tokenizer.ggml.tokens"
_KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
_KEY_MERGES = "tokenizer.ggml.merges"
_KEY_EOS = "tokenizer.ggml.eos_token_id"
_KEY_PAD = "tokenizer.ggml.padding_token_id"
_KEY_BOS = "tokenizer.ggml.bos_token_id"
_KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# Token texts llama.cpp treats as end-of-generation when present (the ones a qwen35 vocab has).
_END_OF_GENERATION_TEXTS = ("<|im_end|>", "<|endoftext|>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable unicode character table used by byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 onwards, in byte
    order. Iteration order is GPT-2's: the printable bytes first."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {ch: b for b, ch in bytes_to_unicode().items()}


def pretokenizer_pattern(pre: str, path: str = "<metadata>") -> str:
    """The split regex for a `tokenizer.ggml.pre` value; GGUFError for one we do not know."""
    try:
        return PRE_TOKENIZER_PATTERNS[pre]
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZER_PATTERNS))
        raise GGUFError(
            f"{path}: unsupported {_KEY_PRE} = {pre!r} (supported: {known})"
        ) from None


def _require(fields: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in fields or fields[key] is None:
        raise GGUFError(f"{path}: missing key {key}")
    return fields[key]


def _as_int(value: Any, key: str, path: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        # numpy scalars have __index__; lists of length 1 (a raw GGUF field) do not
        if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 1:
            return _as_int(value[0], key, path)
        raise GGUFError(f"{path}: key {key} must be an integer, got {value!r}")
    return int(value)


def _optional_token_id(fields: Mapping[str, Any], key: str, path: str, n_vocab: int) -> int | None:
    if key not in fields or fields[key] is None:
        return None
    token_id = _as_int(fields[key], key, path)
    if not 0 <= token_id < n_vocab:
        raise GGUFError(f"{path}: key {key} = {token_id} is outside the vocabulary (0..{n_vocab - 1})")
    return token_id


def _read_gguf_tokenizer_fields(path: str) -> dict[str, Any]:
    """The tokenizer.* metadata of a GGUF file as plain Python values."""
    import gguf
    import numpy as np

    try:
        reader = gguf.GGUFReader(path, "r")
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except Exception as exc:  # the reader raises ValueError / struct errors / OSError
        raise GGUFError(f"{path}: not a readable GGUF file ({exc})") from exc

    fields: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if not (name.startswith("tokenizer.") or name == "general.architecture"):
            continue
        types = field.types
        if not types:
            continue
        if types[0] == gguf.GGUFValueType.ARRAY:
            element_type = types[-1] if len(types) > 1 else None
            if element_type == gguf.GGUFValueType.STRING:
                fields[name] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                fields[name] = [np.asarray(field.parts[i]).item() for i in field.data]
        elif types[0] == gguf.GGUFValueType.STRING:
            fields[name] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            fields[name] = np.asarray(field.parts[field.data[0]]).item()
    return fields


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    # transformers' chat-template tojson: no ASCII escaping, optional indent
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(format_string: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(format_string)


class Tokenizer:
    """A GGUF byte-level BPE vocabulary, tokenising like llama.cpp's `llama_tokenize`.

    Build it with `from_gguf_fields(fields, path)` (fields: metadata key → plain Python value)
    or `from_gguf(path)`."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        pre: str,
        eos_id: int | None,
        pad_id: int | None = None,
        bos_id: int | None = None,
        chat_template: str | None = None,
        path: str = "<metadata>",
    ):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        self.path = path
        self.pre = pre
        self.tokens: list[str] = list(tokens)
        self.token_types: list[int] = [int(t) for t in token_types]
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.n_vocab = len(self.tokens)
        if len(self.token_types) != self.n_vocab:
            raise GGUFError(
                f"{path}: key {_KEY_TOKEN_TYPE} has {len(self.token_types)} entries, "
                f"{_KEY_TOKENS} has {self.n_vocab}"
            )
        pattern = pretokenizer_pattern(pre, path)

        # llama.cpp's token_to_id keeps the last id of a duplicated text; so does this dict
        vocab = {text: token_id for token_id, text in enumerate(self.tokens)}
        merge_pairs = []
        for index, merge in enumerate(merges):
            # llama.cpp splits at the first space after position 0
            split_at = merge.find(" ", 1)
            if split_at < 0:
                raise GGUFError(f"{path}: key {_KEY_MERGES}[{index}] = {merge!r} is not 'A B'")
            left, right = merge[:split_at], merge[split_at + 1 :]
            for part in (left, right, left + right):
                if part not in vocab:
                    raise GGUFError(
                        f"{path}: key {_KEY_MERGES}[{index}] = {merge!r} uses {part!r}, "
                        f"which is not in {_KEY_TOKENS}"
                    )
            merge_pairs.append((left, right))

        try:
            model = models.BPE(vocab=vocab, merges=merge_pairs, unk_token=None, byte_fallback=False, ignore_merges=False)
        except Exception as exc:
            raise GGUFError(f"{path}: keys {_KEY_TOKENS} / {_KEY_MERGES} do not form a BPE vocabulary ({exc})") from exc
        hf = HFTokenizer(model)
        hf.normalizer = None
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        hf.decoder = decoders.ByteLevel()

        control, user_defined = [], []
        for token_id, (text, kind) in enumerate(zip(self.tokens, self.token_types)):
            if not text or vocab[text] != token_id:
                continue
            if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                control.append(AddedToken(text, special=True, normalized=False))
            elif kind == TOKEN_TYPE_USER_DEFINED:
                user_defined.append(AddedToken(text, special=False, normalized=False))
        # normalized=False for both kinds puts them in one longest-match pass, as llama.cpp has
        hf.add_special_tokens(control)
        hf.add_tokens(user_defined)
        self._hf = hf
        self._hf_plain = None  # lazily built copy that leaves control tokens in text as text

        byte_of = _unicode_to_byte()
        self._pieces: list[bytes] = []
        for text, kind in zip(self.tokens, self.token_types):
            self._pieces.append(self._piece(text, kind, byte_of))

        self.eos_ids: set[int] = set()
        if eos_id is not None:
            self.eos_ids.add(eos_id)
        for text in _END_OF_GENERATION_TEXTS:
            if text in vocab:
                self.eos_ids.add(vocab[text])
        self._vocab = vocab
        self._template = None

    @staticmethod
    def _piece(text: str, kind: int, byte_of: Mapping[str, int]) -> bytes:
        if kind == TOKEN_TYPE_NORMAL:
            try:
                return bytes(byte_of[ch] for ch in text)
            except KeyError:
                # not byte-level text (never in a converted vocab): llama.cpp prints
                # [UNK_BYTE_…] here, the tokenizers decoder the raw UTF-8; keep the UTF-8
                return text.encode("utf-8")
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNKNOWN):
            return text.encode("utf-8")
        if kind == TOKEN_TYPE_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined: llama.cpp renders nothing

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any], path: str) -> "Tokenizer":
        """Build from GGUF metadata given as key → plain Python value (arrays as lists)."""
        model_name = _require(fields, _KEY_MODEL, path)
        if model_name != "gpt2":
            raise GGUFError(
                f"{path}: unsupported {_KEY_MODEL} = {model_name!r} (only 'gpt2', byte-level BPE)"
            )
        pre = _require(fields, _KEY_PRE, path)
        if not isinstance(pre, str):
            raise GGUFError(f"{path}: key {_KEY_PRE} must be a string, got {pre!r}")
        pretokenizer_pattern(pre, path)

        tokens = _require(fields, _KEY_TOKENS, path)
        if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens:
            raise GGUFError(f"{path}: key {_KEY_TOKENS} must be a non-empty array of strings")
        if not all(isinstance(t, str) for t in tokens):
            raise GGUFError(f"{path}: key {_KEY_TOKENS} must hold strings only")
        n_vocab = len(tokens)

        token_types = fields.get(_KEY_TOKEN_TYPE)
        if hasattr(token_types, "tolist"):  # a numpy array is fine too
            token_types = token_types.tolist()
        if token_types is None:
            token_types = [TOKEN_TYPE_NORMAL] * n_vocab  # llama.cpp's default without the key
        elif isinstance(token_types, str) or not isinstance(token_types, Sequence):
            raise GGUFError(f"{path}: key {_KEY_TOKEN_TYPE} must be an array of integers")

        merges = _require(fields, _KEY_MERGES, path)
        if isinstance(merges, str) or not isinstance(merges, Sequence):
            raise GGUFError(f"{path}: key {_KEY_MERGES} must be an array of strings")
        if not all(isinstance(m, str) for m in merges):
            raise GGUFError(f"{path}: key {_KEY_MERGES} must hold strings only")

        eos_id = _optional_token_id(fields, _KEY_EOS, path, n_vocab)
        pad_id = _optional_token_id(fields, _KEY_PAD, path, n_vocab)
        bos_id = _optional_token_id(fields, _KEY_BOS, path, n_vocab)
        chat_template = fields.get(_KEY_CHAT_TEMPLATE)
        if chat_template is not None and not isinstance(chat_template, str):
            raise GGUFError(f"{path}: key {_KEY_CHAT_TEMPLATE} must be a string")

        return cls(
            tokens=tokens,
            token_types=token_types,
            merges=merges,
            pre=pre,
            eos_id=eos_id,
            pad_id=pad_id,
            bos_id=bos_id,
            chat_template=chat_template,
            path=path,
        )

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        """Read the tokenizer metadata of a GGUF file and build from it."""
        return cls.from_gguf_fields(_read_gguf_tokenizer_fields(str(path)), str(path))

    # ---- text ↔ ids --------------------------------------------------------------------------

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`, like llama.cpp `tokenize(text, add_special=False, parse_special=special)`.

        special=True: control tokens written in the text (`<|im_start|>`) become their ids;
        special=False: they are tokenised as plain text. User-defined tokens (`<think>`) are
        matched either way. No BOS is added."""
        if not text:
            return []
        if special:
            return self._hf.encode(text, add_special_tokens=False).ids
        if self._hf_plain is None:
            from tokenizers import Tokenizer as HFTokenizer

            plain = HFTokenizer.from_str(self._hf.to_str())
            plain.encode_special_tokens = True
            self._hf_plain = plain
        return self._hf_plain.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token: byte-level text mapped back; control / user-defined tokens
        as their UTF-8 text; unused (`[PAD…]`) tokens empty, as llama.cpp renders them."""
        if not 0 <= token_id < self.n_vocab:
            raise IndexError(f"token id {token_id} outside the vocabulary (0..{self.n_vocab - 1})")
        return self._pieces[token_id]

    def is_control(self, token_id: int) -> bool:
        return self.token_types[token_id] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Concatenated token bytes; skip_special drops control tokens (llama.cpp special=False)."""
        pieces = self._pieces
        types = self.token_types
        n_vocab = self.n_vocab
        out = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < n_vocab:
                raise IndexError(f"token id {token_id} outside the vocabulary (0..{n_vocab - 1})")
            if skip_special and types[token_id] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                continue
            out.append(pieces[token_id])
        return b"".join(out)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD (as the ByteLevel decoder does)."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def token_id(self, text: str) -> int | None:
        """The id of a token given its vocabulary text (e.g. '<|im_end|>'), or None."""
        return self._vocab.get(text)

    def streaming_detokenizer(self) -> "StreamingDetokenizer":
        return StreamingDetokenizer(self)

    # ---- chat --------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render `tokenizer.chat_template` as transformers does (sandboxed jinja2, trim_blocks and
        lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`). Extra keyword arguments
        (tools=…, enable_thinking=…) reach the template as variables."""
        if self.chat_template is None:
            raise GGUFError(f"{self.path}: missing key {_KEY_CHAT_TEMPLATE}")
        if self._template is None:
            from jinja2 import TemplateError
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as exc:
                raise GGUFError(f"{self.path}: key {_KEY_CHAT_TEMPLATE} is not a valid Jinja template ({exc})") from exc
        variables = {
            "bos_token": self.tokens[self.bos_id] if self.bos_id is not None else "",
            "eos_token": self.tokens[self.eos_id] if self.eos_id is not None else "",
        }
        variables.update(template_kwargs)
        variables["messages"] = messages
        variables["add_generation_prompt"] = add_generation_prompt
        return self._template.render(**variables)

    def __repr__(self) -> str:
        return f"Tokenizer({self.path!r}, n_vocab={self.n_vocab}, pre={self.pre!r})"


class StreamingDetokenizer:
    """Turns a stream of token ids into text without ever emitting a partial UTF-8 character.

    push(id) returns the text completed by that token (possibly ''); a multi-byte character whose
    bytes arrive over several tokens is held back until complete. Invalid bytes become U+FFFD as
    soon as they are known to be invalid. flush() returns whatever is held back (an incomplete
    sequence becomes U+FFFD) and resets the stream."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        if self.skip_special and self.tokenizer.is_control(token_id):
            return ""
        return self._decoder.decode(self.tokenizer.token_bytes(token_id), final=False)

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
