"""The recorded verify on the GPU (issue 14: the graph path == the eager path, bit for bit).

A tree verify that wants only the argmax is recorded per (node count, factor bank it writes, LM
head) the second time that key comes, and replayed after, whatever the tree's shape, the prefix length or the pending path
(docs/gpu-steps.md). Two contexts of one model run the same steps, one with recorded steps and one
eager: every verify's argmax, the launch counts (a replay is one launch, so a verify that silently
ran eagerly shows), the committed features, the durable state after finish and greedy speculative
output must agree bit for bit; and a recorded decode step runs as many kernels (CUDA's count of its
recording) as the same step counts when run op by op. Marked gpu: skipped with a reason where no device is visible (the
CPU backend records nothing; the CPU suite checks the same verify ops eagerly)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.speculative.drafters import NgramDrafter, OracleDrafter
from pyspecla.speculative.loop import SpecConfig, generate
from pyspecla.testing.models import write_test_model

pytestmark = pytest.mark.gpu

N_NODES = 9  # most steps: a recording per factor bank is reused; a few steps use other counts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("gpu-recorded-verify") / "tiny8-qwen35-q4_k_m.gguf", "tiny8",
                            "q4_k_m", seed=7, arch="qwen35")
    m = Model.load(str(path), device="cuda")
    yield m
    m.close()


def random_tree(rng, n):
    """Parents of an n-node tree, node 0 the root, every parent before its child."""
    return [-1] + [int(rng.integers(0, i)) for i in range(1, n)]


def path_to(parents, leaf):
    path = []
    while leaf >= 0:
        path.insert(0, leaf)
        leaf = parents[leaf]
    return path


def steps(n_vocab, seed, n_steps=14):
    """(tokens, parents, accepted path) per step: mostly N_NODES nodes, two steps of 5 and 12 (keys
    seen once: eager, in the recording context); paths alternate between the prefix path 0..n-1 of
    a chain (a bank swap on accept) and a side branch (a gather), so both banks' recordings are
    made and replayed and the pending path's length changes from step to step."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_steps):
        n = 5 if i == 6 else 12 if i == 9 else N_NODES
        if i % 3 == 0:
            parents = list(range(-1, n - 1))  # a chain: its prefix paths are 0..d
            path = list(range(int(rng.integers(1, n + 1))))
        else:
            parents = random_tree(rng, n)
            path = path_to(parents, int(rng.integers(1, n)))
        out.append((rng.integers(0, n_vocab, n).tolist(), parents, path))
    return out


def test_recorded_verify_equals_eager_bit_for_bit(model):
    layers = model.hparams.n_layer
    prompt = np.random.default_rng(11).integers(0, model.hparams.n_vocab, 13).tolist()
    contexts = {}
    for recorded in (True, False):
        ctx = model.new_context(n_ctx=512, max_tree_nodes=16, capture_layers=[0, layers - 1],
                                recorded_steps=recorded)
        assert ctx.device == "cuda"
        ctx.eval(prompt)
        contexts[recorded] = ctx
    replays, eager_launches, occurrences, bank = 0, [], {}, 0
    for i, (tokens, parents, path) in enumerate(steps(model.hparams.n_vocab, seed=3)):
        got = {}
        for recorded, ctx in contexts.items():
            ctx.launch_counters()  # reset
            got[recorded] = ctx.verify_tree(tokens, parents)
            launches = ctx.launch_counters()[0]
            if recorded:
                key = (len(tokens), bank)  # what the context keys its recordings by (same LM head)
                occurrences[key] = occurrences.get(key, 0) + 1
                if occurrences[key] > 2:  # eager the first time, recorded the second, replayed after
                    assert launches == 1, f"step {i}: a verify of a recorded key ran {launches} launches"
                    replays += 1
                else:
                    assert launches > 1, f"step {i}: verify {occurrences[key]} of key {key} ran one launch"
            else:
                eager_launches.append(launches)
            ctx.accept(path)
        assert np.array_equal(got[True], got[False]), f"step {i}: argmax of the recorded verify differs"
        if path == list(range(len(path))):
            bank ^= 1  # a prefix path swaps the factor banks: the other bank's recording next time
    assert replays >= 8, f"only {replays} verifies replayed a recording"
    assert min(eager_launches) > layers, f"the eager verifies ran {eager_launches} launches"
    n = contexts[True].n_past
    assert n == contexts[False].n_past
    assert np.array_equal(contexts[True].read_features(0, n), contexts[False].read_features(0, n)), \
        "committed features differ"
    probe = [3, 5, 7]
    logits = []
    for ctx in contexts.values():
        ctx.finish()
        logits.append(ctx.eval(probe, logits_all=True))
        ctx.close()
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32)), "durable state after finish differs"


def test_recorded_verify_argmax_is_the_argmax_of_the_eager_verify_logits(model):
    """A recording returns only the argmax; the same trees verified eagerly with logits, in a
    context with the same history: the recorded argmax is their argmax at every node (lowest id on
    ties, as argmax_rows breaks them)."""
    prompt = np.random.default_rng(12).integers(0, model.hparams.n_vocab, 9).tolist()
    recorded = model.new_context(n_ctx=256, max_tree_nodes=16)
    eager = model.new_context(n_ctx=256, max_tree_nodes=16, recorded_steps=False)
    for ctx in (recorded, eager):
        ctx.eval(prompt)
    for i, (tokens, parents, path) in enumerate(steps(model.hparams.n_vocab, seed=4, n_steps=8)):
        argmax = recorded.verify_tree(tokens, parents)
        eager_argmax, logits = eager.verify_tree(tokens, parents, want_logits=True)
        assert np.array_equal(argmax, eager_argmax), f"step {i}"
        assert np.array_equal(argmax, np.argmax(logits, axis=1)), f"step {i}: logits and argmax disagree"
        recorded.accept(path)
        eager.accept(path)
    recorded.close()
    eager.close()


@pytest.mark.parametrize("specla", [True, False], ids=["specla", "dense"])
def test_greedy_speculative_output_same_with_recorded_steps_on_and_off(model, specla):
    V, layers = model.hparams.n_vocab, model.hparams.n_layer
    rng = np.random.default_rng(2027)
    for i in range(6):
        prompt = rng.integers(0, V, int(rng.integers(1, 20))).tolist()
        plain = model.generate(prompt, 96 + 24)
        config = SpecConfig(mode="ddtree", specla=specla, tau=6.0 if specla else None, top_k=4 if specla else 8)
        outputs = []
        for recorded in (True, False):
            drafter = OracleDrafter(0.85, plain, V, seed=i, true_ranks=(0, 1, 2, 3), capture_layers=[0, layers - 1])
            verify_method, commit_method = config.methods
            ctx = model.new_context(n_ctx=len(prompt) + 96 + config.max_tree_nodes + 1,
                                    max_tree_nodes=config.max_tree_nodes, verify_method=verify_method,
                                    commit_method=commit_method, capture_layers=[0, layers - 1],
                                    recorded_steps=recorded)
            stats, ctx = generate(model, prompt, 96, config, drafter=drafter, context=ctx)
            outputs.append(stats.tokens)
            ctx.close()
        assert outputs[0] == outputs[1] == plain[:96], f"prompt {i}, specla={specla}"
        stats, ctx = generate(model, prompt, 96, SpecConfig(mode="ddtree", specla=specla), drafter=NgramDrafter())
        assert stats.tokens == plain[:96], f"prompt {i}: n-gram drafter, specla={specla}"
        ctx.close()


def test_recorded_decode_runs_the_kernels_the_eager_decode_counts(model):
    """A recorded decode step is one launch that runs CUDA's count of kernel nodes in its recording;
    the same step run op by op must count exactly as many launches and kernels. This checks the
    backend's op-by-op count against CUDA's own (the matmul calls launch a quantize kernel and a
    kernel per weight type, which the count missed until the matmul reported them)."""
    prompt = np.random.default_rng(5).integers(0, model.hparams.n_vocab, 9).tolist()
    counts = {}
    for recorded in (True, False):
        ctx = model.new_context(n_ctx=256, recorded_steps=recorded)
        ctx.eval(prompt)
        for t in range(3):  # the first argmax decode records the step, the next ones replay it
            ctx.eval_argmax([t + 1])
        ctx.launch_counters()  # reset
        ctx.eval_argmax([7])
        counts[recorded] = ctx.step_counters()
        ctx.close()
    (launches_r, _, kernels_r), (launches_e, _, _) = counts[True], counts[False]
    assert launches_r == 1, f"the recorded decode step ran {launches_r} launches, not one replay"
    assert kernels_r == launches_e, (f"the recording holds {kernels_r} kernels, the op-by-op step launched "
                                     f"{launches_e}")


def test_a_step_waits_for_the_device_once(model):
    """Issue 14: a step's host waits are its result's read-back and nothing else. A decode step and
    a verify (recorded and eager) each read back their argmax, one wait; an accept waits for nothing
    (its device work finishes inside the next verify)."""
    prompt = np.random.default_rng(7).integers(0, model.hparams.n_vocab, 11).tolist()
    for recorded in (True, False):
        ctx = model.new_context(n_ctx=256, max_tree_nodes=8, recorded_steps=recorded)
        ctx.eval(prompt)
        for t in range(4):  # recorded: the first decode records the step, the later ones replay it
            ctx.launch_counters()
            ctx.eval_argmax([t + 1])
            waits = ctx.launch_counters()[1]
            assert waits == 1, f"recorded={recorded}: decode {t} waited {waits} times (want 1: the argmax)"
        parents = [-1, 0, 1, 1, 3]
        for step in range(4):  # recorded: eager, recorded, then replayed
            ctx.launch_counters()
            ctx.verify_tree([5, 6, 7, 8, 9], parents)
            waits = ctx.launch_counters()[1]
            assert waits == 1, f"recorded={recorded}: verify {step} waited {waits} times (want 1: the argmax)"
            ctx.accept([0, 1, 3])
            waits = ctx.launch_counters()[1]
            assert waits == 0, f"recorded={recorded}: accept {step} waited {waits} times"
        ctx.close()


def test_an_accept_launches_only_for_rows_that_move(model):
    """Accepting the tree's first nodes (a DDTree's spine, usually) swaps the factor banks and moves
    no KV or feature row: no launch. A side path gathers its factors (one launch) and moves the rows
    that are not in place yet (two per attention layer, one for the features): a fixed count, the same
    for a path with one row out of place as with two."""
    prompt = np.random.default_rng(8).integers(0, model.hparams.n_vocab, 9).tolist()
    ctx = model.new_context(n_ctx=128, max_tree_nodes=8, capture_layers=[0])
    ctx.eval(prompt)
    parents = [-1, 0, 1, 1, 3, 0]
    side = set()
    for path in ([0, 1, 2], [0, 1, 3], [0, 1, 3, 4], [0, 5], [0]):
        ctx.verify_tree([5, 6, 7, 8, 9, 10], parents)
        ctx.launch_counters()
        ctx.accept(path)
        launches, waits = ctx.launch_counters()
        assert waits == 0, f"accept {path} waited {waits} times"
        if path == list(range(len(path))):
            assert launches == 0, f"accept {path} (the first nodes) launched {launches} kernels"
        else:
            assert launches > 0, f"accept {path} launched nothing"
            side.add(launches)
    assert len(side) == 1, f"side paths launched different counts: {sorted(side)}"
    ctx.close()


def test_recorded_steps_follow_a_chosen_head_that_grows(model):
    """A chosen LM head (set_logit_rows: an autoregressive draft's reduced vocabulary, which gains
    the generation's new tokens) that grows within its memory keeps the recorded decode step and the
    recorded verify: the head is multiplied over its capacity and the argmax ranks the first n rows,
    a count read on the device. Each step's decode and verify replay (one launch each) and their
    argmax are the eager context's, tokens of the chosen rows. (A step ends with a decode that takes
    the accept's pending commit, so the next step's decode launches only itself.)"""
    V = model.hparams.n_vocab
    rng = np.random.default_rng(11)
    order = rng.permutation(V).astype(np.int32)
    prompt = rng.integers(0, V, 9).tolist()
    parents = [-1, 0, 1, 1, 3]
    ctxs = {rec: model.new_context(n_ctx=256, max_tree_nodes=8, recorded_steps=rec) for rec in (True, False)}
    sizes = [V // 8] * 3 + [V // 8 + 1, V // 4, V // 2 + 3]  # the first steps record; then the head grows
    for ctx in ctxs.values():
        ctx.eval(prompt)
    for step, n in enumerate(sizes):
        tokens = rng.integers(0, V, len(parents)).tolist()
        got = {}
        for rec, ctx in ctxs.items():
            ctx.set_logit_rows(order[:n])
            ctx.launch_counters()  # the rows' gathers are not the step's
            decoded = ctx.eval_argmax([int(order[step])])
            decode_launches = ctx.launch_counters()[0]
            verified = ctx.verify_tree(tokens, parents)
            verify_launches = ctx.launch_counters()[0]
            ctx.accept([0, 1, 3])
            after = ctx.eval_argmax([int(order[step + 1])])  # takes the accept's pending commit
            got[rec] = (decoded, verified.tolist(), after)
            if rec and step >= 2:  # the decode recorded at step 0, the verify at step 1 (its second time)
                assert decode_launches == 1, f"{n} rows: the decode step ran {decode_launches} launches, not a replay"
                assert verify_launches == 1, f"{n} rows: the verify ran {verify_launches} launches, not a replay"
        assert got[True] == got[False], f"{n} rows: recorded {got[True]}, eager {got[False]}"
        chosen = set(order[:n].tolist())
        tokens_out = [got[True][0], *got[True][1], got[True][2]]
        assert set(tokens_out) <= chosen, f"{n} rows: a token outside the chosen rows"
    for ctx in ctxs.values():
        ctx.close()


def test_recorded_verify_across_the_depth_classes_equals_eager(model):
    """A verify whose nodes see at most 1024 rows (DECODE_SHALLOW_ROWS) in a larger context replays a
    recording bounded there (its attention grids have blocks for 8 segments, not the capacity's), a
    deeper one a recording bounded by the capacity: each class is recorded and replayed on its side
    of the boundary, and every argmax and the state after finish equal the same steps run eagerly."""
    V = model.hparams.n_vocab
    prompt = np.random.default_rng(12).integers(0, V, 960).tolist()
    contexts = {rec: model.new_context(n_ctx=2048, max_tree_nodes=16, recorded_steps=rec) for rec in (True, False)}
    for ctx in contexts.values():
        ctx.eval(prompt)
    replays = {"shallow": 0, "deep": 0}
    for i, (tokens, parents, path) in enumerate(steps(V, seed=5, n_steps=40)):
        side = "shallow" if contexts[True].n_past + len(tokens) <= 1024 else "deep"
        got = {}
        for rec, ctx in contexts.items():
            ctx.launch_counters()
            got[rec] = ctx.verify_tree(tokens, parents)
            if rec and ctx.launch_counters()[0] == 1:
                replays[side] += 1
            ctx.accept(path)
        assert np.array_equal(got[True], got[False]), f"step {i} ({side}): argmax of the recorded verify differs"
    assert replays["shallow"] >= 2 and replays["deep"] >= 2, replays
    logits = []
    for ctx in contexts.values():
        ctx.finish()
        logits.append(ctx.eval([3, 5, 7], logits_all=True))
        ctx.close()
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32)), "durable state after finish differs"
