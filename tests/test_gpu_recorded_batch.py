"""Recorded causal batches on the GPU: the graph path == the eager path, bit for bit.

By default (SPECLA_CUDA_RECORDED_BATCHES=0 turns it off), a causal batch of more than one token
that returns no logits (eval_argmax's chunks: the last one's argmax, the ones before it nothing) is
recorded per (token count, argmax or not, LM head) the second time that key comes, and replayed
after, at whatever position (docs/gpu-steps.md). Two contexts of one model run the same batches,
one recording and one eager: every argmax, the launch counts (a replay is one launch, so a batch
that silently ran eagerly shows), the kernels a replay runs against the eager batch's launches, and
the state the batches leave (a probe's logits) must agree. Marked
gpu: skipped with a reason where no device is visible (the CPU backend records nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.testing.models import write_test_model

pytestmark = pytest.mark.gpu

MAX_BATCH = 8


@pytest.fixture(scope="module", params=["qwen35", "qwen3"])
def model(request, tmp_path_factory):
    arch = request.param
    path = write_test_model(tmp_path_factory.mktemp("gpu-recorded-batch") / f"tiny8-{arch}-q4_k_m.gguf", "tiny8",
                            "q4_k_m", seed=9, arch=arch)
    m = Model.load(str(path), device="cuda")
    yield m
    m.close()


def test_recorded_batches_equal_eager_bit_for_bit(model, monkeypatch):
    monkeypatch.setenv("SPECLA_CUDA_RECORDED_BATCHES", "1")  # read when a context opens
    V = model.hparams.n_vocab
    rng = np.random.default_rng(21)
    # batch sizes in order: 5 and 7 are recorded at their second batch and replayed from the third,
    # 2 too; 3 comes once (eager); 20 tokens are chunks 8, 8 (no output: key (8, argmax no)) and 4
    sizes = [5, 5, 5, 7, 20, 5, 7, 7, 3, 20, 2, 5, 2, 20, 2, 7]
    ctxs = {rec: model.new_context(n_ctx=512, max_batch=MAX_BATCH, recorded_steps=rec) for rec in (True, False)}
    prompt = rng.integers(0, V, 7).tolist()  # one chunk, with logits: eager, no key seen
    for ctx in ctxs.values():
        ctx.eval(prompt)
        ctx.save_state()
    seen, replays = {}, 0
    eager_launches, replay_kernels = {}, {}
    for i, n in enumerate(sizes):
        tokens = rng.integers(0, V, n).tolist()
        got = {}
        for rec, ctx in ctxs.items():
            chunk_counts = []

            def progress(done, total, ctx=ctx, chunk_counts=chunk_counts):
                chunk_counts.append((done, ctx.step_counters()))

            ctx.step_counters()  # reset
            got[rec] = ctx.eval_argmax(tokens, on_progress=progress)
            start = 0
            for done, (launches, _, kernels) in chunk_counts:
                key = (done - start, done == n)  # the chunk's token count, whether it scores the argmax
                start = done
                if not rec:
                    eager_launches[key] = launches
                    continue
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 2:  # eager the first time, recorded the second, replayed after
                    assert launches == 1, f"batch {i}: chunk {key} (time {seen[key]}) ran {launches} launches"
                    replay_kernels[key] = kernels
                    replays += 1
                elif key[0] > 1:
                    assert launches > 1, f"batch {i}: chunk {key} (time {seen[key]}) ran one launch"
        assert got[True] == got[False], f"batch {i} ({n} tokens): recorded {got[True]}, eager {got[False]}"
        if i == 8:  # back to the saved position: the next batches rewrite the rows after it
            for ctx in ctxs.values():
                ctx.truncate(len(prompt))
    assert replays >= 8, f"only {replays} batches replayed a recording"
    assert replay_kernels.keys() >= {(5, True), (7, True), (8, False), (2, True)}, sorted(replay_kernels)
    for key, kernels in replay_kernels.items():
        assert kernels == eager_launches[key], (f"chunk {key}: the recording holds {kernels} kernels, the eager "
                                                f"batch launched {eager_launches[key]}")
    n_past = ctxs[True].n_past
    assert n_past == ctxs[False].n_past == len(prompt) + sum(sizes[9:])
    logits = [ctx.eval([3, 5, 7], logits_all=True) for ctx in ctxs.values()]
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32)), "the state after the batches differs"
    for ctx in ctxs.values():
        ctx.close()


def test_batches_are_recorded_by_default_and_eager_with_the_switch_off(model, monkeypatch):
    """SPECLA_CUDA_RECORDED_BATCHES unset: the third batch of one size replays its recording (one
    launch); set to 0, it still launches its kernels one by one (test_gpu_model.py checks that a value
    other than 0 or 1 is refused)."""
    V = model.hparams.n_vocab
    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv("SPECLA_CUDA_RECORDED_BATCHES", raising=False)
        else:
            monkeypatch.setenv("SPECLA_CUDA_RECORDED_BATCHES", value)
        ctx = model.new_context(n_ctx=128, max_batch=MAX_BATCH)
        for i in range(3):
            ctx.launch_counters()
            ctx.eval_argmax([(5 * i + j) % V for j in range(6)])
            launches = ctx.launch_counters()[0]
        if value is None:
            assert launches == 1, f"by default the third batch ran {launches} launches, not its recording"
        else:
            assert launches > 1, f"SPECLA_CUDA_RECORDED_BATCHES=0: the third batch ran {launches} launch"
        ctx.close()


def test_recorded_batches_across_the_depth_classes_equal_eager(model, monkeypatch):
    """A batch whose queries see at most 1024 rows (DECODE_SHALLOW_ROWS) in a larger context replays a
    recording bounded there, a deeper one a recording bounded by the capacity: batches of 6 tokens from
    position 990 to past 1100, each class recorded and replayed on its side, every argmax and the
    state they leave equal to the same batches run eagerly."""
    monkeypatch.setenv("SPECLA_CUDA_RECORDED_BATCHES", "1")
    V = model.hparams.n_vocab
    rng = np.random.default_rng(23)
    ctxs = {rec: model.new_context(n_ctx=2048, max_batch=MAX_BATCH, recorded_steps=rec) for rec in (True, False)}
    prompt = rng.integers(0, V, 990).tolist()
    for ctx in ctxs.values():
        ctx.eval(prompt)
    replays = {"shallow": 0, "deep": 0}
    for i in range(20):
        tokens = rng.integers(0, V, 6).tolist()
        side = "shallow" if ctxs[True].n_past + len(tokens) <= 1024 else "deep"
        got = {}
        for rec, ctx in ctxs.items():
            ctx.step_counters()
            got[rec] = ctx.eval_argmax(tokens)
            if rec and ctx.step_counters()[0] == 1:
                replays[side] += 1
        assert got[True] == got[False], f"batch {i} ({side}): recorded {got[True]}, eager {got[False]}"
    assert replays["shallow"] >= 2 and replays["deep"] >= 2, replays
    logits = [ctx.eval([3, 5, 7], logits_all=True) for ctx in ctxs.values()]
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32)), "the state after the batches differs"
    for ctx in ctxs.values():
        ctx.close()
