"""pyspecla.loader.target: a valid qwen35 GGUF loads with the right hyper-parameters and zero-copy tensor
views; every kind of bad file fails with one GGUFError that starts with the path and names the key or
tensor at fault, and a truncated or corrupt file never crashes or hangs the process."""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import GGUFValueType

from gguf_fixtures import DROP, Typed, write_minimal_qwen35
from pyspecla.errors import GGUFError
from pyspecla.loader.target import SUPPORTED_TYPES, ModelFile, tensor_type_name

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "model.gguf")


def load_error(path: str, **overrides) -> str:
    """Write a fixture broken as asked, open it, return the GGUFError message."""
    write_minimal_qwen35(path, **overrides)
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


def _base_is_mmap(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


# ------------------------------------------------------------------------------------------------
# Valid files
# ------------------------------------------------------------------------------------------------


def test_valid_file_loads_with_expected_hparams(path):
    fx = write_minimal_qwen35(path)
    model = ModelFile.open(path)
    hp = model.hparams
    assert model.path == path and model.arch == "qwen35"
    assert (hp.n_layer, hp.n_layer_file, hp.nextn_predict_layers) == (4, 4, 0)
    assert (hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_ctx_train) == (64, 96, 40, 512)
    assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims) == (2, 1, 32, 16)
    assert hp.rope_freq_base == 1e7
    assert hp.rope_sections == (3, 3, 2, 0)
    assert hp.rms_eps == pytest.approx(1e-6)
    assert (hp.ssm_conv_kernel, hp.ssm_state_size, hp.ssm_group_count, hp.ssm_time_step_rank) == (4, 16, 2, 6)
    assert hp.ssm_inner_size == 96
    assert hp.conv_channels == 2 * 2 * 16 + 6 * 16 == fx.conv_channels
    assert hp.layer_is_recurrent == (True, True, True, False)
    assert model.tied_output is True
    assert model.optional_tensor("output.weight") is None
    assert set(model.tensors) == set(fx.written)

    # metadata: plain python values
    md = model.metadata
    assert md["general.architecture"] == "qwen35"
    assert md["qwen35.block_count"] == 4 and type(md["qwen35.block_count"]) is int
    assert md["qwen35.rope.dimension_sections"] == [3, 3, 2, 0]
    assert md["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(40)]
    assert type(md["qwen35.rope.freq_base"]) is float
    assert not any(key.startswith("GGUF.") for key in md)


def test_tensor_views_are_zero_copy_and_hold_the_written_values(path):
    fx = write_minimal_qwen35(path, tied=False)
    model = ModelFile.open(path)
    reader_map = model._reader.data
    for name, (ne, ggml_type) in fx.written.items():
        view = model.tensor(name)
        assert view.name == name and view.ne == ne and view.ggml_type == ggml_type == QT.F32
        assert view.data.dtype == np.uint8 and view.data.ndim == 1
        assert view.nbytes == view.data.nbytes == 4 * int(np.prod(ne))
        assert np.shares_memory(view.data, reader_map)
        assert _base_is_mmap(view.data)
        assert not view.data.flags.writeable
        values = view.data.view(np.float32).reshape(tuple(reversed(ne)))
        np.testing.assert_array_equal(values, fx.arrays[name])
    assert model.tied_output is False
    assert model.tensor("output.weight").ne == (64, 40)


def test_mtp_blocks_are_ignored_and_trunk_depth_excludes_them(path):
    # One appended MTP block: its tensors absent, and junk under its index must not matter either.
    write_minimal_qwen35(path, nextn=1, extra_tensors={"blk.4.nextn.eh_proj.weight": ((3, 5), QT.I8)})
    hp = ModelFile.open(path).hparams
    assert (hp.n_layer, hp.n_layer_file, hp.nextn_predict_layers) == (4, 5, 1)
    assert len(hp.layer_is_recurrent) == 4
    assert hp.layer_is_recurrent == (True, True, True, False)


def test_recurrent_layers_array_wins_over_the_interval(path):
    # The interval rule (4) would make layer 3 the attention layer; the array says layer 1.
    # It has one entry per block, MTP block included.
    write_minimal_qwen35(path, nextn=1, recurrent_layers=[True, False, True, True, False], full_attention_interval=4)
    hp = ModelFile.open(path).hparams
    assert hp.layer_is_recurrent == (True, False, True, True)


def test_interval_defaults_to_four_when_absent(path):
    write_minimal_qwen35(path, n_layers=8, full_attention_interval=None)
    assert ModelFile.open(path).hparams.layer_is_recurrent == (True, True, True, False) * 2


def test_two_layer_file_with_interval_two(path):
    write_minimal_qwen35(path, n_layers=2, full_attention_interval=2)
    hp = ModelFile.open(path).hparams
    assert hp.n_layer == 2 and hp.layer_is_recurrent == (True, False)


def test_optional_keys_take_llama_cpp_defaults(path):
    write_minimal_qwen35(
        path,
        kv={
            "qwen35.attention.head_count_kv": DROP,  # = head_count
            "qwen35.attention.key_length": DROP,  # = E / nh = 32
            "qwen35.attention.value_length": DROP,
            "qwen35.rope.freq_base": DROP,  # 10000
        },
        nkv=2,
    )
    hp = ModelFile.open(path).hparams
    assert (hp.n_head_kv, hp.head_dim, hp.rope_freq_base) == (2, 32, 10000.0)


def test_metadata_values_match_the_stock_reader_for_every_value_type(path):
    V = GGUFValueType
    extra = {
        "test.u8": Typed(200, V.UINT8), "test.i8": Typed(-100, V.INT8),
        "test.u16": Typed(60000, V.UINT16), "test.i16": Typed(-30000, V.INT16),
        "test.u32": Typed(4_000_000_000, V.UINT32), "test.i32": Typed(-2_000_000_000, V.INT32),
        "test.u64": Typed(2**63 + 5, V.UINT64), "test.i64": Typed(-(2**62), V.INT64),
        "test.f32": Typed(0.1, V.FLOAT32), "test.f64": Typed(0.1, V.FLOAT64),
        "test.bool": Typed(True, V.BOOL), "test.str": "grüße, 你好",
        "test.arr_u8": Typed([1, 2, 255], V.ARRAY, V.UINT8),
        "test.arr_i64": Typed([-(2**40), 7], V.ARRAY, V.INT64),
        "test.arr_f64": Typed([0.5, -1e300], V.ARRAY, V.FLOAT64),
        "test.arr_f32": Typed([0.1, 2.5], V.ARRAY, V.FLOAT32),
        "test.arr_bool": Typed([True, False, True], V.ARRAY, V.BOOL),
        "test.arr_str": ["a", "", "ü b", "<|im_end|>"],
    }
    write_minimal_qwen35(path, kv=extra)
    metadata = ModelFile.open(path).metadata
    stock = GGUFReader(path)
    expected = {k: f.contents() for k, f in stock.fields.items() if not k.startswith("GGUF.")}
    assert list(metadata) == list(expected)
    for key, value in expected.items():
        assert metadata[key] == value, key
        assert type(metadata[key]) is type(value), key
    assert metadata["test.u64"] == 2**63 + 5 and metadata["test.str"] == "grüße, 你好"
    assert metadata["test.f32"] == float(np.float32(0.1)) and metadata["test.f64"] == 0.1
    assert metadata["test.arr_bool"] == [True, False, True]


def test_per_layer_arrays_are_accepted_when_uniform(path):
    # head_count_kv as a per-block array with 0 on the recurrent layers (as hybrid converters write it)
    kv = {"qwen35.attention.head_count_kv": Typed([0, 0, 0, 1], GGUFValueType.ARRAY, GGUFValueType.INT32)}
    write_minimal_qwen35(path, kv=kv)
    assert ModelFile.open(path).hparams.n_head_kv == 1


def test_per_layer_arrays_that_vary_are_rejected(path):
    kv = {"qwen35.feed_forward_length": Typed([96, 96, 64, 96], GGUFValueType.ARRAY, GGUFValueType.INT32)}
    message = load_error(path, kv=kv)
    assert "'qwen35.feed_forward_length'" in message and "varies by layer" in message


def test_quantized_and_half_types_load_with_block_sized_nbytes(path):
    # E = 256 so K-quant rows (256 elements) fit.
    types = {
        "token_embd.weight": QT.Q6_K,
        "blk.0.attn_qkv.weight": QT.Q6_K,
        "blk.0.attn_gate.weight": QT.Q4_K,
        "blk.0.ffn_up.weight": QT.Q5_K,
        "blk.0.ffn_gate.weight": QT.Q8_0,
        "blk.1.ssm_alpha.weight": QT.F16,
        "blk.1.ssm_beta.weight": QT.BF16,
    }
    write_minimal_qwen35(path, E=256, types=types)
    model = ModelFile.open(path)
    sizes = {QT.Q6_K: (256, 210), QT.Q4_K: (256, 144), QT.Q5_K: (256, 176), QT.Q8_0: (32, 34),
             QT.F16: (1, 2), QT.BF16: (1, 2)}
    for name, t in types.items():
        view = model.tensor(name)
        block_elements, block_bytes = sizes[t]
        assert view.ggml_type == t and view.type_name == t.name
        assert view.nbytes == view.data.nbytes == int(np.prod(view.ne)) // block_elements * block_bytes
        assert np.shares_memory(view.data, model._reader.data)


def test_tensor_lookup_and_close(path):
    write_minimal_qwen35(path)
    with ModelFile.open(path) as model:
        view = model.tensor("blk.0.ssm_a")
        with pytest.raises(GGUFError, match=r"missing tensor 'blk\.0\.nope\.weight'") as info:
            model.tensor("blk.0.nope.weight")
        assert str(info.value).startswith(path)
        assert model.optional_tensor("blk.0.nope.weight") is None
    assert model.closed and model.tensors == {}
    with pytest.raises(GGUFError, match="closed"):
        model.tensor("blk.0.ssm_a")
    # A view taken before close still keeps its bytes alive.
    assert np.isfinite(view.data.view(np.float32)).all()


def test_type_names_and_supported_set():
    assert tensor_type_name(12) == "Q4_K" and tensor_type_name(QT.BF16) == "BF16"
    assert tensor_type_name(9999) == "unknown(9999)"
    assert {tensor_type_name(t) for t in SUPPORTED_TYPES} == {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                                                            "Q4_0", "Q4_1", "Q5_0", "Q5_1"}


def test_model_written_by_project_test_models_validates(tmp_path):
    testmodels = pytest.importorskip("pyspecla.testing.models")
    path = str(tmp_path / "tiny.gguf")
    testmodels.write_test_model(path, preset="tiny", quant="f32", seed=0)
    assert ModelFile.open(path).hparams.n_layer >= 1


# ------------------------------------------------------------------------------------------------
# Not a GGUF / unreadable container
# ------------------------------------------------------------------------------------------------


def test_text_file_is_not_a_gguf(path):
    with open(path, "w") as f:
        f.write("hello, I am not a model\n")
    with pytest.raises(GGUFError, match=r"not a GGUF file") as info:
        ModelFile.open(path)
    assert str(info.value).startswith(f"{path}: ")


def test_empty_file_is_not_a_gguf(path):
    open(path, "wb").close()
    with pytest.raises(GGUFError, match=r"not a GGUF file \(empty file\)") as info:
        ModelFile.open(path)
    assert str(info.value).startswith(f"{path}: ")


def test_file_shorter_than_the_magic(path):
    with open(path, "wb") as f:
        f.write(b"GG")
    with pytest.raises(GGUFError, match=r"not a GGUF file \(only 2 bytes long\)"):
        ModelFile.open(path)


def test_big_endian_file_is_rejected(path):
    message = load_error(path, big_endian=True)
    assert "big-endian" in message


def test_missing_file(path):
    with pytest.raises(GGUFError, match="cannot open") as info:
        ModelFile.open(path)
    assert str(info.value).startswith(f"{path}: ")


def test_truncated_tensor_data_is_reported(path):
    write_minimal_qwen35(path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(GGUFError, match=r"truncated") as info:
        ModelFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "outside the file" in message


def _patch_tensor_info(path: str, name: str, *, type_id: int | None = None, offset_delta: int = 0) -> None:
    """Rewrite one tensor-info entry in place: its type id and/or its data offset."""
    reader = GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == name)
    name_len = len(name.encode("utf-8"))
    type_at = tensor.field.offset + 8 + name_len + 4 + 8 * len(tensor.shape)
    old_offset = int(tensor.field.parts[-1][0])
    del reader, tensor
    with open(path, "r+b") as f:
        if type_id is not None:
            f.seek(type_at)
            f.write(struct.pack("<I", type_id))
        f.seek(type_at + 4)
        f.write(struct.pack("<Q", old_offset + offset_delta))


def test_tensor_offset_moved_into_its_neighbour_is_reported(path):
    write_minimal_qwen35(path)
    # output_norm.weight holds 256 bytes; moving it by 64 (still aligned) runs into the next tensor.
    _patch_tensor_info(path, "output_norm.weight", offset_delta=64)
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "overlap" in message, message
    assert "'output_norm.weight'" in message and "'blk.0.attn_norm.weight'" in message, message


def test_quantized_tensor_retyped_as_f32_is_reported(path):
    write_minimal_qwen35(path, E=256, types={"blk.0.attn_gate.weight": QT.Q4_K})
    _patch_tensor_info(path, "blk.0.attn_gate.weight", type_id=int(QT.F32))
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "overlap" in message, message
    assert "'blk.0.attn_gate.weight' (F32" in message, message
    reader = GGUFReader(path)  # the stock reader names the neighbour that follows it in the file
    names = [t.name for t in sorted(reader.tensors, key=lambda t: t.data_offset)]
    follower = names[names.index("blk.0.attn_gate.weight") + 1]
    del reader
    assert f"'{follower}'" in message, message


def test_two_tensors_at_the_same_offset_are_reported(path):
    write_minimal_qwen35(path)
    # blk.0.post_attention_norm.weight starts 256 bytes after blk.0.attn_norm.weight, both 256 long.
    _patch_tensor_info(path, "blk.0.post_attention_norm.weight", offset_delta=-256)
    message = str(pytest.raises(GGUFError, ModelFile.open, path).value)
    assert "overlap" in message and "'blk.0.attn_norm.weight'" in message
    assert "'blk.0.post_attention_norm.weight'" in message


def test_unsupported_gguf_version(path):
    write_minimal_qwen35(path)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", 1))
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    assert str(info.value).startswith(f"{path}: ") and "version" in str(info.value)


# ------------------------------------------------------------------------------------------------
# Architecture and metadata
# ------------------------------------------------------------------------------------------------


def test_wrong_architecture(path):
    message = load_error(path, arch="llama")
    assert "architecture 'llama' is not supported (expected qwen35)" in message


def test_qwen35moe_is_named_as_not_supported_yet(path):
    message = load_error(path, arch="qwen35moe")
    assert "'qwen35moe'" in message and "not supported yet" in message


def test_missing_architecture_key(path):
    message = load_error(path, kv={"general.architecture": DROP})
    assert "'general.architecture'" in message


REQUIRED_KEYS = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "rope.dimension_sections",
    "attention.layer_norm_rms_epsilon",
    "ssm.conv_kernel",
    "ssm.state_size",
    "ssm.group_count",
    "ssm.time_step_rank",
    "ssm.inner_size",
]


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_missing_required_key_is_named(path, key):
    message = load_error(path, kv={f"qwen35.{key}": DROP})
    assert f"missing required key 'qwen35.{key}'" in message


@pytest.mark.parametrize(
    "key, value",
    [
        ("qwen35.block_count", "four"),
        ("qwen35.embedding_length", 1.5),
        ("qwen35.ssm.state_size", True),
        ("qwen35.attention.layer_norm_rms_epsilon", "tiny"),
        ("qwen35.rope.dimension_sections", ["a", "b", "c", "d"]),
        ("qwen35.attention.recurrent_layers", [1.0, 2.0, 3.0, 4.0]),
    ],
)
def test_key_of_wrong_value_type_is_named(path, key, value):
    message = load_error(path, kv={key: value})
    assert f"'{key}'" in message


def test_nested_array_value_is_named(path):
    nested = Typed([[1, 2], [3]], GGUFValueType.ARRAY, GGUFValueType.ARRAY)
    message = load_error(path, kv={"general.weird": nested})
    assert "'general.weird'" in message and "nested" in message


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        ({"kv": {"qwen35.attention.value_length": 16}}, "qwen35.attention.value_length", "differs"),
        ({"kv": {"qwen35.ssm.inner_size": 95}}, "qwen35.ssm.inner_size", "expected"),
        ({"Hk": 4}, "qwen35.ssm.group_count", "does not divide"),  # Hv = 6
        ({"nkv": 3, "nh": 2}, "qwen35.attention.head_count_kv", "does not divide"),
        ({"rope_dims": 15}, "qwen35.rope.dimension_count", "even"),
        ({"rope_dims": 64}, "qwen35.rope.dimension_count", "at most"),  # D = 32
        ({"kv": {"qwen35.nextn_predict_layers": 4}}, "qwen35.nextn_predict_layers", "no trunk layer"),
        ({"recurrent_layers": [True, True, False]}, "qwen35.attention.recurrent_layers", "3 entries"),
        ({"nextn": 1, "recurrent_layers": [True, True, True, False]}, "qwen35.attention.recurrent_layers",
         "expected block_count = 5"),
        ({"kv": {"qwen35.rope.dimension_sections": Typed([8, 0, 0, 0], GGUFValueType.ARRAY, GGUFValueType.INT32)}},
         "qwen35.rope.dimension_sections", "4th position stream"),
        ({"kv": {"qwen35.rope.dimension_sections": Typed([3, 3, 2], GGUFValueType.ARRAY, GGUFValueType.INT32)}},
         "qwen35.rope.dimension_sections", "expected 4"),
        ({"kv": {"qwen35.full_attention_interval": 0}}, "qwen35.full_attention_interval", ">= 1"),
        ({"kv": {"qwen35.attention.layer_norm_rms_epsilon": -1.0}}, "qwen35.attention.layer_norm_rms_epsilon",
         "positive"),
        ({"kv": {"qwen35.vocab_size": 41}}, "qwen35.vocab_size", "differs"),
        ({"kv": {"tokenizer.ggml.tokens": [f"t{i}" for i in range(39)]}}, "tokenizer.ggml.tokens", "39 entries"),
    ],
)
def test_inconsistent_values_are_named(path, overrides, key, words):
    message = load_error(path, **overrides)
    assert f"'{key}'" in message and words in message, message


@pytest.mark.parametrize(
    "overrides",
    [
        {"recurrent_layers": [True, True, True, True]},
        {"full_attention_interval": 5},  # 4 layers: (i + 1) % 5 never 0
    ],
)
def test_file_without_attention_layer_is_rejected(path, overrides):
    message = load_error(path, **overrides)
    assert "at least one attention layer" in message
    assert "qwen35.attention.recurrent_layers" in message and "qwen35.full_attention_interval" in message


# ------------------------------------------------------------------------------------------------
# Tensors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["blk.3.attn_q.weight", "blk.0.ssm_a", "blk.1.ssm_dt.bias", "blk.2.ffn_down.weight", "token_embd.weight",
     "output_norm.weight", "blk.3.attn_k_norm.weight"],
)
def test_missing_tensor_is_named(path, name):
    message = load_error(path, drop_tensors=[name])
    assert f"missing tensor '{name}'" in message


def test_missing_tensor_message_says_the_layer_type(path):
    message = load_error(path, drop_tensors=["blk.1.ssm_conv1d.weight"])
    assert "recurrent layer 1" in message


@pytest.mark.parametrize(
    "name, bad, good",
    [
        ("blk.1.attn_gate.weight", (64, 95), (64, 96)),
        ("blk.3.attn_k.weight", (64, 64), (64, 32)),
        ("blk.0.ssm_conv1d.weight", (3, 160), (4, 160)),
        ("blk.2.ssm_norm.weight", (32,), (16,)),
        ("blk.3.attn_q.weight", (64, 64), (64, 128)),  # query without the interleaved gate
        ("blk.0.ffn_down.weight", (64, 96), (96, 64)),  # transposed
        ("output_norm.weight", (64, 2), (64,)),
    ],
)
def test_wrongly_shaped_tensor_gives_expected_and_actual(path, name, bad, good):
    message = load_error(path, shapes={name: bad})
    assert f"tensor '{name}'" in message
    assert f"ne={list(bad)}" in message and f"expected ne={list(good)}" in message, message


def test_token_embd_width_mismatch(path):
    message = load_error(path, shapes={"token_embd.weight": (32, 40)})
    assert "'token_embd.weight'" in message and "expected ne=[64, 40]" in message


def test_trailing_unit_dims_are_accepted_like_llama_cpp(path):
    write_minimal_qwen35(path, shapes={"output_norm.weight": (64, 1)})
    assert ModelFile.open(path).tensor("output_norm.weight").ne == (64, 1)


@pytest.mark.parametrize(
    "name, t",
    [("blk.0.ffn_up.weight", QT.Q8_1), ("blk.3.attn_v.weight", QT.I8), ("token_embd.weight", QT.IQ4_NL)],
)
def test_unsupported_tensor_type_is_named(path, name, t):
    message = load_error(path, types={name: t})
    assert f"tensor '{name}'" in message and f"unsupported type {t.name}" in message


@pytest.mark.parametrize(
    "name",
    ["blk.0.ssm_conv1d.weight", "blk.0.attn_norm.weight", "blk.1.ssm_a", "blk.2.ssm_dt.bias",
     "blk.3.attn_q_norm.weight", "output_norm.weight"],
)
def test_conv_and_vector_tensors_must_be_f32(path, name):
    message = load_error(path, types={name: QT.F16})
    assert f"tensor '{name}' has type F16; it must be F32" in message


def test_row_not_a_multiple_of_the_block(path):
    message = load_error(path, types={"blk.0.ffn_gate.weight": QT.Q4_K})  # rows of E = 64 < 256
    assert "'blk.0.ffn_gate.weight'" in message and "Q4_K" in message and "256" in message


def test_fused_qkv_in_attention_layer_is_not_supported_yet(path):
    message = load_error(path, extra_tensors={"blk.3.attn_qkv.weight": ((64, 192), QT.F32)})
    assert "'blk.3.attn_qkv.weight'" in message and "not supported yet" in message


@pytest.mark.parametrize(
    "name, words",
    [
        ("blk.3.attn_q.bias", "no biases"),
        ("blk.0.attn_q.weight", "recurrent layer 0"),
        ("rope_freqs.weight", "not part of a qwen35 model"),
        ("blk.9.attn_norm.weight", "block_count"),
    ],
)
def test_unexpected_tensor_is_named(path, name, words):
    message = load_error(path, extra_tensors={name: ((64,), QT.F32)})
    assert f"unexpected tensor '{name}'" in message and words in message


# ------------------------------------------------------------------------------------------------
# Truncated and corrupt files: always a GGUFError, never a crash or a hang (in a subprocess)
# ------------------------------------------------------------------------------------------------

# Loads each path given; one line per file, flushed, so a crash or hang shows which file did it.
_CHILD = textwrap.dedent(
    """
    import sys
    from pyspecla.errors import GGUFError
    from pyspecla.loader.target import ModelFile
    status = 0
    for path in sys.argv[1:]:
        try:
            ModelFile.open(path)
            print("LOADED", path, flush=True)
            status = 3
        except GGUFError as e:
            print("GGUFError:", e, flush=True)
    sys.exit(status)
    """
)


def _variants(path: str, tmp_path) -> dict[str, str]:
    """label -> path of a damaged copy of the valid file at `path`."""
    reader = GGUFReader(path)
    with open(path, "rb") as f:
        blob = f.read()
    kv_start = 24
    tokens_field = reader.fields["tokenizer.ggml.tokens"]
    sections_field = reader.fields["qwen35.rope.dimension_sections"]
    tensor_info_start = reader.tensors[0].field.offset
    data_start = reader.data_offset
    del reader

    cuts = {
        "header: inside magic": 2,
        "header: inside version": 6,
        "header: inside counts": 17,
        "kv: first key": kv_start + 5,
        "kv: inside the sections array": sections_field.offset + 10,
        "kv: inside the tokens array": tokens_field.offset + 60,
        "tensor info: first": tensor_info_start + 3,
        "tensor info: middle": (tensor_info_start + data_start) // 2,
        "data: none at all": data_start,
        "data: one byte": data_start + 1,
        "data: middle": (data_start + len(blob)) // 2,
        "data: last byte missing": len(blob) - 1,
    }
    variants = {}
    for label, offset in cuts.items():
        variants[label] = blob[:offset]

    def patched(offset: int, fmt: str, value: int) -> bytes:
        b = bytearray(blob)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    def array_length_offset(field) -> int:  # key string, value type, element type, then the length
        return field.offset + 8 + len(field.name.encode()) + 4 + 4

    variants["corrupt: tensor count too large"] = patched(8, "<Q", 10**12)
    variants["corrupt: kv count too large"] = patched(16, "<Q", 10**12)
    variants["corrupt: numeric array length huge"] = patched(array_length_offset(sections_field), "<Q", 2**62)
    variants["corrupt: string array length huge"] = patched(array_length_offset(tokens_field), "<Q", 2**62)
    variants["corrupt: first key length huge"] = patched(kv_start, "<Q", 2**62)

    paths = {}
    for i, (label, data) in enumerate(variants.items()):
        p = str(tmp_path / f"damaged_{i}.gguf")
        with open(p, "wb") as f:
            f.write(data)
        paths[label] = p
    return paths


def test_truncated_and_corrupt_files_raise_gguf_error_in_a_subprocess(tmp_path):
    valid = str(tmp_path / "valid.gguf")
    write_minimal_qwen35(valid)
    variants = _variants(valid, tmp_path)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # One child per region of the file (header, kv, tensor info, data, corrupt), all at once.
    groups: dict[str, list[str]] = {}
    for label, p in variants.items():
        groups.setdefault(label.split(":")[0], []).append(p)
    children = {
        region: (paths, subprocess.Popen([sys.executable, "-c", _CHILD, *paths], cwd=REPO_ROOT, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for region, paths in groups.items()
    }
    labels = {p: label for label, p in variants.items()}
    failures = []
    for region, (paths, child) in children.items():
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            failures.append(f"{region}: hung (killed after 120 s); output so far: {out!r}")
            continue
        lines = out.splitlines()
        for i, p in enumerate(paths):
            if i >= len(lines):
                failures.append(f"{labels[p]}: no result (rc={child.returncode}, stderr={err.strip()[-500:]!r})")
                break
            if not lines[i].startswith(f"GGUFError: {p}: "):
                failures.append(f"{labels[p]}: {lines[i]!r}")
        if child.returncode != 0 or "Traceback" in err:
            failures.append(f"{region}: rc={child.returncode} stderr={err.strip()[-500:]!r}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------------------
# Non-finite weights (a draft's load check)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
                                   QT.Q4_K, QT.Q5_K, QT.Q6_K])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's dequantize of the poisoned blocks
def test_first_nonfinite_finds_the_poisoned_element_or_scale(qtype):
    """Random bytes with every float field made finite, then one float field poisoned; gguf's own
    dequantize is the oracle that the poisoned field is one the values are computed from."""
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES

    from pyspecla.gguf_container import _F16_SCALE_OFFSETS, TensorView, first_nonfinite

    rng = np.random.default_rng(int(qtype))
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = 7
    ne = (block_elements * n_blocks,)
    if qtype in (QT.F32, QT.F16, QT.BF16):
        dtype = {QT.F32: np.float32, QT.F16: np.float16}.get(qtype)
        values = rng.standard_normal(n_blocks).astype(np.float32)
        raw = values.astype(dtype).view(np.uint8) if dtype else (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        poison = [(3, np.nan), (5, np.inf), (0, -np.inf)]
    else:
        raw = rng.integers(0, 256, n_blocks * block_bytes, dtype=np.uint8)
        for b in range(n_blocks):
            for offset in _F16_SCALE_OFFSETS[qtype]:
                at = b * block_bytes + offset
                raw[at : at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        poison = [(b, v) for b, v in ((4, np.nan), (6, np.inf))]
    raw = np.ascontiguousarray(raw)
    view = TensorView("w", int(qtype), ne, raw, raw.nbytes)
    assert first_nonfinite(view) is None
    assert np.isfinite(quants.dequantize(raw, qtype)).all()
    for index, value in poison:
        offsets = _F16_SCALE_OFFSETS.get(qtype, [None])
        for offset in offsets:
            bad = raw.copy()
            if offset is None:  # a float tensor: element `index`
                item = bad.nbytes // n_blocks
                cell = np.array([value], np.float32)
                cell = cell.astype(np.float16) if qtype == QT.F16 else (
                    (cell.view(np.uint32) >> 16).astype(np.uint16) if qtype == QT.BF16 else cell)
                bad[index * item : (index + 1) * item] = cell.view(np.uint8)
                where = f"element {index}"
            else:
                at = index * block_bytes + offset
                bad[at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
                where = f"block {index}"
            assert first_nonfinite(TensorView("w", int(qtype), ne, bad, bad.nbytes)) == where
            assert not np.isfinite(quants.dequantize(bad, qtype)).all()
