"""The proof that the numpy reference and the synthetic test models are right: llama.cpp (through
llama-cpp-python, the vendored llama.cpp docs/qwen35.md describes) loads the synthetic
files and computes the same logits as pyspecla.reference.forward, and llama-quantize places the
quant types exactly as pyspecla.testing.models does.

F32 weights, F32 KV cache, flash attention off: about 5e-5 agreement is reachable (docs/qwen35.md §6); we require
1e-3 on every logit of 40 tokens (evaluated as two batches so the recurrent and KV state carry)."""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest

from pyspecla.reference.forward import ReferenceModel
from pyspecla.testing.models import write_test_model

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.llama

GGML_TYPE_F32 = 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("llama-parity")


def _llama_logits(path, tokens, split):
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=256,
        n_batch=64,
        logits_all=True,
        flash_attn=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        n_threads=2,
        verbose=False,
    )
    try:
        llm.reset()
        llm.eval(tokens[:split])
        llm.eval(tokens[split:])
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_f32_logits_match_llama_cpp(model_dir, preset):
    path = write_test_model(model_dir / f"{preset}-f32.gguf", preset, "f32", seed=0)
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, 1000, 40)]
    expected = _llama_logits(path, tokens, split=25)

    model = ReferenceModel.from_gguf(path)
    state = model.new_state()
    got = np.concatenate([model.forward(state, tokens[:25]), model.forward(state, tokens[25:])])

    max_diff = float(np.abs(got - expected).max())
    print(f"{preset}: max |logit reference - llama.cpp| over {len(tokens)} tokens = {max_diff:.3g}")
    assert max_diff <= 1e-3
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
@pytest.mark.parametrize("quant,ftype", [("q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M"), ("q5_k_m", "LLAMA_FTYPE_MOSTLY_Q5_K_M"),
                                         ("q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0")])
def test_quant_placement_matches_llama_quantize(model_dir, preset, quant, ftype):
    source = write_test_model(model_dir / f"{preset}-f32.gguf", preset, "f32", seed=0)
    ours = write_test_model(model_dir / f"{preset}-{quant}.gguf", preset, quant, seed=0)
    theirs = model_dir / f"{preset}-{quant}-llama-quantize.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(theirs).encode(), ctypes.byref(params)) == 0

    def types(path):
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}

    assert types(ours) == types(theirs)
