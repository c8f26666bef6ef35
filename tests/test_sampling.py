"""The sampler (pyspecla.sampling): the processed distribution against its oracle
(pyspecla.reference.sampling), filter edge cases and ties, the keyed random stream, a goodness-of-fit
test of the draws, seeded reproducibility and the errors bad settings give."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyspecla import UsageError
from pyspecla.reference import sampling as oracle
from pyspecla.sampling import (
    SamplingParams,
    TokenSampler,
    inverse_cdf,
    keyed_uniform,
    probabilities,
    processed_logits,
)


def random_params(rng) -> SamplingParams:
    return SamplingParams(
        temperature=float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.8])),
        top_k=int(rng.choice([0, 1, 3, 40, 5000])),
        top_p=float(rng.choice([1.0, 0.95, 0.5, 0.05, 1e-9])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3, 1.0])),
        repeat_penalty=float(rng.choice([1.0, 1.1, 1.5, 0.8])),
        presence_penalty=float(rng.choice([0.0, 0.5, -0.3])),
        frequency_penalty=float(rng.choice([0.0, 0.25])),
        penalty_last_n=int(rng.choice([64, 0, -1, 5])),
    )


@pytest.mark.parametrize("V", [7, 64, 3000])  # 3000: the top-p cut's partial sort (over 1024 candidates) is used
def test_processed_logits_equal_the_oracle_bit_for_bit(V, seed):
    rng = np.random.default_rng(seed)
    for trial in range(40 if V < 1000 else 12):
        logits = (rng.standard_normal(V) * rng.choice([0.5, 3.0, 12.0])).astype(np.float32)
        if trial % 4 == 0:  # ties: a few repeated values
            logits = np.round(logits).astype(np.float32)
        history = rng.integers(0, V, int(rng.integers(0, 120))).tolist()
        params = random_params(rng)
        ours = processed_logits(logits, history, params)
        expected = np.array(oracle.processed_logits(logits, history, params))
        assert ours.dtype == np.float64
        assert np.array_equal(ours, expected), (trial, params)
        assert np.isfinite(ours).any(), "a filter left no token"
        if not params.greedy:
            p = probabilities(ours, params.temperature)
            q = np.array(oracle.probabilities(list(expected), params.temperature))
            # measured over 400 seeds x 36 draws: <= 4.4e-16 apart (2 ulp at 1; the oracle sums with
            # math.fsum, ours pairwise in log space); a running-sum oracle drifted up to 2.2e-14
            assert np.abs(p - q).max() <= 2e-15
            assert abs(p.sum() - 1.0) <= 1e-12


def test_the_logits_given_are_not_modified():
    logits = np.array([1.0, 3.0, -2.0], dtype=np.float32)
    processed_logits(logits, [1, 1, 2], SamplingParams(temperature=1.0, top_k=1, repeat_penalty=2.0,
                                                       presence_penalty=1.0))
    assert logits.tolist() == [1.0, 3.0, -2.0]


def test_penalties_follow_llama_cpp():
    logits = np.array([2.0, -1.0, 0.5, 4.0])
    params = SamplingParams(repeat_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5, penalty_last_n=3)
    # window: the last 3 tokens [0, 1, 1]; token 3 is outside it, token 2 absent
    x = processed_logits(logits, [3, 0, 1, 1], params)
    assert x.tolist() == [2.0 / 2 - 0.5 - 0.25, -1.0 * 2 - 2 * 0.5 - 0.25, 0.5, 4.0]
    assert processed_logits(logits, [3, 0, 1, 1], SamplingParams(repeat_penalty=2.0, penalty_last_n=0)).tolist() \
        == logits.tolist()
    assert processed_logits(logits, [3, 0], SamplingParams(repeat_penalty=2.0, penalty_last_n=-1)).tolist() \
        == [1.0, -1.0, 0.5, 2.0]


def test_top_k_and_top_p_ties_keep_the_lower_ids():
    logits = np.array([1.0, 2.0, 2.0, 2.0, 0.0])
    kept = np.isfinite(processed_logits(logits, [], SamplingParams(temperature=1.0, top_k=2)))
    assert kept.tolist() == [False, True, True, False, False]
    # three equal tokens carry most of the mass: a top_p reached by two of them keeps ids 1 and 2
    p = probabilities(processed_logits(logits, [], SamplingParams()), 1.0)
    kept = np.isfinite(processed_logits(logits, [], SamplingParams(temperature=1.0, top_p=2 * p[1])))
    assert kept.tolist() == [False, True, True, False, False]
    kept = np.isfinite(processed_logits(logits, [], SamplingParams(temperature=1.0, top_p=2 * p[1] + 1e-9)))
    assert kept.tolist() == [False, True, True, True, False]


def test_filters_keep_at_least_the_most_likely_token():
    logits = np.array([0.1, 0.3, 5.0, 0.2])
    for params in (SamplingParams(temperature=1.0, top_p=1e-12), SamplingParams(temperature=1.0, min_p=1.0),
                   SamplingParams(temperature=1.0, top_k=1)):
        x = processed_logits(logits, [], params)
        assert np.isfinite(x).tolist() == [False, False, True, False], params
        assert TokenSampler(replace_seed(params, 1)).pick(logits, [], 0)[0] == 2
    # top_k at or above the vocabulary, top_p 1 and min_p 0 keep everything
    x = processed_logits(logits, [], SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0))
    assert np.isfinite(x).all()


def test_min_p_keeps_tokens_exactly_at_the_threshold():
    logits = np.array([0.0, math.log(0.25), math.log(0.2499), 1e-3 + math.log(0.25)])
    kept = np.isfinite(processed_logits(logits, [], SamplingParams(temperature=1.0, min_p=0.25)))
    # token 0 is the most likely: the threshold is a logit of log(0.25), which token 1 has exactly
    assert kept.tolist() == [True, True, False, True]


def replace_seed(params: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, seed=seed)


def test_inverse_cdf_reads_token_intervals_in_id_order_and_never_a_zero_probability_token():
    p = np.array([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    assert inverse_cdf(p, 0.0) == 1
    assert inverse_cdf(p, 0.2499) == 1
    assert inverse_cdf(p, 0.25) == 3
    assert inverse_cdf(p, 0.7499) == 3
    assert inverse_cdf(p, 0.75) == 4
    assert inverse_cdf(p, 1.0 - 2.0**-53) == 4
    assert inverse_cdf(p, 1.0) == 4  # (u < 1 always; a total rounded down still lands on a real token)


MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's output function (Steele, Lea & Flood; Vigna's splitmix64.c)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64_stream(seed: int, n: int) -> list[int]:
    """SplitMix64 written sequentially (state += gamma; output = mix64(state)), seeded as
    keyed_uniform documents: state0 = mix64(seed + gamma)."""
    state = mix64((seed + GAMMA) & MASK64)
    out = []
    for _ in range(n):
        state = (state + GAMMA) & MASK64
        out.append(mix64(state))
    return out


def test_mix64_gives_the_reference_splitmix64_outputs():
    # the first outputs of splitmix64.c from state 0, as published with it
    assert [mix64(k * GAMMA & MASK64) for k in (1, 2, 3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
                                                            0x06C45D188009454F]


@pytest.mark.parametrize("key", [0, 1, 12345, 2**63 + 17, 2**64 - 1])
def test_keyed_uniform_is_random_access_into_one_splitmix64_stream(key):
    words = splitmix64_stream(key, 300)
    for position in (0, 1, 2, 57, 299):
        assert keyed_uniform(key, position) == (words[position] >> 11) / 2**53
    values = [keyed_uniform(key, p) for p in range(300)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert values == [keyed_uniform(key, p) for p in range(300)]  # a pure function: asking again changes nothing
    assert len(set(values)) == 300


# --- goodness of fit ----------------------------------------------------------------------------

GOF_LOGITS = np.array([2.0, 1.5, 1.2, 0.7, 0.3, 0.0, -0.4, -1.0, -2.5, -6.0])
GOF_PARAMS = SamplingParams(temperature=0.8, top_k=8, seed=20261201)
GOF_DRAWS = 120_000
GOF_ALPHA = 0.001


def gof_pvalue(counts: np.ndarray, q: np.ndarray) -> float:
    from scipy.stats import chisquare

    support = q > 0
    return float(chisquare(counts[support], GOF_DRAWS * q[support]).pvalue)


def test_plain_sampling_follows_the_processed_distribution():
    """Pearson chi-square of 120,000 draws (positions 0..119,999 of one seed) from
    TokenSampler.pick against the processed distribution q of a fixed 10-token vocabulary
    (temperature 0.8, top-k 8: q = 0.421, 0.225, 0.155, 0.083, 0.050, 0.035, 0.021, 0.010, 0, 0).

    Power: a sampler that moves 1 % absolute probability into or out of one category j (the rest
    made up elsewhere) has noncentrality at least N * 0.01**2 * (1/q_j + 1/(1 - q_j)) (the
    minimum, reached when the difference is spread in proportion to q); the worst category is q_j =
    0.421 (closest to 1/2), giving lambda = 49.2 with 7 degrees of freedom. At alpha = 0.001 (critical
    value 24.32) the power is P(chi2'(7, 49.2) > 24.32) = 0.995 >= 0.99 (computed below with scipy).
    Tokens outside the support must never be drawn. The same statistic on the draws of a sampler
    with such a bias must reject (the second half of the test)."""
    from scipy.stats import chi2, ncx2

    q = probabilities(processed_logits(GOF_LOGITS, [], GOF_PARAMS), GOF_PARAMS.temperature)
    support = q > 0
    df = int(support.sum()) - 1
    worst = min(1 / qj + 1 / (1 - qj) for qj in q[support])
    power = ncx2.sf(chi2.isf(GOF_ALPHA, df), df, GOF_DRAWS * 0.01**2 * worst)
    assert power >= 0.99, f"the test's design lost its power ({power:.4f})"

    sampler = TokenSampler(GOF_PARAMS)
    draws = np.array([sampler.pick(GOF_LOGITS, [], position)[0] for position in range(GOF_DRAWS)])
    counts = np.bincount(draws, minlength=len(q))
    assert counts[~support].sum() == 0, "a token outside top-k was drawn"
    p_value = gof_pvalue(counts, q)
    assert p_value > GOF_ALPHA, f"chi-square p = {p_value:.2e}: the draws do not follow the processed distribution"

    # the same stream read through a distribution with 1 % moved from the most likely token to the
    # others, in proportion: the test must notice
    biased = q.copy()
    biased[0] -= 0.01
    biased[1:] += 0.01 * q[1:] / q[1:].sum()
    biased_draws = np.array([inverse_cdf(biased, keyed_uniform(GOF_PARAMS.seed, position))
                             for position in range(GOF_DRAWS)])
    assert gof_pvalue(np.bincount(biased_draws, minlength=len(q)), q) < GOF_ALPHA


# --- reproducibility and errors -----------------------------------------------------------------

def test_a_seed_gives_the_same_tokens_and_another_seed_others():
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((200, 50))
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11)

    def run(p):
        sampler, history = TokenSampler(p), [3, 4]
        for row in rows:
            history.append(sampler.pick(row, history, len(history))[0])
        return history

    assert run(params) == run(params)
    assert run(params) != run(replace_seed(params, 12))


def test_a_missing_seed_is_drawn_and_reported():
    a, b = TokenSampler(SamplingParams(temperature=1.0)), TokenSampler(SamplingParams(temperature=1.0))
    assert isinstance(a.seed, int) and a.seed != b.seed
    assert TokenSampler(SamplingParams()).seed is None  # greedy draws nothing


def test_pick_reports_the_logprob_and_top_list_of_the_processed_distribution():
    logits = np.array([1.0, 3.0, 2.0, 2.0, -1.0])
    sampler = TokenSampler(SamplingParams(temperature=0.5, top_k=3, seed=5))
    token, logprob, top = sampler.pick(logits, [], 9, n_top=4)
    p = probabilities(processed_logits(logits, [], sampler.params), 0.5)
    assert logprob == pytest.approx(math.log(p[token]), abs=1e-12)
    assert [t for t, _ in top] == [1, 2, 3]  # three tokens survive top-k; ties by id
    assert [lp for _, lp in top] == pytest.approx([math.log(p[1]), math.log(p[2]), math.log(p[3])], abs=1e-12)
    greedy = TokenSampler(SamplingParams())
    assert greedy.pick(logits, [], 0) == (1, None, None)
    token, logprob, top = greedy.pick(logits, [], 0, want_logprob=True)
    assert token == 1 and logprob == pytest.approx(np.log(np.exp(3.0) / np.exp(logits).sum()), abs=1e-12)


@pytest.mark.parametrize("field,value,needle", [
    ("temperature", -0.1, "temperature must be >= 0"),
    ("temperature", float("nan"), "temperature must be finite"),
    ("temperature", "hot", "temperature must be a number"),
    ("top_k", -1, "top_k must be >= 0"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("top_p", 0.0, "top_p must be > 0"),
    ("top_p", 1.01, "top_p must be <= 1"),
    ("min_p", -0.5, "min_p must be >= 0"),
    ("min_p", 1.5, "min_p must be <= 1"),
    ("repeat_penalty", 0.0, "repeat_penalty must be > 0"),
    ("presence_penalty", float("inf"), "presence_penalty must be finite"),
    ("frequency_penalty", None, "frequency_penalty must be a number"),
    ("penalty_last_n", -2, "penalty_last_n must be >= -1"),
    ("seed", -1, "seed must be >= 0"),
    ("seed", 2**64, "seed must be < 2**64"),
    ("seed", True, "seed must be an integer"),
])
def test_bad_settings_name_the_field(field, value, needle):
    with pytest.raises(UsageError, match=needle.replace("*", r"\*")):
        SamplingParams(**{field: value}).validate()
    with pytest.raises(UsageError, match=field):
        TokenSampler(SamplingParams(**{field: value}))
