"""The DFlash draft forward on the GPU (marked gpu: skipped with a reason where no device is visible).

Against the oracles: the CUDA draft, reading a CUDA target's feature rows, matches the float64
numpy reference on those rows (the bounds of the CPU draft's own test, test_dflash.py), and
proposes what the CPU draft proposes on a CPU target. Exact within the GPU: greedy speculative
decoding with the DFlash draft on the GPU == greedy plain decoding on the GPU, for chain and DDTree,
SpecLA on and off. Cost: a propose call waits for the device once (its top-k read-back) and touches
nothing of the target context's backend. The reduced LM head (set_logit_rows) is gathered on the
device."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model, _native
from pyspecla.dflash_draft import DFlashDraft
from pyspecla.errors import NativeError
from pyspecla.reference.dflash import DFlashReference, topk
from pyspecla.testing.drafts import write_test_draft
from pyspecla.testing.models import write_test_model
from test_dflash import CASES, assert_matches_reference, proposed_over_the_whole_head

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair_path(tmp_path_factory):
    """pair_path(case) -> (target path, draft path) of a test_dflash.CASES case (written once)."""
    folder = tmp_path_factory.mktemp("gpu-dflash")
    made = {}

    def get(case: str):
        if case not in made:
            spec = CASES[case]
            target = str(folder / f"target-{spec['preset']}.gguf")
            write_test_model(target, preset=spec["preset"], quant="f32", seed=0)
            draft = str(folder / f"draft-{case}.gguf")
            write_test_draft(draft, target, seed=1, **spec["draft"])
            made[case] = (target, draft)
        return made[case]

    return get


def open_pair(target: str, draft: str, device: str):
    model = Model.load(target, device=device)
    return model, DFlashDraft.load(draft, model)


def prompt(n_vocab: int, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_draft_matches_the_reference_on_the_gpu_targets_rows(pair_path, case):
    """The bounds are the CPU draft's (test_dflash.py: 1e-4 for F32 drafts, 0.15 for Q8_0 ones,
    whose 8-bit activations can round to neighbouring codes). Measured on the H200 (dba9f65): F32
    drafts 2.6e-6 .. 1.1e-5, the Q8_0 draft 3.8e-2 (the CPU draft: up to 2.1e-5 and 8.2e-2)."""
    spec = CASES[case]
    target, draft_file = pair_path(case)
    model, draft = open_pair(target, draft_file, "cuda")
    reference = DFlashReference.from_gguf(draft_file, target)
    V = model.hparams.n_vocab
    rng = np.random.default_rng(7)
    ctx = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96, max_batch=spec["max_batch"])
    assert ctx.device == "cuda" and dctx.device == "cuda"
    tol = spec.get("tol", 1e-4)
    ctx.eval(rng.integers(0, V, 20))
    assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)), tol=tol)
    ctx.eval(rng.integers(0, V, 7))  # only these rows are ingested
    assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)), n_depths=9, k=6, tol=tol)
    ctx.reset()  # rows dropped: the draft starts over
    ctx.eval(rng.integers(0, V, 30))
    assert_matches_reference(ctx, dctx, reference, root=int(rng.integers(V)), tol=tol)


# The CPU and CUDA drafts on the same proposals: measured on the H200 (dba9f65) 7.4e-6 .. 1.05e-5
# log-prob, ids equal in every slot; the bound is that figure with a margin of ~5.
CPU_GPU_LOGPROB_TOL = 5e-5


def assert_same_proposals(cpu, gpu, what: str):
    (cpu_tokens, cpu_logprobs), (gpu_tokens, gpu_logprobs) = cpu, gpu
    diff = float(np.abs(cpu_logprobs - gpu_logprobs).max())
    assert diff <= CPU_GPU_LOGPROB_TOL, f"{what}: max log-prob difference {diff:.3e}"
    close = np.abs(np.diff(cpu_logprobs, axis=1)) <= CPU_GPU_LOGPROB_TOL
    k = cpu_tokens.shape[1]
    for r, c in zip(*np.nonzero(cpu_tokens != gpu_tokens)):  # only where two entries nearly tie
        assert (c > 0 and close[r, c - 1]) or (c < k - 1 and close[r, c]), f"{what}: row {r} slot {c}"
    print(f"{what}: max |CPU - CUDA| log-prob {diff:.3e}, ids equal at "
          f"{np.mean(cpu_tokens == gpu_tokens):.3f} of the slots")


def test_cuda_draft_proposes_what_the_cpu_draft_proposes(pair_path):
    target, draft_file = pair_path("untied-head-3-layers")
    sides = {device: open_pair(target, draft_file, device) for device in ("cpu", "cuda")}
    V = sides["cpu"][0].hparams.n_vocab
    tokens = prompt(V, 40, seed=21)
    runs = {}
    for device, (model, draft) in sides.items():
        ctx = model.new_context(n_ctx=128, max_tree_nodes=8, capture_layers=draft.target_layer_ids)
        dctx = draft.new_context(n_ctx=128, max_batch=16)
        got = []
        ctx.eval(tokens[:25])
        got.append(dctx.propose(ctx, tokens[25], 15, 8))
        ctx.eval(tokens[25:33])
        got.append(dctx.propose(ctx, tokens[33], 15, 8))
        # a tree verified and a side branch accepted: its rows were moved on the target's stream
        ctx.verify_tree([tokens[33], tokens[34], tokens[35], tokens[36]], [-1, 0, 1, 0])
        ctx.accept([0, 3])
        got.append(dctx.propose(ctx, tokens[37], 15, 8))
        runs[device] = got
    for step, (cpu, gpu) in enumerate(zip(runs["cpu"], runs["cuda"])):
        assert_same_proposals(cpu, gpu, f"step {step}")


def test_a_propose_waits_for_the_device_once(pair_path):
    target, draft_file = pair_path("swa-window-8")
    model, draft = open_pair(target, draft_file, "cuda")
    V = model.hparams.n_vocab
    ctx = model.new_context(n_ctx=96, capture_layers=draft.target_layer_ids)
    dctx = draft.new_context(n_ctx=96, max_batch=6)
    ctx.eval(prompt(V, 20, seed=3))
    dctx.propose(ctx, 5, 15, 8)  # first call: ingests the prompt
    for step in range(4):
        ctx.eval([(7 * step + 1) % V, (7 * step + 2) % V])
        ctx.launch_counters()
        dctx.launch_counters()
        dctx.propose(ctx, 9, 15, 8)
        launches, waits = dctx.launch_counters()
        assert waits == 1, f"step {step}: a propose call waited {waits} times (want 1: the top-k read-back)"
        assert launches > 0
        assert ctx.launch_counters() == (0, 0), "a propose call used the target context's backend"


def test_a_recorded_proposal_equals_the_eager_one(pair_path):
    """A proposal is recorded once per (depths, top-k, LM head) and replayed: its block, head and
    top-k read n_past, the root token and the sliding window's start from device data. Replayed,
    it gives the eager proposal's bits while the 8-row window moves down the cache, 1..7 rows are
    ingested between calls, a side branch is accepted, the key changes and the target is reset; a
    call with nothing to ingest is one launch (the replay) and one wait."""
    target, draft_file = pair_path("swa-window-8")
    model, draft = open_pair(target, draft_file, "cuda")
    V = model.hparams.n_vocab
    tokens = prompt(V, 120, seed=41)
    ctx = model.new_context(n_ctx=160, max_tree_nodes=8, capture_layers=draft.target_layer_ids)
    recorded = draft.new_context(n_ctx=160, max_batch=6)
    eager = draft.new_context(n_ctx=160, max_batch=6, recorded_steps=False)

    def same(step: str, depths: int = 15, k: int = 8):
        root = tokens[ctx.n_past % len(tokens)]
        got, want = recorded.propose(ctx, root, depths, k), eager.propose(ctx, root, depths, k)
        assert np.array_equal(got[0], want[0]), f"{step}: ids"
        assert np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32)), f"{step}: log-probs"

    ctx.eval(tokens[:3])
    same("n_past 3 (recorded here)")
    at = 3
    for step, n in enumerate([1, 7, 2, 5, 3, 6, 4]):  # n_past 4 .. 31: the window passes row 0
        ctx.eval(tokens[at:at + n])
        at += n
        same(f"step {step}, n_past {ctx.n_past}")
    recorded.launch_counters()
    same("nothing to ingest")
    launches, waits = recorded.launch_counters()
    assert (launches, waits) == (1, 1), f"a replayed proposal with nothing to ingest: {launches} launches, {waits} waits"
    ctx.verify_tree(tokens[at:at + 4], [-1, 0, 1, 0])
    ctx.accept([0, 3])  # a side branch: the target moved its rows, the draft re-ingests them
    same("after a side branch")
    same("another key: 6 depths, top 3", depths=6, k=3)
    same("the first key again")
    ctx.reset()
    ctx.eval(tokens[50:90])
    same("after a reset, 40 rows")
    assert ctx.device == "cuda" and recorded.device == "cuda"


# the fused forms a proposal's block takes on a GPU, each against its switch off: (variable, launches
# fewer per draft layer with it on; None: the same launches, other kernels)
DRAFT_FUSIONS = [
    # Q and K norms, RoPEs and the block's K/V cache rows: one attention_prepare kernel for six ops
    ("SPECLA_CUDA_FUSED_ATTENTION_PREPARE", 5),
    # the residual adds read the o and down projections' split-K partial sums (add_rms_norm)
    ("SPECLA_CUDA_UNFINISHED_MATMUL", None),
    # ... and write the Q8_K blocks a K-quant matmul would take (F32 / F16 drafts take none)
    ("SPECLA_CUDA_FUSED_QUANTIZE", None),
]


@pytest.fixture(scope="module")
def f16_pair(pair_path, tmp_path_factory):
    """(target, draft) of the untied-head-3-layers case with an F16 draft: the published drafts' weight
    type, whose matmuls take the tensor-core path (the activation split, the split-K partial sums
    the norms read) that the F32 and Q8_0 cases do not."""
    target, _ = pair_path("untied-head-3-layers")
    draft = str(tmp_path_factory.mktemp("gpu-dflash-f16") / "draft-f16.gguf")
    write_test_draft(draft, target, seed=1, quant="f16", n_layer=3)
    return target, draft


@pytest.mark.parametrize("quant", ["f32", "f16"])
@pytest.mark.parametrize("variable,fewer_launches", DRAFT_FUSIONS, ids=[v for v, _ in DRAFT_FUSIONS])
def test_the_drafts_fused_ops_give_the_ops_bits(pair_path, f16_pair, variable, fewer_launches, quant):
    """A proposal's block on a GPU runs each layer's Q/K norms, RoPEs and K/V cache rows as one
    attention_prepare and each residual add with the norm after it as one add_rms_norm that reads
    the matmul's partial sums. With each backend switch off (0) it runs the unfused ops instead; eager
    proposals give the same bits either way (rows ingested between calls, a side branch accepted),
    and attention_prepare saves 5 launches per draft layer of a proposal with nothing to ingest."""
    target, draft_file = f16_pair if quant == "f16" else pair_path("untied-head-3-layers")
    model, draft = open_pair(target, draft_file, "cuda")
    tokens = prompt(model.hparams.n_vocab, 40, seed=43)
    runs, launches = {}, {}
    with pytest.MonkeyPatch.context() as mp:
        for value in ("0", "1"):
            mp.setenv(variable, value)  # read when a context opens its backend
            ctx = model.new_context(n_ctx=96, max_tree_nodes=8, capture_layers=draft.target_layer_ids)
            dctx = draft.new_context(n_ctx=96, max_batch=6, recorded_steps=False)
            ctx.eval(tokens[:20])
            got = [dctx.propose(ctx, tokens[20], 15, 8)]
            ctx.eval(tokens[20:27])
            got.append(dctx.propose(ctx, tokens[27], 15, 8))
            ctx.verify_tree(tokens[27:31], [-1, 0, 1, 0])
            ctx.accept([0, 3])
            got.append(dctx.propose(ctx, tokens[31], 15, 8))
            dctx.launch_counters()
            got.append(dctx.propose(ctx, tokens[32], 15, 8))
            launches[value] = dctx.launch_counters()[0]
            runs[value] = got
            dctx.close()
            ctx.close()
    for call, ((want_ids, want_lp), (got_ids, got_lp)) in enumerate(zip(runs["0"], runs["1"])):
        assert np.isfinite(got_lp).all(), f"call {call}"
        assert np.array_equal(got_ids, want_ids), f"call {call}: ids"
        assert np.array_equal(got_lp.view(np.uint32), want_lp.view(np.uint32)), f"call {call}: log-probs"
    if fewer_launches is not None:
        assert launches["0"] - launches["1"] == fewer_launches * draft.hparams.n_layer, launches


def test_a_recorded_proposal_follows_a_chosen_head_that_grows(pair_path):
    """A chosen head (set_logit_rows) that grows within its memory keeps the recorded proposal: the
    head is multiplied over its capacity and the top-k reads the row count on the device, so a
    vocabulary that gains a token (every step of a generation that emits new ones) replays rather
    than records again. Each proposal has the eager one's bits and ranks only the chosen rows; one
    with nothing to ingest is one launch."""
    target, draft_file = pair_path("swa-window-8")
    model, draft = open_pair(target, draft_file, "cuda")
    V = model.hparams.n_vocab
    tokens = prompt(V, 40, seed=43)
    ctx = model.new_context(n_ctx=64, capture_layers=draft.target_layer_ids)
    ctx.eval(tokens)
    recorded = draft.new_context(n_ctx=64, max_batch=6)
    eager = draft.new_context(n_ctx=64, max_batch=6, recorded_steps=False)
    order = np.random.default_rng(9).permutation(V).astype(np.int32)
    root = tokens[-1]
    recorded.set_logit_rows(order[: V // 8])
    recorded.propose(ctx, root, 6, 4)  # ingests the 40 rows and records
    for n in (V // 8 + 1, V // 4, V // 2 + 3):  # within the memory of V // 8 rows' capacity (V at this V)
        for dc in (recorded, eager):
            dc.set_logit_rows(order[:n])
        recorded.launch_counters()  # the rows' gathers are not the proposal's
        got, want = recorded.propose(ctx, root, 6, 4), eager.propose(ctx, root, 6, 4)
        launches, _ = recorded.launch_counters()
        assert launches == 1, f"{n} chosen rows: {launches} launches (1: the replay; more: recorded again)"
        assert np.isin(got[0], order[:n]).all(), f"{n} chosen rows: a token outside them"
        assert np.array_equal(got[0], want[0]), f"{n} chosen rows: ids"
        assert np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32)), f"{n} chosen rows: log-probs"


def test_reduced_head_rows_are_gathered_on_the_device(pair_path):
    target, draft_file = pair_path("swa-window-8")
    model, draft = open_pair(target, draft_file, "cuda")
    reference = DFlashReference.from_gguf(draft_file, target)
    rng = np.random.default_rng(5)
    V = model.hparams.n_vocab
    ctx, root, (full_tokens, full_logprobs), _, block = proposed_over_the_whole_head(model, draft, reference, rng)
    ids = np.sort(rng.permutation(V)[: V // 3]).astype(np.int32)
    grown = draft.new_context(n_ctx=64)
    for n in (40, 41, 200, len(ids)):  # a vocabulary that grows: only the new rows are gathered
        grown.set_logit_rows(ids[:n])
        tokens, logprobs = grown.propose(ctx, root, 6, 4)
        want_index, want_logprobs = topk(block[:, ids[:n]], 6, 4)
        assert np.abs(logprobs - want_logprobs).max() <= 1e-4, n
        assert np.isin(tokens, ids[:n]).all()
    fresh = draft.new_context(n_ctx=64)
    fresh.set_logit_rows(ids)
    again = fresh.propose(ctx, root, 6, 4)
    assert np.array_equal(again[0], tokens) and np.array_equal(again[1].view(np.uint32), logprobs.view(np.uint32))
    grown.set_logit_rows(None)
    back_tokens, back_logprobs = grown.propose(ctx, root, 6, 4)
    assert np.array_equal(back_tokens, full_tokens) and np.array_equal(back_logprobs, full_logprobs)


def test_target_context_scores_chosen_head_rows_on_the_device(pair_path):
    """specla_context_set_logit_rows on a GPU context (the same device gather): the logits of the
    chosen rows are the full head's entries of those ids. The matmul's chunking follows the row
    count (mm_plan_for), but this head is narrow enough that both row counts cut each row into the
    same chunks, so the bits are equal: measured 0.0 on the H200 (dba9f65). A head whose two plans
    differ would differ by the float order of one dot product."""
    target, _ = pair_path("untied-head-3-layers")
    model = Model.load(target, device="cuda")
    V = model.hparams.n_vocab
    tokens = prompt(V, 12, seed=8)
    full = model.new_context(n_ctx=32).eval(tokens, logits_all=True)
    ids = np.sort(np.random.default_rng(9).permutation(V)[:300]).astype(np.int32)
    ctx = model.new_context(n_ctx=32)
    ctx.set_logit_rows(ids)
    chosen = ctx.eval(tokens, logits_all=True)
    rel = np.abs(chosen - full[:, ids]).max() / np.abs(full[:, ids]).max()
    print(f"chosen head rows vs the whole head: max relative difference {rel:.2e}")
    assert np.array_equal(chosen.view(np.uint32), full[:, ids].view(np.uint32)), f"max relative difference {rel:.2e}"


@pytest.fixture(scope="module")
def generation_pair(tmp_path_factory):
    """generation_pair(quant) -> (tiny8 target, draft) paths, as the demo's pair (written once)."""
    folder = tmp_path_factory.mktemp("gpu-dflash-generate")
    made = {}

    def get(quant: str):
        if quant not in made:
            target, draft = str(folder / f"target-{quant}.gguf"), str(folder / f"draft-{quant}.gguf")
            write_test_model(target, preset="tiny8", quant=quant, seed=1)
            write_test_draft(draft, target, seed=1, quant=quant)
            made[quant] = (target, draft)
        return made[quant]

    return get


@pytest.mark.parametrize("mode,specla", [("chain", False), ("chain", True), ("ddtree", False), ("ddtree", True)])
@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_greedy_with_the_dflash_draft_on_the_gpu_equals_plain_greedy(generation_pair, quant, mode, specla):
    target, draft_file = generation_pair(quant)
    model = Model.load(target, device="cuda")
    assert DFlashDraft.load(draft_file, model).new_context(n_ctx=16).device == "cuda"
    V = model.hparams.n_vocab
    for i in range(4):
        p = prompt(V, 5 + 3 * i, seed=30 + i)
        plain = model.generate(p, 48)
        spec = model.generate(p, 48, draft=draft_file, specla=specla, no_ddtree=mode == "chain")
        assert spec == plain, f"{quant} {mode} specla={specla} prompt {i}"
    model.close()


@pytest.mark.skipif(_native.cuda_device_count() < 2, reason="needs two CUDA devices")
def test_a_draft_on_another_device_than_its_target_is_refused(pair_path):
    target, draft_file = pair_path("swa-window-8")
    model, draft = open_pair(target, draft_file, "cuda:0")
    ctx = model.new_context(n_ctx=32, capture_layers=draft.target_layer_ids)
    ctx.eval([1, 2, 3])
    model.device = "cuda:1"  # the draft context follows the model's device: put it on the other one
    dctx = draft.new_context(n_ctx=32)
    model.device = "cuda:0"
    with pytest.raises(NativeError, match="the target context runs on cuda device 0, the draft context on cuda "
                                          "device 1"):
        dctx.propose(ctx, 1, 3, 4)
