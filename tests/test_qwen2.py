"""qwen2 (Qwen2 / Qwen2.5) on the Python side: ModelFile reads and validates qwen2 GGUFs (the same
Qwen35HParams with arch "qwen2"), maps native layer fields to qwen2 tensor names, rejects bad files
with one GGUFError naming the key or tensor; the synthetic qwen2 writer makes files llama.cpp loads,
with llama-quantize's Q4_K_M placement; the numpy reference computes llama.cpp's logits."""

from __future__ import annotations

import ast
import ctypes
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFWriter

from pyspecla.arch import LAYER_TENSORS
from pyspecla.errors import GGUFError
from pyspecla.loader.target import ModelFile
from pyspecla.reference.forward import ReferenceModel
from pyspecla.testing.models import QWEN2_PRESETS, tensor_type, use_more_bits, write_test_model

REPO_ROOT = Path(__file__).resolve().parent.parent
REAL_05B = Path.home() / ".cache/pyspecla/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
BIAS_FIELDS = ("attn_q_bias", "attn_k_bias", "attn_v_bias")


def _native_layer_fields() -> tuple[str, ...]:
    """pyspecla._native.LAYER_FIELDS (the specla_layer_weights fields in struct order), read from
    the source (importing _native loads the native library, which is not what these tests are about)."""
    tree = ast.parse((REPO_ROOT / "pyspecla" / "_native.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYER_FIELDS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("LAYER_FIELDS not found in pyspecla/_native.py")


def _all_fields() -> list[str]:
    return list(_native_layer_fields())


def test_every_architecture_table_names_exactly_the_native_fields():
    # one table per architecture, each covering every field of the native layer struct (a field
    # added to the struct but to no table, or a table entry the struct lacks, fails here)
    assert set(BIAS_FIELDS) <= set(_native_layer_fields())
    for arch, table in LAYER_TENSORS.items():
        assert list(table) == list(_native_layer_fields()), arch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen2")


@pytest.fixture(scope="module")
def tiny_f32(model_dir):
    return write_test_model(model_dir / "qwen2-tiny-f32.gguf", "tiny", "f32", seed=0, arch="qwen2")


# ------------------------------------------------------------------------------------------------
# The synthetic file loads
# ------------------------------------------------------------------------------------------------


def test_synthetic_qwen2_loads_with_expected_hparams(tiny_f32):
    with ModelFile.open(tiny_f32) as model:
        hp = model.hparams
        assert model.arch == hp.arch == "qwen2"
        assert (hp.n_layer, hp.n_layer_file, hp.nextn_predict_layers) == (4, 4, 0)
        assert (hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_ctx_train) == (256, 512, 1024, 4096)
        assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims) == (8, 2, 32, 32)
        assert hp.rope_freq_base == 1e6 and hp.rope_sections == (0, 0, 0, 0)
        assert hp.rms_eps == pytest.approx(1e-6)
        assert (hp.ssm_conv_kernel, hp.ssm_state_size, hp.ssm_group_count, hp.ssm_time_step_rank,
                hp.ssm_inner_size, hp.conv_channels) == (0, 0, 0, 0, 0, 0)
        assert hp.layer_is_recurrent == (False,) * 4
        assert model.tied_output is True
        assert model.metadata["tokenizer.ggml.pre"] == "qwen2"
        assert model.tensor("blk.0.attn_q.bias").ne == (256,)
        assert model.tensor("blk.0.attn_k.bias").ne == (64,)


def test_layer_tensor_name_maps_native_fields_to_qwen2_names(tiny_f32):
    expected = {
        "attn_norm": "attn_norm.weight",
        "post_attention_norm": "ffn_norm.weight",
        "attn_q": "attn_q.weight",
        "attn_k": "attn_k.weight",
        "attn_v": "attn_v.weight",
        "attn_output": "attn_output.weight",
        "ffn_gate": "ffn_gate.weight",
        "ffn_up": "ffn_up.weight",
        "ffn_down": "ffn_down.weight",
        "attn_q_bias": "attn_q.bias",
        "attn_k_bias": "attn_k.bias",
        "attn_v_bias": "attn_v.bias",
    }
    with ModelFile.open(tiny_f32) as model:
        for il in range(model.hparams.n_layer):
            mapped = set()
            for field in _all_fields():
                name = model.layer_tensor_name(il, field)
                if field in expected:
                    assert name == f"blk.{il}.{expected[field]}"
                    assert name in model.tensors
                    mapped.add(name)
                else:
                    assert name is None, field
            # every tensor of the layer is reachable through exactly one field
            assert mapped == {n for n in model.tensors if n.startswith(f"blk.{il}.")}
        with pytest.raises(ValueError, match="unknown layer tensor field"):
            model.layer_tensor_name(0, "attn_qkv_bias")
        with pytest.raises(ValueError, match="outside"):
            model.layer_tensor_name(4, "attn_q")
        with pytest.raises(ValueError, match="outside"):
            model.layer_tensor_name(-1, "attn_q")


def test_layer_tensor_name_for_qwen35_maps_every_layer_tensor_once(model_dir):
    path = write_test_model(model_dir / "qwen35-tiny-f32.gguf", "tiny", "f32", seed=0)
    with ModelFile.open(path) as model:
        assert model.arch == model.hparams.arch == "qwen35"
        for il in (0, 3):
            recurrent = model.hparams.layer_is_recurrent[il]
            names = {field: model.layer_tensor_name(il, field) for field in _all_fields()}
            for field in BIAS_FIELDS:
                assert names[field] is None
            # the name depends on the architecture only; this layer's type decides which exist
            present = {n for n in names.values() if n is not None and n in model.tensors}
            assert present == {n for n in model.tensors if n.startswith(f"blk.{il}.")}
            assert len(present) == (14 if recurrent else 11)
            assert names["attn_qkv"] == f"blk.{il}.attn_qkv.weight"
            assert names["post_attention_norm"] == f"blk.{il}.post_attention_norm.weight"
            assert names["ssm_dt_bias"] == f"blk.{il}.ssm_dt.bias" and names["ssm_a"] == f"blk.{il}.ssm_a"


# ------------------------------------------------------------------------------------------------
# Bad qwen2 files
# ------------------------------------------------------------------------------------------------

E, F, NH, NKV, D, V, N_LAYER = 64, 96, 4, 2, 16, 40, 2
DROP = object()


def _qwen2_tensors(n_layer: int = N_LAYER) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape (GGUF ne reversed)."""
    shapes = {"token_embd.weight": (V, E), "output_norm.weight": (E,)}
    for i in range(n_layer):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (E,),
            b + "attn_q.weight": (NH * D, E),
            b + "attn_k.weight": (NKV * D, E),
            b + "attn_v.weight": (NKV * D, E),
            b + "attn_q.bias": (NH * D,),
            b + "attn_k.bias": (NKV * D,),
            b + "attn_v.bias": (NKV * D,),
            b + "attn_output.weight": (E, NH * D),
            b + "ffn_norm.weight": (E,),
            b + "ffn_gate.weight": (F, E),
            b + "ffn_up.weight": (F, E),
            b + "ffn_down.weight": (E, F),
        })
    return shapes


def write_minimal_qwen2(path, *, kv=None, drop=(), shapes=None, f16=(), extra=None, arch="qwen2"):
    """A tiny random F32 qwen2 file (2 layers, E 64, nh 4, nkv 2, D 16, V 40), broken as asked:
    kv overrides '<arch>.' keys (DROP leaves one out), drop leaves tensors out, shapes replaces numpy
    shapes, f16 stores those tensors as F16, extra adds tensors {name: numpy shape}."""
    keys = {
        "block_count": N_LAYER, "context_length": 512, "embedding_length": E, "feed_forward_length": F,
        "attention.head_count": NH, "attention.head_count_kv": NKV, "rope.freq_base": 1e6,
        "attention.layer_norm_rms_epsilon": 1e-6,
    }
    keys.update(kv or {})
    tensors = _qwen2_tensors()
    tensors.update(shapes or {})
    tensors.update(extra or {})
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), arch)
    for name, value in keys.items():
        if value is DROP:
            continue
        if isinstance(value, float):
            writer.add_float32(f"{arch}.{name}", value)
        else:
            writer.add_uint32(f"{arch}.{name}", value)
    for name, shape in tensors.items():
        if name in drop:
            continue
        values = rng.standard_normal(shape).astype(np.float32)
        writer.add_tensor(name, values.astype(np.float16) if name in f16 else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def load_error(path, **kwargs) -> str:
    write_minimal_qwen2(path, **kwargs)
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "model.gguf")


def test_minimal_qwen2_loads(path):
    write_minimal_qwen2(path)
    with ModelFile.open(path) as model:
        hp = model.hparams
        assert (model.arch, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims) == ("qwen2", 2, 4, 2, 16, 16)
        assert model.tied_output


def test_minimal_qwen2_untied_and_explicit_keys_load(path):
    write_minimal_qwen2(path, extra={"output.weight": (V, E)},
                        kv={"attention.key_length": D, "attention.value_length": D, "rope.dimension_count": D})
    with ModelFile.open(path) as model:
        assert not model.tied_output and model.hparams.rope_dims == D


def test_head_count_kv_defaults_to_head_count(path):
    write_minimal_qwen2(path, kv={"attention.head_count_kv": DROP},
                        shapes={f"blk.{i}.{n}": s for i in range(N_LAYER)
                                for n, s in (("attn_k.weight", (NH * D, E)), ("attn_v.weight", (NH * D, E)),
                                             ("attn_k.bias", (NH * D,)), ("attn_v.bias", (NH * D,)))})
    with ModelFile.open(path) as model:
        assert model.hparams.n_head_kv == NH


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                                 "context_length", "attention.layer_norm_rms_epsilon"])
def test_missing_required_key(path, key):
    assert f"missing required key 'qwen2.{key}'" in load_error(path, kv={key: DROP})


def test_rope_dimension_count_must_be_the_head_dim(path):
    message = load_error(path, kv={"rope.dimension_count": D // 2})
    assert "'qwen2.rope.dimension_count'" in message and "whole head" in message


def test_head_count_kv_must_divide_head_count(path):
    message = load_error(path, kv={"attention.head_count_kv": 3})
    assert "'qwen2.attention.head_count_kv'" in message and "does not divide" in message


@pytest.mark.parametrize("name", ["blk.1.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias",
                                  "blk.1.ffn_norm.weight", "output_norm.weight", "blk.0.attn_output.weight"])
def test_missing_tensor(path, name):
    message = load_error(path, drop=(name,))
    assert f"missing tensor '{name}'" in message


@pytest.mark.parametrize("name,shape", [
    ("blk.0.attn_q.bias", (NKV * D,)),
    ("blk.1.attn_k.bias", (NH * D,)),
    ("blk.0.attn_q.weight", (2 * NH * D, E)),  # the qwen35 layout (query + gate) is not qwen2's
    ("blk.0.attn_v.weight", (NH * D, E)),
    ("blk.1.ffn_down.weight", (F, E)),
])
def test_wrong_tensor_shape(path, name, shape):
    message = load_error(path, shapes={name: shape})
    assert f"tensor '{name}' (layer {name.split('.')[1]}) has shape" in message
    assert f"ne={list(reversed(shape))}" in message


@pytest.mark.parametrize("name", ["blk.0.attn_k.bias", "blk.1.ffn_norm.weight"])
def test_one_dimensional_tensors_must_be_f32(path, name):
    assert f"tensor '{name}' has type F16; it must be F32" in load_error(path, f16=(name,))


def test_f16_matrices_are_fine(path):
    f16 = ("blk.0.attn_q.weight", "token_embd.weight")
    write_minimal_qwen2(path, f16=f16)
    with ModelFile.open(path) as model:
        for name in f16:
            view = model.tensor(name)
            assert view.type_name == "F16" and view.nbytes == 2 * int(np.prod(view.ne)), name
        assert model.tensor("blk.1.attn_q.weight").type_name == "F32"


@pytest.mark.parametrize("name", ["blk.0.attn_output.bias", "blk.1.attn_q_norm.weight", "blk.0.attn_qkv.weight",
                                  "blk.0.post_attention_norm.weight"])
def test_unknown_layer_tensor_is_rejected(path, name):
    message = load_error(path, extra={name: (E,)})
    assert f"unexpected tensor '{name}' in layer 0" in message or f"unexpected tensor '{name}' in layer 1" in message
    assert "not part of a qwen2 layer" in message


def test_tensor_beyond_block_count_and_foreign_global_are_rejected(path, tmp_path):
    message = load_error(path, extra={"blk.2.attn_norm.weight": (E,)})
    assert "unexpected tensor 'blk.2.attn_norm.weight'" in message and "block_count 2" in message
    other = str(tmp_path / "other.gguf")
    message = load_error(other, extra={"rope_freqs.weight": (D // 2,)})
    assert "unexpected tensor 'rope_freqs.weight': not part of a qwen2 model" in message


def test_other_architectures_still_rejected(path):
    message = load_error(path, arch="llama")
    assert "architecture 'llama' is not supported" in message and "qwen2" in message


# ------------------------------------------------------------------------------------------------
# Reference forward
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_reference_prefill_equals_token_by_token(model_dir, preset):
    path = write_test_model(model_dir / f"qwen2-{preset}-f32.gguf", preset, "f32", seed=0, arch="qwen2")
    model = ReferenceModel.from_gguf(path)
    assert model.hp.arch == "qwen2" and model.hp.layer_is_recurrent == [False] * QWEN2_PRESETS[preset].n_layer
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 1024, 24)]
    full = model.forward(model.new_state(), tokens)
    state = model.new_state()
    steps = np.concatenate([model.forward(state, [t]) for t in tokens])
    np.testing.assert_allclose(steps, full, atol=1e-5, rtol=0)
    assert state.n_past == len(tokens)
    # the logits are neither flat nor one token
    assert full.std(axis=1).mean() > 1.0 and len(set(full.argmax(1).tolist())) > 8


def _llama_logits(llama_cpp, path, tokens, split):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=64, logits_all=True, flash_attn=False,
                          type_k=0, type_v=0, n_threads=2, verbose=False)
    try:
        llm.reset()
        llm.eval(tokens[:split])
        llm.eval(tokens[split:])
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


@pytest.mark.llama
@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_reference_logits_match_llama_cpp(model_dir, preset):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_test_model(model_dir / f"qwen2-{preset}-f32.gguf", preset, "f32", seed=0, arch="qwen2")
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, 1024, 40)]
    expected = _llama_logits(llama_cpp, path, tokens, split=25)

    model = ReferenceModel.from_gguf(path)
    state = model.new_state()
    got = np.concatenate([model.forward(state, tokens[:25]), model.forward(state, tokens[25:])])
    max_diff = float(np.abs(got - expected).max())
    print(f"qwen2 {preset}: max |logit reference - llama.cpp| over {len(tokens)} tokens = {max_diff:.3g}")
    assert got.shape == expected.shape == (40, 1024)
    assert max_diff <= 1e-3
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))


# ------------------------------------------------------------------------------------------------
# Quant placement, llama.cpp loading, the CLI
# ------------------------------------------------------------------------------------------------


def test_q4_k_m_placement(model_dir):
    path = write_test_model(model_dir / "qwen2-tiny-q4_k_m.gguf", "tiny", "q4_k_m", seed=0, arch="qwen2")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["token_embd.weight"] == "Q6_K" and "output.weight" not in types  # tied
    for i in range(4):
        more = "Q6_K" if use_more_bits(i, 4) else "Q4_K"
        b = f"blk.{i}."
        assert types[b + "attn_v.weight"] == types[b + "ffn_down.weight"] == more
        assert types[b + "attn_q.weight"] == types[b + "attn_k.weight"] == types[b + "attn_output.weight"] == "Q4_K"
        assert types[b + "ffn_gate.weight"] == types[b + "ffn_up.weight"] == "Q4_K"
        for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_norm.weight", "ffn_norm.weight"):
            assert types[b + n] == "F32"
    with ModelFile.open(path) as model:
        assert model.arch == "qwen2"
    assert tensor_type("blk.0.attn_q.bias", 1, "q4_k_m", 4) == gguf.GGMLQuantizationType.F32


@pytest.mark.llama
@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
@pytest.mark.parametrize("quant,ftype", [("q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M"), ("q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"),
                                         ("f16", "LLAMA_FTYPE_MOSTLY_F16")])
def test_quant_placement_matches_llama_quantize_and_llama_cpp_loads_it(model_dir, preset, quant, ftype):
    llama_cpp = pytest.importorskip("llama_cpp")
    source = write_test_model(model_dir / f"qwen2-{preset}-f32.gguf", preset, "f32", seed=0, arch="qwen2")
    ours = write_test_model(model_dir / f"qwen2-{preset}-{quant}.gguf", preset, quant, seed=0, arch="qwen2")
    theirs = model_dir / f"qwen2-{preset}-{quant}-llama-quantize.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(theirs).encode(), ctypes.byref(params)) == 0

    def types(p):
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(p)).tensors}

    assert types(ours) == types(theirs)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 1024, 12)]
    logits = _llama_logits(llama_cpp, ours, tokens, split=8)
    assert np.isfinite(logits).all() and logits.std() > 1.0


def test_same_arguments_write_identical_bytes_and_the_cli_matches(tmp_path):
    a, cli = tmp_path / "a.gguf", tmp_path / "cli.gguf"
    write_test_model(a, "tiny", "q8_0", seed=2, arch="qwen2")
    tool = str(REPO_ROOT / "tools" / "make_test_model.py")
    result = subprocess.run([sys.executable, tool, "--arch", "qwen2", "--preset", "tiny", "--quant", "q8_0",
                             "--seed", "2", "--out", str(cli)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert a.read_bytes() == cli.read_bytes()
    bad = subprocess.run([sys.executable, tool, "--arch", "qwen2", "--kind", "dflash-draft", "--target", str(a),
                          "--out", str(tmp_path / "x.gguf")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--arch qwen2" in bad.stderr


def test_write_test_model_rejects_mismatched_arch(tmp_path):
    with pytest.raises(ValueError, match="qwen2 preset"):
        write_test_model(tmp_path / "x.gguf", QWEN2_PRESETS["tiny"], "f32", arch="qwen35")
    with pytest.raises(ValueError, match="unknown arch"):
        write_test_model(tmp_path / "x.gguf", "tiny", "f32", arch="llama")


# ------------------------------------------------------------------------------------------------
# The real Qwen2.5-Coder 0.5B file
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not REAL_05B.exists(), reason=f"{REAL_05B} not present")
def test_real_qwen25_05b_opens_with_the_right_hparams():
    with ModelFile.open(REAL_05B) as model:
        hp = model.hparams
        assert model.arch == hp.arch == "qwen2"
        assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_vocab) == (24, 896, 14, 2, 4864, 151936)
        assert (hp.head_dim, hp.rope_dims, hp.rope_freq_base) == (64, 64, 1e6)
        assert hp.rms_eps == pytest.approx(1e-6) and hp.n_ctx_train == 32768
        assert hp.layer_is_recurrent == (False,) * 24
        for il in (0, 23):
            for field in _all_fields():
                name = model.layer_tensor_name(il, field)
                assert name is None or name in model.tensors
        assert model.tensor("blk.0.attn_k.bias").ne == (128,)
        assert model.tensor(model.layer_tensor_name(5, "post_attention_norm")).type_name == "F32"


# ------------------------------------------------------------------------------------------------
# qwen3: the qwen2 layer with per-head q/k norms instead of the biases
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_f32(model_dir):
    return write_test_model(model_dir / "qwen3-tiny-f32.gguf", "tiny", "f32", seed=0, arch="qwen3")


def test_synthetic_qwen3_loads_and_maps_its_layer_tensors(qwen3_f32):
    with ModelFile.open(qwen3_f32) as model:
        hp = model.hparams
        assert model.arch == hp.arch == "qwen3"
        # the head dim comes from key_length: 8 heads of 64 on a 256-wide model
        assert (hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims) == (256, 8, 2, 64, 64)
        assert hp.layer_is_recurrent == (False,) * 4 and hp.conv_channels == 0
        assert model.metadata["tokenizer.ggml.pre"] == "qwen2"
        expected = {"attn_norm": "attn_norm.weight", "post_attention_norm": "ffn_norm.weight",
                    "attn_q": "attn_q.weight", "attn_k": "attn_k.weight", "attn_v": "attn_v.weight",
                    "attn_output": "attn_output.weight", "attn_q_norm": "attn_q_norm.weight",
                    "attn_k_norm": "attn_k_norm.weight", "ffn_gate": "ffn_gate.weight",
                    "ffn_up": "ffn_up.weight", "ffn_down": "ffn_down.weight"}
        for il in range(hp.n_layer):
            names = {field: model.layer_tensor_name(il, field) for field in _all_fields()}
            assert {f: n for f, n in names.items() if n} == {f: f"blk.{il}.{s}" for f, s in expected.items()}
            assert set(names.values()) - {None} == {n for n in model.tensors if n.startswith(f"blk.{il}.")}
        assert model.tensor("blk.0.attn_q.weight").ne == (256, 512)
        assert model.tensor("blk.0.attn_q_norm.weight").ne == (64,)


def _rewrite(src, dst, drop=(), add=None):
    """Copy a GGUF (keys and tensors) without the tensors in `drop`, plus `add` {name: array}."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, array in (add or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_bad_qwen3_files_are_one_clear_error(qwen3_f32, tmp_path):
    missing = _rewrite(qwen3_f32, tmp_path / "no-norm.gguf", drop=("blk.1.attn_k_norm.weight",))
    with pytest.raises(GGUFError, match=r"missing tensor 'blk.1.attn_k_norm.weight' \(layer 1\)"):
        ModelFile.open(missing)
    biased = _rewrite(qwen3_f32, tmp_path / "bias.gguf", add={"blk.0.attn_q.bias": np.zeros(512, np.float32)})
    with pytest.raises(GGUFError, match="unexpected tensor 'blk.0.attn_q.bias' in layer 0: not part of a qwen3 layer"):
        ModelFile.open(biased)
