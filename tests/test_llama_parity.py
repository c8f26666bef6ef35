"""Parity with llama.cpp itself (llama-cpp-python from PyPI builds the real thing): the native
forward against llama.cpp's logits on test models written by tools/make_test_model.py.

llama.cpp runs with an F32 KV cache and flash attention off. With F32 weights the two runtimes do
the same fp32 math in different orders: logits agree to ~1e-5. With quantized weights llama.cpp
also rounds activations to 8 bits before each quantized dot product, so only the ranking is
compared, teacher-forced on identical token sequences."""

from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from pyspecla import Model  # noqa: E402

pytestmark = pytest.mark.llama


def llama_logits(path: str, tokens) -> np.ndarray:
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=max(len(tokens), 64),
        n_batch=512,
        logits_all=True,
        flash_attn=False,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        n_threads=2,
        verbose=False,
    )
    try:
        llm.eval(list(map(int, tokens)))
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def token_sequences(model: Model, n_sequences: int, length: int):
    """Half random token ids, half the model's own greedy continuation of a short random prompt:
    positions of both kinds (flat and peaked distributions)."""
    V = model.hparams.n_vocab
    out = []
    for seed in range(n_sequences):
        prompt = np.random.default_rng(100 + seed).integers(0, V, 8).tolist()
        if seed % 2 == 0:
            out.append(prompt + np.random.default_rng(200 + seed).integers(0, V, length - 8).tolist())
        else:
            out.append(prompt + model.generate(prompt, length - 8))
    return out


def test_f32_logits_match_llama_cpp(tiny_model_path):
    path = tiny_model_path("f32")
    model = Model.load(path)
    worst = 0.0
    positions = 0
    for tokens in token_sequences(model, 2, 40):
        ours = model.logits(tokens)
        theirs = llama_logits(path, tokens)
        worst = max(worst, float(np.abs(ours - theirs).max()))
        positions += len(tokens)
    print(f"f32: max |dlogit| = {worst:.3e} over {positions} positions")
    assert positions >= 32
    # measured 1.38e-5 (llama-cpp-python 0.3.36, the README's portable AVX2 build, 80 positions);
    # issue 12 quotes 9.5e-6 for another build: bound 3e-5, about twice the larger figure
    assert worst <= 3e-5


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_quantized_top1_agrees_with_llama_cpp(tiny_model_path, quant):
    path = tiny_model_path(quant)
    model = Model.load(path)
    in_top5 = equal = total = 0
    for tokens in token_sequences(model, 4, 64):
        ours = model.logits(tokens)
        theirs = llama_logits(path, tokens)
        our_top1 = ours.argmax(axis=1)
        their_top5 = np.argsort(-theirs, axis=1, kind="stable")[:, :5]
        in_top5 += int((their_top5 == our_top1[:, None]).any(axis=1).sum())
        equal += int((their_top5[:, 0] == our_top1).sum())
        total += len(tokens)
    print(f"{quant}: top-1 in llama.cpp top-5 {in_top5}/{total}, equal top-1 {equal}/{total}")
    # measured (portable AVX2 build): top-5 256/256 for both; equal top-1 252/256 (q8_0) and 256/256
    # (q4_k_m); issue 12 quotes 247-251/256 for another build. Bounds: 253/256 in the top-5, 243/256
    # equal (4 positions below the lowest figure seen) — a near-tie flips with the summation order
    assert in_top5 / total >= 0.99
    assert equal / total >= 0.95
