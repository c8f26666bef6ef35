"""DFlash drafts: the GGUF loader (three spellings, every mismatch with the target named with both
files), the synthetic-draft writer and its CLI, and the native propose against the numpy reference
(pyspecla/reference/dflash.py): same top-K tokens and log-probs, after a prefill and after more
tokens are committed (by plain decoding and by tree verify + accept), after the target is reset or
swapped; the target context is left untouched; bad arguments fail with a message."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from pyspecla.loader.dflash import DraftFile, check_against_target, open_draft_and_target
from pyspecla.errors import GGUFError, NativeError, UsageError
from pyspecla.loader.target import ModelFile
from pyspecla.reference.dflash import DFlashReference, topk
from pyspecla.testing.drafts import dflash_target_layer_ids, write_test_draft
from pyspecla.testing.models import write_test_model

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHS = ("qwen35-dflash-draft", "dflash-draft", "dflash")

_DRAFTS: dict = {}
_TARGETS: dict = {}


@pytest.fixture(scope="session")
def target_path(test_model_dir):
    """target_path(preset="tiny", **overrides) -> a synthetic f32 qwen35 GGUF (written once)."""

    def get(preset: str = "tiny", **overrides) -> str:
        key = (preset, tuple(sorted(overrides.items())))
        if key not in _TARGETS:
            name = "-".join([f"target-{preset}"] + [f"{k}{v}" for k, v in sorted(overrides.items())])
            path = os.path.join(test_model_dir, name + ".gguf")
            write_test_model(path, preset=preset, quant="f32", seed=0, **overrides)
            _TARGETS[key] = path
        return _TARGETS[key]

    return get


@pytest.fixture(scope="session")
def draft_path(test_model_dir, target_path):
    """draft_path(preset="tiny", arch=..., quant=..., **kwargs) -> a synthetic draft for that target."""

    def get(preset: str = "tiny", arch: str = "qwen35-dflash-draft", quant: str = "f32", n_layer: int = 2,
            **kwargs) -> str:
        key = (preset, arch, quant, n_layer, tuple(sorted(kwargs.items())))
        if key not in _DRAFTS:
            extra = [f"{k}{v}" for k, v in sorted(kwargs.items())]
            name = "-".join([f"draft-{preset}-{arch}-{quant}-{n_layer}"] + extra)
            path = os.path.join(test_model_dir, name + ".gguf")
            write_test_draft(path, target_path(preset), seed=1, quant=quant, n_layer=n_layer, arch=arch, **kwargs)
            _DRAFTS[key] = path
        return _DRAFTS[key]

    return get


def rewrite(src: str, dst: str, *, arch: str | None = None, drop_keys=(), set_keys=None, drop_tensors=(),
            rename=None, replace=None, add_tensors=None) -> str:
    """Copy an F32 GGUF changing one thing at a time. set_keys: name -> (value, type[, sub_type])."""
    reader = GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    arch = arch or old_arch
    writer = GGUFWriter(dst, arch)
    set_keys = dict(set_keys or {})
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        new_name = arch + name[len(old_arch):] if name.startswith(old_arch + ".") else name
        if name in set_keys:
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(new_name, field.contents(), field.types[0], sub)
    for name, spec in set_keys.items():
        writer.add_key_value(name, *spec)
    rename, replace = dict(rename or {}), dict(replace or {})
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        data = replace.get(t.name, np.array(t.data))
        writer.add_tensor(rename.get(t.name, t.name), np.ascontiguousarray(data, dtype=np.float32))
    for name, data in (add_tensors or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def open_error(path: str) -> str:
    with pytest.raises(GGUFError) as info:
        DraftFile.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


def mismatch_error(draft: str, target: str) -> str:
    with pytest.raises(GGUFError) as info:
        check_against_target(DraftFile.open(draft), ModelFile.open(target))
    message = str(info.value)
    assert draft in message and target in message, message
    return message


# ------------------------------------------------------------------------------------------------
# Loader
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_every_spelling_loads_to_the_same_hparams(draft_path, target_path, arch):
    draft = DraftFile.open(draft_path(arch=arch))
    hp = draft.hparams
    target = ModelFile.open(target_path())
    assert draft.arch == arch == hp.arch
    assert (hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim) == (2, 256, 512, 4, 2, 64)
    assert (hp.block_size, hp.n_target_layers, hp.target_n_embd) == (16, 3, 256)
    assert hp.target_layer_ids == (1, 2, 3) and hp.mask_token_id < target.hparams.n_vocab
    assert hp.n_vocab == (None if arch == "dflash" else 1024)
    assert hp.layer_is_swa == ((False, False) if arch == "dflash" else (True, False))
    assert hp.sliding_window == (0 if arch == "dflash" else 2048)
    assert not hp.context_kv_layer_norm
    # canonical tensor names whatever the file calls them; zero-copy views
    fc = draft.tensor("dflash.fc.weight")
    assert fc.ne == (3 * 256, 256)
    assert draft.file_name("dflash.hidden_norm.weight") == (
        "enc.output_norm.weight" if arch == "dflash" else "dflash.hidden_norm.weight")
    check_against_target(draft, target)


def test_same_arguments_write_identical_bytes_and_the_cli_matches(tmp_path, target_path):
    a, b, cli = (str(tmp_path / n) for n in ("a.gguf", "b.gguf", "cli.gguf"))
    write_test_draft(a, target_path(), seed=3, quant="q8_0", n_layer=3)
    write_test_draft(b, target_path(), seed=3, quant="q8_0", n_layer=3)
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "tools", "make_test_model.py"), "--kind", "dflash-draft",
         "--target", target_path(), "--seed", "3", "--quant", "q8_0", "--n-layer", "3", "--out", cli],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    data = open(a, "rb").read()
    assert data == open(b, "rb").read() == open(cli, "rb").read()
    hp = DraftFile.open(cli).hparams
    assert hp.n_layer == 3 and hp.layer_is_swa == (True, True, False)
    assert DraftFile.open(cli).tensor("blk.0.attn_q.weight").type_name == "Q8_0"


def test_cli_dflash_draft_needs_a_qwen35_target(tmp_path, draft_path):
    tool = os.path.join(REPO_ROOT, "tools", "make_test_model.py")
    out = str(tmp_path / "x.gguf")
    missing = subprocess.run([sys.executable, tool, "--kind", "dflash-draft", "--out", out], capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "--target" in missing.stderr
    swapped = subprocess.run([sys.executable, tool, "--kind", "dflash-draft", "--target", draft_path(), "--out", out],
                             capture_output=True, text=True)
    assert swapped.returncode == 2 and "is a DFlash draft, not a qwen35 target" in swapped.stderr


def test_target_layer_ids_follow_the_published_spread():
    assert dflash_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert dflash_target_layer_ids(4, 3) == [1, 2, 3]
    assert dflash_target_layer_ids(8, 5) == [1, 2, 3, 4, 5]


def test_hidden_size_mismatch_names_both_files(draft_path, target_path):
    message = mismatch_error(draft_path(), target_path("tiny", n_embd=128, n_ff=256))
    assert "qwen35-dflash-draft.embedding_length' = 256" in message and "hidden size mismatch" in message


def test_vocabulary_mismatch_names_both_files(draft_path, target_path):
    small = target_path("tiny", n_vocab=600)
    message = mismatch_error(draft_path(), small)
    assert "'qwen35-dflash-draft.vocab_size' = 1024" in message and "vocabulary mismatch" in message
    # the upstream spelling has no vocab_size: its mask token is what falls outside
    message = mismatch_error(draft_path(arch="dflash"), small)
    assert "'dflash.mask_token_id'" in message and "vocabulary mismatch" in message


def test_target_layer_out_of_range_names_both_files(draft_path, target_path):
    message = mismatch_error(draft_path("tiny8"), target_path("tiny"))  # ids up to 5, target has 4 layers
    assert "'qwen35-dflash-draft.dflash.target_layer_ids' = [1, 2, 3, 4, 5]" in message
    assert "layer 4" in message and "4 trunk layers" in message


def test_wrong_kind_of_file_is_named(draft_path, target_path):
    draft, target = draft_path(), target_path()
    assert "is a qwen35 target model, not a DFlash draft" in open_error(target)
    with pytest.raises(GGUFError, match="is a DFlash draft, not a qwen35 target") as info:
        open_draft_and_target(target, draft)  # swapped
    assert draft in str(info.value) and target in str(info.value)
    with pytest.raises(GGUFError, match="is a qwen35 target, not a DFlash draft"):
        open_draft_and_target(target, target)
    with pytest.raises(GGUFError, match="is a DFlash draft, not a qwen35 target"):
        check_against_target(DraftFile.open(draft), DraftFile.open(draft))
    with pytest.raises(GGUFError, match="is a qwen35 target, not a DFlash draft"):
        check_against_target(ModelFile.open(target), ModelFile.open(target))
    pair = open_draft_and_target(draft, target)
    assert isinstance(pair[0], DraftFile) and isinstance(pair[1], ModelFile)


def test_broken_draft_files_name_the_key_or_tensor(tmp_path, draft_path):
    src = draft_path()
    K = "qwen35-dflash-draft."
    out = str(tmp_path / "bad.gguf")

    rewrite(src, out, drop_tensors={"blk.1.attn_q.weight"})
    assert "missing tensor 'blk.1.attn_q.weight' (draft layer 1)" in open_error(out)

    fc = np.array(GGUFReader(src).get_tensor(0).data)  # dflash.fc.weight, (E, N * Et)
    rewrite(src, out, replace={"dflash.fc.weight": fc[:, :-256]})
    assert "'dflash.fc.weight'" in open_error(out) and "hidden size" not in open_error(out)

    rewrite(src, out, drop_keys={K + "dflash.mask_token_id"})
    assert f"missing required key '{K}dflash.mask_token_id'" in open_error(out)

    rewrite(src, out, set_keys={K + "dflash.n_target_layers": (4, GGUFValueType.UINT32)})
    assert f"'{K}dflash.n_target_layers' = 4" in open_error(out)

    rewrite(src, out, set_keys={K + "dflash.mask_token_id": (1024, GGUFValueType.UINT32)})
    assert f"'{K}dflash.mask_token_id' = 1024 is outside the vocabulary" in open_error(out)

    rewrite(src, out, set_keys={K + "dflash.target_layer_ids": ([1, 1, 3], GGUFValueType.ARRAY, GGUFValueType.INT32)})
    assert "repeats a layer" in open_error(out)

    rewrite(src, out, add_tensors={"token_embd.weight": np.zeros((8, 256))})
    assert "unexpected tensor 'token_embd.weight'" in open_error(out)

    rewrite(src, out, add_tensors={"fc.weight": fc})
    assert "'dflash.fc.weight', 'fc.weight' are the same tensor under two names" in open_error(out)

    rewrite(src, out, set_keys={K + "attention.sliding_window": (0, GGUFValueType.UINT32)})
    assert "marks sliding-window layers" in open_error(out)

    rewrite(src, out, arch="qwen3")
    assert "architecture 'qwen3' is not a DFlash draft" in open_error(out)


def test_corrupt_block_size_names_the_key(tmp_path, draft_path):
    out = str(tmp_path / "bad.gguf")
    rewrite(draft_path(), out, set_keys={"qwen35-dflash-draft.dflash.block_size": (1_000_000_000, GGUFValueType.UINT32)})
    message = open_error(out)
    assert "'qwen35-dflash-draft.dflash.block_size' = 1000000000 is out of range [2, 256]" in message, message


@pytest.mark.parametrize("name,value", [("blk.1.attn_q.weight", np.nan), ("dflash.fc.weight", np.inf),
                                        ("blk.0.attn_norm.weight", np.nan)])
def test_nonfinite_draft_weights_name_the_tensor(tmp_path, draft_path, name, value):
    src = draft_path()
    reader = GGUFReader(src)
    weights = np.array(next(t for t in reader.tensors if t.name == name).data)
    del reader
    weights.flat[weights.size // 2 + 3] = value
    out = str(tmp_path / "nan.gguf")
    rewrite(src, out, replace={name: weights})
    message = open_error(out)
    assert f"tensor '{name}' (F32) holds a NaN or infinite value (element {weights.size // 2 + 3})" in message, message


def test_nonfinite_scale_in_a_quantized_draft_names_the_tensor(tmp_path, draft_path):
    from pyspecla.gguf_container import _F16_SCALE_OFFSETS

    src = draft_path(quant="q8_0")
    reader = GGUFReader(src)
    tensor = next(t for t in reader.tensors if t.tensor_type.name == "Q8_0")
    name, start = tensor.name, int(tensor.data_offset)
    del reader, tensor
    out = str(tmp_path / "nan-q8.gguf")
    with open(src, "rb") as f:
        data = bytearray(f.read())
    block = 5
    at = start + block * 34 + _F16_SCALE_OFFSETS[8][0]  # Q8_0 blocks are 34 bytes, the f16 scale first
    data[at : at + 2] = np.float16(np.nan).tobytes()
    with open(out, "wb") as f:
        f.write(data)
    message = open_error(out)
    assert f"tensor '{name}' (Q8_0) holds a NaN or infinite value (block {block})" in message, message


def test_ffn_norm_fallback_and_aux_norms(tmp_path, draft_path):
    src = draft_path()
    out = str(tmp_path / "fallback.gguf")
    rewrite(src, out, rename={"blk.0.ffn_norm.weight": "blk.0.post_attention_norm.weight"})
    draft = DraftFile.open(out)
    assert draft.file_name("blk.0.ffn_norm.weight") == "blk.0.post_attention_norm.weight"
    both = str(tmp_path / "both.gguf")
    rewrite(src, both, add_tensors={"blk.0.post_attention_norm.weight": np.ones(256)})
    assert "are both present" in open_error(both)

    normed = DraftFile.open(draft_path(context_kv_layer_norm=True))
    assert normed.hparams.context_kv_layer_norm
    assert normed.tensor("dflash.aux_hidden_norm.2.weight").ne == (256,)
    missing = str(tmp_path / "aux.gguf")
    rewrite(draft_path(context_kv_layer_norm=True), missing, drop_tensors={"dflash.aux_hidden_norm.1.weight"})
    assert "missing tensor 'dflash.aux_hidden_norm.1.weight'" in open_error(missing)


# ------------------------------------------------------------------------------------------------
# Native propose against the numpy reference
# ------------------------------------------------------------------------------------------------

_LOADED: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _free_loaded_models():
    yield
    _LOADED.clear()  # free the native models while the library is still loaded


def loaded(target: str, draft: str, cpu_kernels: str = "auto"):
    """(Model, DFlashDraft, DFlashReference) for a target/draft pair, loaded once per kernel set."""
    from pyspecla import Model
    from pyspecla.dflash_draft import DFlashDraft

    key = (target, draft, cpu_kernels)
    if key not in _LOADED:
        model = Model.load(target, cpu_kernels=cpu_kernels)
        _LOADED[key] = (model, DFlashDraft.load(draft, model), DFlashReference.from_gguf(draft, target))
    return _LOADED[key]


def assert_matches_reference(ctx, dctx, reference, root: int, n_depths: int = 15, k: int = 4, tol: float = 1e-4):
    tokens, logprobs = dctx.propose(ctx, root, n_depths, k)
    features = ctx.read_features(0, ctx.n_past)
    want_tokens, want_logprobs = topk(reference.block_logits(features, root), n_depths, k)
    diff = float(np.abs(logprobs - want_logprobs).max())
    print(f"{ctx.device} draft vs the float64 reference: max log-prob difference {diff:.3e} (bound {tol:g})")
    assert diff <= tol, diff
    # the lists match, except where two log-probs are closer than the tolerance
    close = np.abs(np.diff(want_logprobs, axis=1)) <= tol
    for r, c in zip(*np.nonzero(tokens != want_tokens)):
        assert (c > 0 and close[r, c - 1]) or (c < k - 1 and close[r, c]), (r, c)
    assert np.all(np.diff(logprobs, axis=1) <= 0) and np.all(logprobs <= 0)
    return tokens, logprobs


CASES = {
    # sliding window 8 < the context: the SWA layers really drop rows; the draft reads its
    # features in chunks of 6 rows
    "swa-window-8": dict(preset="tiny", draft=dict(sliding_window=8), max_batch=6),
    "upstream-dflash": dict(preset="tiny", draft=dict(arch="dflash"), max_batch=64),
    # Q8_0 draft weights meet 8-bit activations: the float64 reference and our float32 forward
    # round a few activations to neighbouring codes (an input within an ulp of a rounding
    # boundary), which moves log-probs by up to ~0.1 on these random weights; F32 cases stay at 1e-4
    "aux-norms-q8_0": dict(preset="tiny", draft=dict(quant="q8_0", context_kv_layer_norm=True), max_batch=64,
                           tol=0.15),
    "untied-head-3-layers": dict(preset="tiny8", draft=dict(n_layer=3), max_batch=64),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_propose_matches_reference_after_prefill_and_more_tokens(target_path, draft_path, cpu_kernels, case):
    spec = CASES[case]
    model, draft, reference = loaded(target_path(spec["preset"]), draft_path(spec["preset"], **spec["draft"]),
                                     cpu_kernels)
    rng = np.random.default_rng(7)
    V = model.hparams.n_vocab
    ctx = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96, max_batch=spec["max_batch"])
    ctx.eval(rng.integers(0, V, 20))
    tol = spec.get("tol", 1e-4)
    first, _ = assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)), tol=tol)
    ctx.eval(rng.integers(0, V, 7))  # more committed tokens: only these are ingested
    second, _ = assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)), n_depths=9, k=6, tol=tol)
    assert ctx.n_past == 27
    assert len(set(first[:, 0]) | set(second[:, 0])) > 1, "synthetic draft degenerate: one token everywhere"


def test_propose_follows_reset_rollback_and_another_context(target_path, draft_path):
    model, draft, reference = loaded(target_path(), draft_path(sliding_window=8))
    V = model.hparams.n_vocab
    rng = np.random.default_rng(11)
    ctx = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96)
    ctx.eval(rng.integers(0, V, 20))
    assert_matches_reference(ctx, dctx, reference, root=5)
    ctx.reset()  # shorter history: restart
    ctx.eval(rng.integers(0, V, 12))
    assert_matches_reference(ctx, dctx, reference, root=6)
    ctx.reset()  # rolled back and re-advanced past what was ingested, with other tokens
    ctx.eval(rng.integers(0, V, 30))
    assert_matches_reference(ctx, dctx, reference, root=7)
    other = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)  # a different sequence
    other.eval(rng.integers(0, V, 30))
    assert_matches_reference(other, dctx, reference, root=8)
    dctx.reset()
    assert_matches_reference(ctx, dctx, reference, root=9)
    empty = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)  # no context rows at all
    assert_matches_reference(empty, dctx, reference, root=10)


def test_propose_follows_truncate_to_a_saved_state(target_path, draft_path):
    """A target rolled back (truncate to its saved state) and re-advanced with other tokens: the
    draft keeps the rows below the rollback and ingests the rest again; after more rollbacks than
    the target remembers between two proposes it starts over. Either way the reference's answer."""
    model, draft, reference = loaded(target_path(), draft_path(sliding_window=8))
    V = model.hparams.n_vocab
    rng = np.random.default_rng(19)
    ctx = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96, max_batch=4)
    ctx.eval(rng.integers(0, V, 18))
    ctx.save_state()
    ctx.eval(rng.integers(0, V, 6))
    assert_matches_reference(ctx, dctx, reference, root=3)  # ingested 24 rows
    ctx.truncate(18)
    ctx.eval(rng.integers(0, V, 9))  # rows 18..26 are new: the ingested 18..23 are stale
    assert_matches_reference(ctx, dctx, reference, root=4)
    for _ in range(20):  # more rollbacks than the target's log holds
        ctx.save_state()
        ctx.eval(rng.integers(0, V, 1))
        ctx.truncate(ctx.n_past - 1)
    ctx.eval(rng.integers(0, V, 2))
    assert_matches_reference(ctx, dctx, reference, root=5)
    ctx.save_state()
    ctx.truncate(ctx.n_past)  # a truncate that drops nothing
    assert_matches_reference(ctx, dctx, reference, root=6)


def test_draft_context_runs_where_the_target_model_runs(target_path, draft_path):
    model, draft, _ = loaded(target_path(), draft_path())
    dctx = draft.new_context(n_ctx=16)
    assert dctx.device == model.new_context(n_ctx=16).device == "cpu"
    assert dctx.launch_counters() == (-1, -1)  # the CPU counts nothing


def test_propose_after_tree_verify_and_accept(target_path, draft_path):
    model, draft, reference = loaded(target_path(), draft_path(sliding_window=8))
    V = model.hparams.n_vocab
    rng = np.random.default_rng(13)
    ctx = model.new_context(n_ctx=96, max_tree_nodes=8, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96)
    ctx.eval(rng.integers(0, V, 15))
    root = int(rng.integers(V))
    tokens, _ = assert_matches_reference(ctx, dctx, reference, root=root)
    # a small tree from the proposal: the top-1 chain of 3, plus a second choice at depth 1
    tree_tokens = [root, tokens[0, 0], tokens[1, 0], tokens[2, 0], tokens[0, 1]]
    parents = [-1, 0, 1, 2, 0]
    ctx.verify_tree(tree_tokens, parents)
    ctx.accept([0, 4])  # the side branch: its feature row moves to position n_past + 1
    assert ctx.n_past == 17
    assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)))


def test_propose_leaves_the_target_context_unchanged(target_path, draft_path):
    model, draft, _ = loaded(target_path(), draft_path())
    V = model.hparams.n_vocab
    prompt = np.random.default_rng(17).integers(0, V, 20)
    touched = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    fresh = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    touched.eval(prompt)
    fresh.eval(prompt)
    features = touched.read_features(0, 20)
    dctx = draft.new_context(n_ctx=64)
    for root in (3, 4):
        dctx.propose(touched, root, 15, 8)
    assert touched.n_past == 20
    assert np.array_equal(touched.read_features(0, 20), features)
    assert np.array_equal(touched.eval([42, 43], logits_all=True), fresh.eval([42, 43], logits_all=True))


def test_bad_arguments_fail_with_a_message(target_path, draft_path):
    from pyspecla import Model

    model, draft, _ = loaded(target_path(), draft_path())
    V = model.hparams.n_vocab
    ctx = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    ctx.eval([1, 2, 3])
    dctx = draft.new_context(n_ctx=32)
    for n_depths, top_k, root, match in (
        (0, 4, 1, r"n_depths 0 not in \[1, block_size - 1 = 15\]"),
        (16, 4, 1, r"n_depths 16 not in \[1, block_size - 1 = 15\]"),
        (3, 0, 1, rf"top_k 0 not in \[1, n_vocab = {V}\]"),
        (3, V + 1, 1, rf"top_k {V + 1} not in \[1, n_vocab = {V}\]"),
        (3, 4, -1, r"root_token -1 is outside \[0, 1024\)"),
        (3, 4, V, r"root_token 1024 is outside \[0, 1024\)"),
    ):
        with pytest.raises(NativeError, match=match):
            dctx.propose(ctx, root, n_depths, top_k)
    tokens, logprobs = dctx.propose(ctx, 1, 15, V)  # the whole vocabulary, sorted
    assert sorted(tokens[0]) == list(range(V)) and np.isclose(np.exp(logprobs[0].astype(np.float64)).sum(), 1.0)

    plain = model.new_context(n_ctx=64)
    plain.eval([1, 2, 3])
    with pytest.raises(NativeError, match="captures no feature rows"):
        dctx.propose(plain, 1, 3, 4)
    two = model.new_context(n_ctx=64, capture_layers=[1, 2])
    two.eval([1, 2, 3])
    with pytest.raises(UsageError, match=r"captures layers \[1, 2\], the draft reads \[1, 2, 3\]"):
        dctx.propose(two, 1, 3, 4)
    two.capture_layers = two.capture_layers[:0]  # past the Python check: the native one
    with pytest.raises(NativeError, match="captures 2 layers, the draft reads 3"):
        dctx.propose(two, 1, 3, 4)
    shuffled = model.new_context(n_ctx=64, capture_layers=[3, 2, 1])
    shuffled.eval([1, 2, 3])
    with pytest.raises(UsageError, match=r"captures layers \[3, 2, 1\]"):
        dctx.propose(shuffled, 1, 3, 4)
    other_model = Model.load(target_path())
    foreign = other_model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    foreign.eval([1, 2, 3])
    with pytest.raises(NativeError, match="belongs to another model"):
        dctx.propose(foreign, 1, 3, 4)
    long = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    long.eval(np.arange(40) % V)
    with pytest.raises(NativeError, match="the target holds 40 positions, the draft context only 32"):
        dctx.propose(long, 1, 3, 4)
    with pytest.raises(UsageError, match="n_ctx must be positive"):
        draft.new_context(n_ctx=0)


def test_native_model_create_validates_against_the_target(target_path, draft_path):
    from pyspecla import Model, _native

    model, draft, _ = loaded(target_path(), draft_path())

    def create(hparams, weights, target_handle) -> None:
        handle = ctypes.c_void_p()
        _native.check(_native.lib.specla_draft_model_create(
            ctypes.byref(hparams), ctypes.byref(weights), target_handle, ctypes.byref(handle)))
        _native.lib.specla_draft_model_free(handle)

    create(draft._hparams_struct, draft._weights, model._handle)  # as loaded: fine
    hp = _native.DraftHParams.from_buffer_copy(draft._hparams_struct)
    hp.mask_token_id = model.hparams.n_vocab
    with pytest.raises(NativeError, match="mask_token_id 1024 is outside the target vocabulary"):
        create(hp, draft._weights, model._handle)
    hp = _native.DraftHParams.from_buffer_copy(draft._hparams_struct)
    hp.sliding_window = 0
    with pytest.raises(NativeError, match="layer 0 is a sliding-window layer but sliding_window is 0"):
        create(hp, draft._weights, model._handle)
    layers = (_native.DraftLayerWeights * 2)(*[draft._layers[i] for i in range(2)])
    layers[1].attn_k.ne1 = 64
    weights = _native.DraftWeights(draft._weights.fc, draft._weights.hidden_norm, draft._weights.output_norm,
                                         None, layers)
    expected = r"draft tensor blk.1.attn_k.weight: shape \{256, 64\}, expected \{256, 128\}"
    with pytest.raises(NativeError, match=expected):
        create(draft._hparams_struct, weights, model._handle)
    narrow = Model.load(target_path("tiny", n_embd=128, n_ff=256))
    with pytest.raises(NativeError, match="n_embd 256 differs from the target model's n_embd 128"):
        create(draft._hparams_struct, draft._weights, narrow._handle)
    from pyspecla.dflash_draft import DFlashDraft

    with pytest.raises(GGUFError, match="hidden size mismatch"):
        DFlashDraft.load(draft_path(), narrow)


def proposed_over_the_whole_head(model, draft, reference, rng):
    """A target context filled with 17 random tokens and the draft's 6-deep top-4 block over the
    whole head from a random root: (ctx, root, the whole head's proposal and draft context, the
    reference's block logits), the baseline the chosen-rows tests compare against."""
    V = model.hparams.n_vocab
    ctx = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    ctx.eval(rng.integers(0, V, 17))
    root = int(rng.integers(V))
    full = draft.new_context(n_ctx=64)
    proposal = full.propose(ctx, root, 6, 4)
    block = reference.block_logits(ctx.read_features(0, ctx.n_past), root)
    return ctx, root, proposal, full, block


def test_propose_over_chosen_head_rows(target_path, draft_path):
    """specla_draft_context_set_logit_rows: the block scored over chosen rows of the target's LM
    head ranks and normalises over those rows only, exactly as the reference restricted to them;
    top_k is bounded by their number; None gives the whole head back."""
    model, draft, reference = loaded(target_path(), draft_path())
    rng = np.random.default_rng(3)
    V = model.hparams.n_vocab
    ctx, root, (full_tokens, full_logprobs), full, block = proposed_over_the_whole_head(model, draft, reference, rng)
    for n in (5, V // 3):
        ids = np.sort(rng.permutation(V)[:n]).astype(np.int32)
        dctx = draft.new_context(n_ctx=64)
        dctx.set_logit_rows(ids)
        tokens, logprobs = dctx.propose(ctx, root, 6, 4)
        want_index, want_logprobs = topk(block[:, ids], 6, 4)
        assert np.abs(logprobs - want_logprobs).max() <= 1e-4
        close = np.abs(np.diff(want_logprobs, axis=1)) <= 1e-4
        for r, c in zip(*np.nonzero(tokens != ids[want_index])):
            assert (c > 0 and close[r, c - 1]) or (c < 3 and close[r, c]), (r, c)
        assert np.isin(tokens, ids).all()
        with pytest.raises(NativeError, match=f"top_k {n + 1} not in \\[1, rows of the chosen logit head = {n}\\]"):
            dctx.propose(ctx, root, 6, n + 1)
        dctx.set_logit_rows(None)
        again_tokens, again_logprobs = dctx.propose(ctx, root, 6, 4)
        assert np.array_equal(again_tokens, full_tokens) and np.array_equal(again_logprobs, full_logprobs)
    with pytest.raises(UsageError, match=r"token ids must be in \[0, "):
        full.set_logit_rows([1, 2, V])


def test_a_chosen_head_that_shrinks_ranks_only_its_rows(target_path, draft_path):
    """A draft context multiplies its chosen head over every row the head's memory holds and ranks
    the first n (so a recorded GPU proposal does not depend on n). Rows chosen before and dropped
    since stay in that memory: here they are the whole head's best tokens, and they must not rank.
    After shrinking, the proposal is a fresh context's over the same rows, bit for bit."""
    model, draft, reference = loaded(target_path(), draft_path())
    rng = np.random.default_rng(5)
    V = model.hparams.n_vocab
    ctx, root, (full_tokens, _), _, _ = proposed_over_the_whole_head(model, draft, reference, rng)
    best = np.unique(full_tokens)
    others = rng.permutation(np.setdiff1d(np.arange(V), best))
    kept = others[: V // 6]
    shrinking = draft.new_context(n_ctx=64)
    shrinking.set_logit_rows(np.concatenate([kept, best, others[V // 6 : V // 2]]).astype(np.int32))
    before = shrinking.propose(ctx, root, 6, 4)
    assert np.isin(before[0], best).any()  # the dropped rows would win if they ranked
    shrinking.set_logit_rows(kept.astype(np.int32))
    fresh = draft.new_context(n_ctx=64)
    fresh.set_logit_rows(kept.astype(np.int32))
    got, want = shrinking.propose(ctx, root, 6, 4), fresh.propose(ctx, root, 6, 4)
    assert np.isin(got[0], kept).all()
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
