"""The attention-only architectures through the same native forward and speculative machinery as
qwen35: qwen2 (Qwen2.5: q/k/v biases, full-head RoPE) and qwen3 (Qwen3: per-head q/k RMSNorm
instead of the biases, head dim != n_embd / n_head), against the numpy reference, llama.cpp, and
plain greedy decoding; on the real Qwen2.5-Coder files when they were fetched."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close_up_to_code_flips

from pyspecla import Model
from pyspecla.reference.forward import ReferenceModel
from pyspecla.speculative.drafters import OracleDrafter
from pyspecla.speculative.loop import SpecConfig, generate

CACHE = Path(os.environ.get("PYSPECLA_MODELS", Path.home() / ".cache" / "pyspecla" / "models"))
REAL = {"0.5b": CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "1.5b": CACHE / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"}

CODE = '''from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)
    True
    """
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True

    return False
'''


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory):
    from pyspecla.testing.models import write_test_model

    def get(quant, arch="qwen2"):
        path = str(tmp_path_factory.mktemp(arch) / f"{arch}-tiny-{quant}.gguf")
        write_test_model(path, preset="tiny", quant=quant, seed=4, arch=arch)
        return path

    return get


ATTENTION_ONLY = ["qwen2", "qwen3"]


@pytest.mark.parametrize("arch", ATTENTION_ONLY)
def test_native_matches_reference_and_prefill_equals_decode(qwen2_path, arch):
    path = qwen2_path("f32", arch)
    model = Model.load(path)
    assert model.hparams.arch == arch
    tokens = np.random.default_rng(0).integers(0, model.hparams.n_vocab, 33)
    ours = model.logits(tokens)
    ref = ReferenceModel.from_gguf(path)
    expected = ref.forward(ref.new_state(), tokens)
    assert np.abs(ours - expected).max() / np.abs(expected).max() <= 1e-4
    ctx = model.new_context(n_ctx=64, max_batch=1)
    assert np.array_equal(np.stack([ctx.eval([t]) for t in tokens]), ours)


@pytest.mark.parametrize("arch", ATTENTION_ONLY)
def test_native_matches_llama_cpp(qwen2_path, arch):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = qwen2_path("f32", arch)
    tokens = np.random.default_rng(1).integers(0, 1024, 40).tolist()
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, flash_attn=False, type_k=0, type_v=0,
                          n_threads=2, verbose=False)
    llm.eval(tokens)
    theirs = np.array(llm.scores[:40])
    llm.close()
    assert np.abs(Model.load(path).logits(tokens) - theirs).max() <= 1e-3


@pytest.mark.parametrize("arch", ATTENTION_ONLY)
@pytest.mark.parametrize("quant", ["f32", "q4_k_m"])
def test_speculative_decoding_of_an_attention_only_target_is_lossless(qwen2_path, quant, arch):
    model = Model.load(qwen2_path(quant, arch))
    for seed in range(4):
        prompt = np.random.default_rng(10 + seed).integers(0, 1024, 6).tolist()
        reference = model.generate(prompt, 80)
        for specla in (True, False):
            drafter = OracleDrafter(0.8, reference, model.hparams.n_vocab, seed=seed)
            stats, _ = generate(model, prompt, 64, SpecConfig(mode="ddtree", specla=specla), drafter=drafter)
            assert stats.tokens == reference[:64]


def _real(which):
    path = REAL[which]
    if not path.exists():
        pytest.skip(f"{path} absent (python tools/fetch_models.py qwen2.5-coder)")
    return path


def test_real_qwen25_matches_the_numpy_reference():
    """The oracle on real weights: our forward on the real 0.5B file equals the float32 numpy
    reference (dequantized weights, 8-bit activation blocks) up to activations rounded to a
    neighbouring code (see conftest.assert_close_up_to_code_flips)."""
    path = _real("0.5b")
    model = Model.load(str(path))
    tokens = model.tokenize(CODE)[:12]
    ref = ReferenceModel.from_gguf(str(path), dtype=np.float32)
    expected = ref.forward(ref.new_state(), tokens)
    ours = model.logits(tokens)
    # the bounds the synthetic models' flips were first given (5e-2, 0.9); not re-measured on the real
    # file in this checkout (it needs tools/fetch_models.py) — the synthetic bounds are now 1.6e-2 / 2e-2
    assert_close_up_to_code_flips([ours], [expected], "Qwen2.5-Coder-0.5B", flip_rtol=5e-2, argmax_min=0.9,
                                  n_exact_min=0)


@pytest.mark.parametrize("which", ["0.5b", "1.5b"])
def test_real_qwen25_top1_matches_llama_cpp(which):
    """Both runtimes round activations to llama.cpp's 8-bit blocks before the quantized dot
    products, but sum in different orders (and llama.cpp repacks some weights), so near-ties can
    flip: measured (llama-cpp-python 0.3.36 built with AVX2, F32 KV cache, 160 positions of this
    text) 0.981 for the 0.5B and 0.994 for the 1.5B. Over 3162 positions of HumanEval + MT-Bench
    text (tools/top1_agreement.py, results/top1-agreement-a270c40.jsonl) we agree with llama.cpp at
    0.985 / 0.983 (0.5B / 1.5B), and llama.cpp's AVX2 and AVX-512 builds agree with EACH OTHER at
    only 0.988 / 0.982: 0.98 is the floor this noise allows, not a loosened bar."""
    path = _real(which)
    llama_cpp = pytest.importorskip("llama_cpp")
    model = Model.load(str(path))
    tokens = model.tokenize(CODE)[:160]
    ours = model.logits(tokens)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, flash_attn=False, type_k=0, type_v=0,
                          n_threads=2, verbose=False)
    llm.eval(tokens)
    theirs = np.array(llm.scores[: len(tokens)])
    llm.close()
    agree = float((ours.argmax(1) == theirs.argmax(1)).mean())
    print(f"{which}: teacher-forced top-1 agreement with llama.cpp {agree:.3f} over {len(tokens)} positions")
    assert agree >= 0.98
