"""tools/speed_model.py: the speed-only Q4_K_M / Q5_K_M / Q8_0 writer (random valid blocks, written in
parallel) makes files that load, decode to finite values of the intended spread, follow the type
rule, are byte-for-byte reproducible whatever the process count, say their mode, and give finite
logits in a forward pass."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import speed_model  # noqa: E402

from pyspecla.testing import models as testmodels  # noqa: E402

Q = GGMLQuantizationType


def q4_k_m_rule(name: str, n_dims: int, n_layer: int, tied: bool, base=Q.Q4_K) -> GGMLQuantizationType:
    """llama-quantize's Q4_K_M placement for qwen35, written out here independently of
    testmodels.tensor_type: Q6_K for output (token_embd when tied), and for attn_qkv, attn_v and
    ffn_down on layers where use_more_bits holds; F32 for ssm_conv1d and 1-D; Q4_K otherwise
    (`base`: Q5_K for Q5_K_M, whose Q6_K placements are the same)."""
    if n_dims == 1 or ".ssm_conv1d." in name:
        return Q.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    field = name.split(".")[-2]
    if field in ("attn_qkv", "attn_v", "ffn_down"):
        i = int(name.split(".")[1])
        more = i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2
        return Q.Q6_K if more else base
    return base


@pytest.fixture(scope="module")
def speed_files(tmp_path_factory):
    """tiny (tied head, 4 layers) and tiny8 (own head, 8 layers: use_more_bits picks layers 0, 2,
    5, 7), written with 2 processes; tiny8 once more with 1 process for the reproducibility test."""
    d = tmp_path_factory.mktemp("speed")
    files = {name: speed_model.write_speed_model(d / f"{name}.gguf", name, seed=3, jobs=2)
             for name in ("tiny", "tiny8")}
    files["tiny8-1proc"] = speed_model.write_speed_model(d / "tiny8-1proc.gguf", "tiny8", seed=3, jobs=1)
    files["tiny8-seed4"] = speed_model.write_speed_model(d / "tiny8-seed4.gguf", "tiny8", seed=4, jobs=2)
    for quant in ("q5_k_m", "q8_0"):
        files[f"tiny8-{quant}"] = speed_model.write_speed_model(d / f"tiny8-{quant}.gguf", "tiny8", seed=3, jobs=2,
                                                                quant=quant)
    return files


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_loads_with_the_normal_writers_names_shapes_and_metadata(speed_files, tmp_path, preset):
    from pyspecla.loader.target import ModelFile

    values = testmodels.write_test_model(tmp_path / "values.gguf", preset, "q4_k_m", seed=3)
    ours, theirs = ModelFile.open(str(speed_files[preset])), ModelFile.open(str(values))
    assert ours.hparams == theirs.hparams
    assert [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in ours.tensors.items()] == \
           [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in theirs.tensors.items()]
    extra = {k: v for k, v in ours.metadata.items() if k not in theirs.metadata}
    assert extra == {speed_model.MODE_KEY: speed_model.SPEED_ONLY}
    same = [k for k in theirs.metadata if k in ours.metadata and ours.metadata[k] != theirs.metadata[k]]
    assert same == [], f"metadata differs from the normal writer's: {same}"
    assert speed_model.synthetic_mode(ours.metadata) == "speed-only"
    assert speed_model.synthetic_mode(theirs.metadata) == "values"
    assert speed_model.synthetic_mode({"general.name": "Qwen3.5 27B"}) is None


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_quant_mix_is_q4_k_m(speed_files, preset):
    p = testmodels.PRESETS[preset]
    reader = GGUFReader(speed_files[preset])
    types = {t.name: t.tensor_type for t in reader.tensors}
    expected = {s.name: q4_k_m_rule(s.name, len(s.shape), p.n_layer, p.tied_output) for s in testmodels.tensor_plan(p)}
    assert types == expected
    assert Q.Q6_K in types.values() and Q.Q4_K in types.values()  # both branches of the rule taken


def test_q5_k_m_file_follows_its_rule(speed_files, tmp_path):
    """The Q5_K_M mix: the normal writer's names, shapes and types (Q5_K where Q4_K_M has Q4_K)."""
    from pyspecla.loader.target import ModelFile

    p = testmodels.PRESETS["tiny8"]
    types = {t.name: t.tensor_type for t in GGUFReader(speed_files["tiny8-q5_k_m"]).tensors}
    expected = {s.name: q4_k_m_rule(s.name, len(s.shape), p.n_layer, p.tied_output, Q.Q5_K)
                for s in testmodels.tensor_plan(p)}
    assert types == expected
    assert Q.Q6_K in types.values() and Q.Q5_K in types.values()
    values = testmodels.write_test_model(tmp_path / "values.gguf", "tiny8", "q5_k_m", seed=3)
    ours, theirs = ModelFile.open(str(speed_files["tiny8-q5_k_m"])), ModelFile.open(str(values))
    assert [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in ours.tensors.items()] == \
           [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in theirs.tensors.items()]


def test_q8_0_file_follows_its_rule(speed_files, tmp_path):
    """The Q8_0 mix: every 2-D weight Q8_0 but ssm_conv1d (llama-quantize's rule for that file type,
    written out here), and the normal writer's names, shapes, types and sizes."""
    from pyspecla.loader.target import ModelFile

    p = testmodels.PRESETS["tiny8"]
    types = {t.name: t.tensor_type for t in GGUFReader(speed_files["tiny8-q8_0"]).tensors}
    expected = {s.name: Q.F32 if len(s.shape) == 1 or ".ssm_conv1d." in s.name else Q.Q8_0
                for s in testmodels.tensor_plan(p)}
    assert types == expected
    values = testmodels.write_test_model(tmp_path / "values.gguf", "tiny8", "q8_0", seed=3)
    ours, theirs = ModelFile.open(str(speed_files["tiny8-q8_0"])), ModelFile.open(str(values))
    assert [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in ours.tensors.items()] == \
           [(n, v.ggml_type, tuple(v.ne), v.nbytes) for n, v in theirs.tensors.items()]


@pytest.mark.parametrize("preset", ["tiny", "tiny8", "tiny8-q5_k_m", "tiny8-q8_0"])
def test_every_tensor_decodes_finite_with_the_intended_spread(speed_files, preset):
    plan = {s.name: s for s in testmodels.tensor_plan(testmodels.PRESETS[preset.split("-")[0]])}
    for t in GGUFReader(speed_files[preset]).tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert np.isfinite(x).all(), t.name
        spec = plan[t.name]
        if t.tensor_type == Q.F32:
            continue
        # rms within 10 % of the normal writer's std for tensors of >= 64 blocks (measured on
        # these presets: 0.96 to 1.03), and a mean within 4 standard errors of 0: the means of
        # the Q4_K sub-blocks of 32 (each with its own offset 7.5 d (sc - m)) spread by 0.77 std
        # (measured over 20000 blocks), so the standard error is 0.8 std / sqrt(n / 32)
        # (measured: at most 1.9 of them); Q6_K's and Q8_0's block means spread less (0.18 std over
        # 20000 blocks; Q8_0's overall mean -0.005 std, its codes' -0.5), so the same bound holds them
        if x.size >= 64 * 256:
            std = spec.params["std"]
            ratio = np.sqrt(np.mean(x**2)) / std
            assert 0.9 <= ratio <= 1.1, f"{t.name}: rms / std = {ratio:.3f}"
            assert abs(x.mean()) <= 4 * 0.8 * std / np.sqrt(x.size / 32), f"{t.name}: mean {x.mean():.3g}"
        # f16 scales: finite, positive (Q4_K / Q5_K d and dmin at bytes 0-3, Q6_K d at 208-209,
        # Q8_0 d at 0-1)
        block, first, end = {Q.Q4_K: (144, 0, 4), Q.Q5_K: (176, 0, 4), Q.Q6_K: (210, 208, 210),
                             Q.Q8_0: (34, 0, 2)}[t.tensor_type]
        scales = np.asarray(t.data).reshape(-1, block)[:, first:end].copy().view(np.float16)
        assert np.isfinite(scales).all() and (scales > 0).all(), t.name


def test_f32_tensors_are_the_normal_writers(speed_files, tmp_path):
    values = GGUFReader(testmodels.write_test_model(tmp_path / "values.gguf", "tiny8", "q4_k_m", seed=3))
    theirs = {t.name: np.asarray(t.data) for t in values.tensors if t.tensor_type == Q.F32}
    ours = {t.name: np.asarray(t.data) for t in GGUFReader(speed_files["tiny8"]).tensors if t.tensor_type == Q.F32}
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert (ours["blk.0.ssm_a"] < 0).all()


def test_same_seed_same_bytes_whatever_the_process_count(speed_files):
    a = speed_files["tiny8"].read_bytes()
    assert a == speed_files["tiny8-1proc"].read_bytes()
    assert a != speed_files["tiny8-seed4"].read_bytes()


def test_pieces_are_cut_and_placed_right(tmp_path, monkeypatch):
    """With pieces of a few rows every tensor spans many work items; the bytes must equal one
    piece per tensor regenerated here with the documented seeding (and no piece overlaps)."""
    monkeypatch.setattr(speed_model, "PIECE_BYTES", 1 << 20)  # big: one piece per tensor
    whole = speed_model.write_speed_model(tmp_path / "whole.gguf", "tiny", seed=5, jobs=2)
    reader = GGUFReader(whole)
    for t in reader.tensors:
        if t.tensor_type == Q.F32:
            continue
        spec = next(s for s in testmodels.tensor_plan(testmodels.PRESETS["tiny"]) if s.name == t.name)
        rng = np.random.default_rng([5, zlib.crc32(t.name.encode()), 0])
        n_blocks = t.n_elements // 256
        expected = speed_model.random_blocks(t.tensor_type, n_blocks, spec.params["std"], rng)
        np.testing.assert_array_equal(np.asarray(t.data).reshape(expected.shape), expected, err_msg=t.name)
    monkeypatch.setattr(speed_model, "PIECE_BYTES", 3 * 210)  # 3 Q6_K blocks: rows split everywhere
    split = speed_model.write_speed_model(tmp_path / "split.gguf", "tiny", seed=5, jobs=2)
    split_reader = GGUFReader(split)
    assert [t.name for t in split_reader.tensors] == [t.name for t in reader.tensors]
    for a, b in zip(reader.tensors, split_reader.tensors):
        if a.tensor_type == Q.F32:
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        else:  # different pieces, different draws, still valid
            assert np.isfinite(dequantize(b.data, b.tensor_type)).all(), b.name
            assert not np.array_equal(np.asarray(a.data), np.asarray(b.data)), b.name


@pytest.mark.parametrize("preset", ["tiny", "tiny8", "tiny8-q5_k_m", "tiny8-q8_0"])
def test_forward_gives_finite_logits(speed_files, preset):
    from pyspecla.model import Model

    model = Model.load(str(speed_files[preset]))
    logits = model.logits(list(range(1, 40)))
    assert logits.shape == (39, testmodels.PRESETS[preset.split("-")[0]].n_vocab)
    assert np.isfinite(logits).all()
    # O(1) activations: the logits spread like the normal writer's (LOGIT_STD 5; measured 4.5 and
    # 5.1 here, 4.7 and 5.0 for the normal writer's files), within a factor of 2
    spread = float(logits.std(axis=-1).mean())
    assert 2.5 <= spread <= 10, spread


def test_bad_arguments_are_named(tmp_path, capsys):
    assert speed_model.main(["--preset", "nope", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "unknown qwen35 preset 'nope'" in capsys.readouterr().err
    assert speed_model.main(["--preset", "tiny", "--jobs", "0", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert speed_model.main(["--preset", "tiny", "--out", str(tmp_path / "missing" / "x.gguf")]) == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(ValueError, match="q4_k_m or q5_k_m or q8_0, not 'q6_k'"):
        speed_model.write_speed_model(tmp_path / "x.gguf", "tiny", quant="q6_k")


def test_make_test_model_speed_only_flag(tmp_path, capsys):
    import make_test_model

    out = tmp_path / "t.gguf"
    assert make_test_model.main(["--preset", "tiny", "--quant", "q4_k_m", "--speed-only", "--jobs", "1",
                                 "--seed", "3", "--out", str(out)]) == 0
    assert "speed-only" in capsys.readouterr().out
    expected = speed_model.write_speed_model(tmp_path / "direct.gguf", "tiny", seed=3, jobs=2)
    assert out.read_bytes() == expected.read_bytes()
    with pytest.raises(SystemExit) as exc:
        make_test_model.main(["--preset", "tiny", "--speed-only", "--out", str(out)])  # f32: not q4_k_m
    assert exc.value.code == 2
    assert "--speed-only writes q4_k_m or q5_k_m or q8_0 targets" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_test_model.main(["--preset", "tiny", "--quant", "q4_k_m", "--jobs", "2", "--out", str(out)])
    assert "--jobs only goes with --speed-only" in capsys.readouterr().err
