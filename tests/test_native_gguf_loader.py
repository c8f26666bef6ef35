"""specla_model_load_gguf, the C ABI's own GGUF loader for native hosts, against the Python loader
(pyspecla.loader.target + pyspecla.model.Model): the same hyper-parameters and bit-identical logits
and tree verifies on every architecture and quant; every bad file refused by both, the C message
starting with the path and naming the key or tensor the Python message names; truncated and
corrupt files refused without a crash (in a subprocess)."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import GGUFValueType

from gguf_fixtures import DROP, Typed, write_minimal_qwen35
from pyspecla import _native
from pyspecla.errors import GGUFError
from pyspecla.loader.target import ModelFile
from pyspecla.model import Context, Model
from pyspecla.testing.models import write_test_model
from test_gguf_model import _variants

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class NativeLoadedModel:
    """A model made by specla_model_load_gguf, shaped as pyspecla.model.Context expects its model
    (a handle and hparams.n_vocab), so both loaders' models run through the same Context code."""

    def __init__(self, path: str):
        handle = ctypes.c_void_p()
        _native.check(_native.lib.specla_model_load_gguf(os.fsencode(path), ctypes.byref(handle)))
        self._handle = handle
        self.hparams = _native.HParams()
        _native.check(_native.lib.specla_model_hparams(handle, ctypes.byref(self.hparams)))

    def close(self):
        if self._handle:
            _native.lib.specla_model_free(self._handle)
            self._handle = None


def native_load_error(path: str) -> str:
    """The C loader's message for a file it must refuse."""
    handle = ctypes.c_void_p(1234)
    status = _native.lib.specla_model_load_gguf(os.fsencode(path), ctypes.byref(handle))
    assert status != _native.OK, f"the C loader accepted {path}"
    assert not handle.value, "a failed load must leave *out_model NULL"
    return _native.last_error()


def new_context(model, max_tree_nodes: int = 0) -> Context:
    return Context(model, n_ctx=64, max_batch=16, n_threads=0, cpu_kernels="auto", max_tree_nodes=max_tree_nodes,
                   device="cpu")


# ------------------------------------------------------------------------------------------------
# Valid files: the same model, bit for bit
# ------------------------------------------------------------------------------------------------

MODELS = [
    ("qwen35", "tiny", "f32"),
    ("qwen35", "tiny8", "q4_k_m"),  # untied output, mixed K-quants
    ("qwen35", "tiny", "q8_0"),
    ("qwen2", "tiny", "f16"),
    ("qwen3", "tiny8", "q8_0"),
]


@pytest.mark.parametrize("arch, preset, quant", MODELS, ids=["-".join(m) for m in MODELS])
def test_c_loader_gives_the_python_loaders_model(tmp_path, arch, preset, quant):
    path = str(write_test_model(tmp_path / "m.gguf", preset=preset, quant=quant, arch=arch, seed=3))
    python_model = Model.load(path, device="cpu")
    native_model = NativeLoadedModel(path)
    try:
        hp, native_hp = python_model.hparams, native_model.hparams
        assert native_hp.arch == _native.ARCHS[hp.arch]
        for field in ("n_layer", "n_embd", "n_ff", "n_vocab", "n_head", "n_head_kv", "head_dim", "rope_dims",
                      "ssm_conv_kernel", "ssm_state_size", "ssm_group_count", "ssm_time_step_rank", "n_ctx_train"):
            assert getattr(native_hp, field) == getattr(hp, field), field
        for field in ("rope_freq_base", "rms_eps"):  # float32 in the ABI
            assert getattr(native_hp, field) == float(np.float32(getattr(hp, field))), field
        assert [native_hp.layer_is_recurrent[i] for i in range(hp.n_layer)] == [int(r) for r in hp.layer_is_recurrent]

        rng = np.random.default_rng(7)
        prompt = rng.integers(0, hp.n_vocab, size=23).tolist()
        expected = new_context(python_model).eval(prompt, logits_all=True)
        got = new_context(native_model).eval(prompt, logits_all=True)
        assert np.isfinite(expected).all()
        assert np.array_equal(got, expected)

        # a tree verify after the prompt, and the context after accepting a path
        tokens = rng.integers(0, hp.n_vocab, size=5).tolist()
        parents = [-1, 0, 1, 0, 3]
        results = []
        for model in (python_model, native_model):
            ctx = new_context(model, max_tree_nodes=8)
            ctx.eval(prompt)
            argmax, logits = ctx.verify_tree(tokens, parents, want_logits=True)
            ctx.accept([0, 3, 4])
            results.append((argmax, logits, ctx.eval([int(argmax[4])])))
        for a, b in zip(results[0], results[1]):
            assert np.array_equal(a, b)
    finally:
        python_model.close()
        native_model.close()


def test_mtp_blocks_are_ignored_by_both(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_minimal_qwen35(path, nextn=1, extra_tensors={"blk.4.nextn.eh_proj.weight": ((3, 5), QT.I8)})
    native_model = NativeLoadedModel(path)
    try:
        assert native_model.hparams.n_layer == ModelFile.open(path).hparams.n_layer == 4
    finally:
        native_model.close()


def test_model_hparams_and_load_refuse_null_arguments():
    assert _native.lib.specla_model_load_gguf(None, ctypes.byref(ctypes.c_void_p())) == _native.ERR_INVALID_ARGUMENT
    assert "NULL" in _native.last_error()
    assert _native.lib.specla_model_hparams(None, ctypes.byref(_native.HParams())) == _native.ERR_INVALID_ARGUMENT


# ------------------------------------------------------------------------------------------------
# Bad files: both loaders refuse, naming the same key or tensor
# ------------------------------------------------------------------------------------------------

BROKEN = {
    "missing key": {"kv": {"qwen35.ssm.state_size": DROP}},
    "missing architecture": {"kv": {"general.architecture": DROP}},
    "wrong architecture": {"kv": {"general.architecture": "llama"}},
    "qwen35moe": {"kv": {"general.architecture": "qwen35moe"}},
    "string for an integer": {"kv": {"qwen35.block_count": "four"}},
    "float for an integer": {"kv": {"qwen35.embedding_length": 1.5}},
    "bool for an integer": {"kv": {"qwen35.ssm.state_size": True}},
    "string for a float": {"kv": {"qwen35.attention.layer_norm_rms_epsilon": "tiny"}},
    "strings for sections": {"kv": {"qwen35.rope.dimension_sections": ["a", "b", "c", "d"]}},
    "floats for recurrent flags": {"kv": {"qwen35.attention.recurrent_layers": [1.0, 2.0, 3.0, 4.0]}},
    "nested array": {"kv": {"general.weird": Typed([[1, 2], [3]], GGUFValueType.ARRAY, GGUFValueType.ARRAY)}},
    "value_length differs": {"kv": {"qwen35.attention.value_length": 16}},
    "inner_size": {"kv": {"qwen35.ssm.inner_size": 95}},
    "group_count": {"Hk": 4},
    "head_count_kv": {"nkv": 3, "nh": 2},
    "odd rope dims": {"rope_dims": 15},
    "rope dims above head dim": {"rope_dims": 64},
    "no trunk layer": {"kv": {"qwen35.nextn_predict_layers": 4}},
    "short recurrent flags": {"recurrent_layers": [True, True, False]},
    "4th rope section": {"kv": {"qwen35.rope.dimension_sections": Typed([8, 0, 0, 0], GGUFValueType.ARRAY,
                                                                         GGUFValueType.INT32)}},
    "3 rope sections": {"kv": {"qwen35.rope.dimension_sections": Typed([3, 3, 2], GGUFValueType.ARRAY,
                                                                        GGUFValueType.INT32)}},
    "interval 0": {"kv": {"qwen35.full_attention_interval": 0}},
    "negative eps": {"kv": {"qwen35.attention.layer_norm_rms_epsilon": -1.0}},
    "vocab_size": {"kv": {"qwen35.vocab_size": 41}},
    "token list": {"kv": {"tokenizer.ggml.tokens": [f"t{i}" for i in range(39)]}},
    "every layer recurrent": {"recurrent_layers": [True, True, True, True]},
    "per-layer values vary": {"kv": {"qwen35.feed_forward_length": [96, 96, 96, 128]}},
    "missing layer tensor": {"drop_tensors": ["blk.1.ssm_conv1d.weight"]},
    "missing attention tensor": {"drop_tensors": ["blk.3.attn_k_norm.weight"]},
    "missing token_embd": {"drop_tensors": ["token_embd.weight"]},
    "missing output_norm": {"drop_tensors": ["output_norm.weight"]},
    "wrong shape": {"shapes": {"blk.1.attn_gate.weight": (64, 95)}},
    "transposed": {"shapes": {"blk.0.ffn_down.weight": (64, 96)}},
    "vector as matrix": {"shapes": {"output_norm.weight": (64, 2)}},
    "token_embd width": {"shapes": {"token_embd.weight": (32, 40)}},
    "unsupported type": {"types": {"blk.0.ffn_up.weight": QT.Q8_1}},
    "unsupported I8": {"types": {"blk.3.attn_v.weight": QT.I8}},
    "norm not F32": {"types": {"blk.3.attn_q_norm.weight": QT.F16}},
    "conv not F32": {"types": {"blk.0.ssm_conv1d.weight": QT.F16}},
    "row not whole blocks": {"types": {"blk.0.ffn_gate.weight": QT.Q4_K}},
    "fused qkv": {"extra_tensors": {"blk.3.attn_qkv.weight": ((64, 192), QT.F32)}},
    "bias in qwen35": {"extra_tensors": {"blk.3.attn_q.bias": ((64,), QT.F32)}},
    "attention tensor in a recurrent layer": {"extra_tensors": {"blk.0.attn_q.weight": ((64,), QT.F32)}},
    "unknown global tensor": {"extra_tensors": {"rope_freqs.weight": ((64,), QT.F32)}},
    "block beyond block_count": {"extra_tensors": {"blk.9.attn_norm.weight": ((64,), QT.F32)}},
    "big-endian": {"big_endian": True},
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_bad_file_is_refused_by_both_naming_the_same_key_or_tensor(tmp_path, case):
    path = str(tmp_path / "bad.gguf")
    write_minimal_qwen35(path, **BROKEN[case])
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    python_message = str(info.value)
    message = native_load_error(path)
    assert message.startswith(f"{path}: "), message
    named = re.findall(r"'([^']*)'", python_message[len(path):])
    if named:  # the first key or tensor the Python message names
        assert f"'{named[0]}'" in message, (message, python_message)
    else:
        assert "big-endian" in python_message and "big-endian" in message, (message, python_message)


@pytest.mark.parametrize(
    "content, words",
    [(None, "cannot open file"), (b"", "not a GGUF file (empty file)"), (b"GG", "not a GGUF file (only 2 bytes long)"),
     (b"hello, I am not a model\n", "not a GGUF file")],
    ids=["missing", "empty", "short", "text"],
)
def test_not_a_gguf(tmp_path, content, words):
    path = str(tmp_path / "x.gguf")
    if content is not None:
        with open(path, "wb") as f:
            f.write(content)
    message = native_load_error(path)
    assert message.startswith(f"{path}: ") and words in message, message


def test_unsupported_gguf_version(tmp_path):
    path = str(tmp_path / "v.gguf")
    write_minimal_qwen35(path)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write((1).to_bytes(4, "little"))
    assert "GGUF version 1 is not supported" in native_load_error(path)


# Loads each path with the C loader; one line per file, flushed, so a crash or hang shows which.
_CHILD = textwrap.dedent(
    """
    import ctypes, os, sys
    from pyspecla import _native
    status = 0
    for path in sys.argv[1:]:
        handle = ctypes.c_void_p()
        if _native.lib.specla_model_load_gguf(os.fsencode(path), ctypes.byref(handle)) == 0:
            print("LOADED", path, flush=True)
            _native.lib.specla_model_free(handle)
            status = 3
        else:
            print("ERROR:", _native.last_error(), flush=True)
    sys.exit(status)
    """
)


def test_truncated_and_corrupt_files_are_refused_without_a_crash(tmp_path):
    valid = str(tmp_path / "valid.gguf")
    write_minimal_qwen35(valid)
    variants = _variants(valid, tmp_path)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    paths = list(variants.values())
    child = subprocess.run([sys.executable, "-c", _CHILD, *paths], cwd=REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    lines = child.stdout.splitlines()
    labels = {p: label for label, p in variants.items()}
    failures = [f"rc={child.returncode} stderr={child.stderr.strip()[-500:]!r}"] if child.returncode else []
    for i, p in enumerate(paths):
        if i >= len(lines):
            failures.append(f"{labels[p]}: no result")
            break
        if not lines[i].startswith(f"ERROR: {p}: "):
            failures.append(f"{labels[p]}: {lines[i]!r}")
    assert not failures, "\n".join(failures)
