"""Rank statistics over layers: Spearman and Kendall with bootstrap intervals as scipy computes
them, permutation p-values equal to a count over every ordering written out here, and partial
Spearman against the textbook formula and on data where z explains all of x and y's association."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from dihal_bench.errors import DihalError
from dihal_bench.numerics.stats import (
    EXACT_MAX_N,
    SampleNLL,
    Stratum,
    holm,
    paired_log_ppl_difference,
    partial_spearman,
    permutation_p_values,
    rank_correlations,
    residual_share,
    spearman_versus,
    stratified_rank_test,
)


def noisy_pairs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    x = np.arange(12, dtype=float)
    return x, x + rng.normal(scale=3.0, size=12)


# -- correlations and bootstrap intervals --------------------------------------------------


def test_rank_correlations_match_scipy_and_intervals_contain_them():
    x, y = noisy_pairs()
    result = rank_correlations(x, y, n_boot=300, seed=0)

    assert result["spearman"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic)
    assert result["kendall"] == pytest.approx(scipy.stats.kendalltau(x, y).statistic)
    assert 0.3 < result["spearman"] < 1.0  # noisy but positive: a non-trivial check
    assert result["spearman_low"] <= result["spearman"] <= result["spearman_high"]
    assert result["kendall_low"] <= result["kendall"] <= result["kendall_high"]
    assert result["spearman_high"] - result["spearman_low"] > 0.05
    assert result["n"] == 12 and result["n_boot"] == 300 and result["n_boot_valid"] == 300


def test_rank_correlations_are_reproducible_for_a_seed():
    x, y = noisy_pairs()
    first = rank_correlations(x, y, n_boot=200, seed=7)
    assert rank_correlations(x, y, n_boot=200, seed=7) == first
    other = rank_correlations(x, y, n_boot=200, seed=8)
    assert other["spearman_low"] != first["spearman_low"]
    assert other["spearman_p"] != first["spearman_p"]  # 12 pairs: Monte-Carlo p-values, seeded


def test_bootstrap_and_permutations_draw_from_separate_streams():
    x, y = noisy_pairs()
    short, long = rank_correlations(x, y, n_boot=50, n_perm=300), rank_correlations(x, y, n_boot=400, n_perm=300)
    assert (short["spearman_p"], short["kendall_p"]) == (long["spearman_p"], long["kendall_p"])
    few, many = rank_correlations(x, y, n_boot=200, n_perm=50), rank_correlations(x, y, n_boot=200, n_perm=500)
    assert (few["spearman_low"], few["kendall_high"]) == (many["spearman_low"], many["kendall_high"])
    assert (few["n_perm"], many["n_perm"]) == (50, 500)


def test_rank_correlations_skip_constant_resamples():
    # With 3 points, a resample is constant with probability 3/27: some are skipped.
    result = rank_correlations([1.0, 2.0, 3.0], [1.0, 3.0, 2.0], n_boot=200, seed=0)
    assert 150 < result["n_boot_valid"] < 200


def test_rank_correlations_undefined_cases():
    constant = rank_correlations([1, 2, 3, 4], [5, 5, 5, 5])
    assert constant["spearman"] is None and constant["spearman_p"] is None and "constant" in constant["warning"]
    two = rank_correlations([1, 2], [2, 1])
    assert two["kendall"] is None and two["kendall_p"] is None
    with pytest.raises(ValueError):
        rank_correlations([1, 2, 3], [1, 2])


# -- permutation p-values ------------------------------------------------------------------


def enumerated_p_values(x, y) -> tuple[float, float]:
    """The two-sided permutation p-values by brute force: scipy's ρ and τ-b of every ordering
    of y, counted where |statistic| reaches the observed one. Over at most 5 points the distinct
    values of either statistic are ratios of small integers (or of their square roots, with
    ties) and lie far more than 1e-9 apart, so that margin absorbs rounding without merging two."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    observed = abs(scipy.stats.spearmanr(x, y).statistic), abs(scipy.stats.kendalltau(x, y).statistic)
    orderings = list(itertools.permutations(range(len(y))))
    rhos = [abs(scipy.stats.spearmanr(x, y[list(o)]).statistic) for o in orderings]
    taus = [abs(scipy.stats.kendalltau(x, y[list(o)]).statistic) for o in orderings]
    return (sum(r >= observed[0] - 1e-9 for r in rhos) / len(orderings),
            sum(t >= observed[1] - 1e-9 for t in taus) / len(orderings))


@pytest.mark.parametrize("x, y", [
    ([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]),
    ([0.5, 0.1, 0.9, 0.3], [2.0, 1.0, 0.0, 3.0]),
    ([1.0, 2.0, 2.0, 3.0], [3.0, 1.0, 2.0, 2.0]),  # ties on both sides
    ([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]),  # ρ's p 16/120, τ's 28/120
    ([0.3, 0.1, 0.5, 0.2, 0.4], [1.0, 3.0, 2.0, 5.0, 4.0]),
    ([1.0, 2.0, 2.0, 3.0, 4.0], [4.0, 1.0, 3.0, 3.0, 2.0]),
])
def test_exact_p_values_count_every_ordering(x, y):
    result = rank_correlations(x, y, n_boot=10)
    assert result["p_exact"] is True and result["n_perm"] == math.factorial(len(x))
    spearman_p, kendall_p = enumerated_p_values(x, y)
    # both are k/n! computed from integers: equal, not merely close
    assert result["spearman_p"] == spearman_p
    assert result["kendall_p"] == kendall_p


def test_exact_kendall_p_is_scipys_exact_test():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=EXACT_MAX_N), rng.normal(size=EXACT_MAX_N)
    spearman_p, kendall_p, count = permutation_p_values(x, x + y)
    assert count == math.factorial(EXACT_MAX_N)
    assert kendall_p == pytest.approx(scipy.stats.kendalltau(x, x + y, method="exact").pvalue, rel=1e-12)
    assert 0 < spearman_p < 1


def test_a_perfect_order_reaches_only_itself_and_its_reverse():
    # exact: the identity and the reversal are the two orderings with |ρ| = |τ| = 1
    exact = rank_correlations(range(EXACT_MAX_N), range(EXACT_MAX_N), n_boot=10)
    assert exact["spearman_p"] == exact["kendall_p"] == 2 / math.factorial(EXACT_MAX_N)
    # Monte Carlo: no draw of 12! = 4.8e8 orderings hits either, so only the observed one counts
    n = EXACT_MAX_N + 4
    sampled = rank_correlations(range(n), range(n, 0, -1), n_boot=10, n_perm=2000)
    assert sampled["p_exact"] is False and sampled["n_perm"] == 2000
    assert sampled["spearman_p"] == sampled["kendall_p"] == 1 / 2001


def test_monte_carlo_p_values_estimate_the_exact_ones():
    """Beyond EXACT_MAX_N the p-value is a mean over n_perm draws: within 5 binomial standard
    errors (sqrt(p(1-p)/n_perm) <= 0.005 for 10000 draws) of scipy's exact Kendall p-value."""
    rng = np.random.default_rng(2)
    n = EXACT_MAX_N + 3
    x = rng.normal(size=n)
    y = x + rng.normal(scale=2.0, size=n)
    _, kendall_p, count = permutation_p_values(x, y, seed=3, n_perm=10_000)
    exact = scipy.stats.kendalltau(x, y, method="exact").pvalue
    assert count == 10_000 and 0.02 < exact < 0.98  # a p-value the draws must actually estimate
    assert abs(kendall_p - exact) < 5 * math.sqrt(exact * (1 - exact) / 10_000)


# -- partial Spearman -------------------------------------------------------------------------


def test_partial_spearman_is_the_textbook_formula_on_spearman_correlations():
    rng = np.random.default_rng(5)
    z = rng.normal(size=40)
    x, y = z + rng.normal(size=40), 0.5 * z + rng.normal(size=40)
    rho = {pair: scipy.stats.spearmanr(*pair_values).statistic
           for pair, pair_values in (("xy", (x, y)), ("xz", (x, z)), ("yz", (y, z)))}
    expected = (rho["xy"] - rho["xz"] * rho["yz"]) / math.sqrt((1 - rho["xz"] ** 2) * (1 - rho["yz"] ** 2))
    # the same quantity two ways in float64 over 40 ranks: agreement to ~1e-15, 1e-10 is lenient
    assert partial_spearman(x, y, z) == pytest.approx(expected, abs=1e-10)


def test_partial_spearman_removes_an_association_that_z_explains():
    """x and y share only z, a level with ties (8 levels of 50): within a level x and y are
    independent noise. Ranks then split exactly into the level's rank plus a within-level
    deviation orthogonal to it, so the partial correlation is the pooled correlation of those
    deviations, computed here directly; it is near 0 (within 4/sqrt(n), four standard errors)
    although x and y are strongly associated."""
    rng = np.random.default_rng(6)
    levels, per_level = 8, 50
    z = np.repeat(np.arange(levels, dtype=float), per_level)
    x = 10 * z + rng.uniform(size=z.size)
    y = 10 * z + rng.uniform(size=z.size)
    deviations = []
    for values in (x, y):
        ranks = scipy.stats.rankdata(values)
        deviations.append(ranks - np.repeat(ranks.reshape(levels, per_level).mean(axis=1), per_level))
    pooled = np.corrcoef(*deviations)[0, 1]

    partial = partial_spearman(x, y, z)
    assert partial == pytest.approx(pooled, abs=1e-10)
    assert abs(partial) < 4 / math.sqrt(z.size)
    assert scipy.stats.spearmanr(x, y).statistic > 0.9


def test_partial_spearman_keeps_a_direct_association():
    rng = np.random.default_rng(7)
    z = rng.normal(size=200)
    x = z + rng.normal(size=200)
    assert partial_spearman(x, x + 0.3 * rng.normal(size=200), z) > 0.8


def test_partial_spearman_given_a_constant_is_spearman():
    x, y = noisy_pairs()
    assert partial_spearman(x, y, np.ones_like(x)) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)


def test_partial_spearman_undefined_cases():
    assert partial_spearman([1, 2, 3], [3, 1, 2], [1, 2, 4]) is None  # three points: always ±1
    z = np.arange(10.0)
    assert partial_spearman(z ** 3, np.sin(z), z) is None  # x's ranks are z's ranks
    with pytest.raises(ValueError):
        partial_spearman([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3])


def test_layer_correlations_hold_the_depth_control_and_the_variants():
    from dihal_bench.hybrid.sweep import layer_correlations

    layers = [1, 2, 3, 4, 5, 6]
    located = {
        "layers": layers, "preprocessing": "trace",
        "score": [0.5, 2.0, 1.0, 3.0, -1.0, 0.0],
        "proxies": {"effective_rank": {"higher_is_better": False, "values": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]}},
        "variants": {"trace": {"score": [0.5, 2.0, 1.0, 3.0, -1.0, 0.0]},
                     "standardize": {"score": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]}},
    }
    rows = [{"layer": layer, "bridge_mse": 0.1 * layer, "bridge_mse_trace": 1.0 / layer} for layer in layers]
    result = layer_correlations(located, rows, seed=0)
    assert set(result) == {"score", "effective_rank", "depth", "score[standardize]"}
    # bridge MSE grows with depth, so depth and the standardised score rank the layers exactly
    assert result["depth"]["spearman"] == pytest.approx(1.0) and result["depth"]["spearman_p"] == pytest.approx(2 / 720)
    assert result["score[standardize]"]["spearman"] == pytest.approx(1.0)
    # −effective rank rises with depth here: exactly wrong
    assert result["effective_rank"]["spearman"] == pytest.approx(-1.0)
    # nothing is left beyond depth where the series or the target is depth's ranking itself
    assert result["depth"]["partial_spearman_given_depth"] is None
    assert result["score"]["partial_spearman_given_depth"] is None
    noisy = [{"layer": layer, "bridge_mse": mse} for layer, mse in zip(layers, [0.1, 0.3, 0.2, 0.5, 0.4, 0.6])]
    assert layer_correlations(located, noisy, seed=0)["score"]["partial_spearman_given_depth"] == pytest.approx(
        partial_spearman(located["score"], [-row["bridge_mse"] for row in noisy], layers))
    flipped = layer_correlations(located, rows, seed=0, target="bridge_mse_trace")
    assert flipped["depth"]["spearman"] == pytest.approx(-1.0)
    assert "warning" in layer_correlations(located, rows[:2], seed=0)


# -- stratified permutation tests, Holm, ρ against a claimed value, paired Gen.PPL bootstrap --


def binomial_bound(count: int, share: float) -> float:
    """A 4-sigma binomial allowance for how often an event of probability ``share`` happens in
    ``count`` independent trials: exceeded by chance about once in 30,000 runs."""
    return 4 * math.sqrt(count * share * (1 - share))


def depth_confounded(rng, n: int, effect: float) -> Stratum:
    """x and y both driven by depth z (as proxies and bridge error are), plus x's own part in y
    with weight ``effect``: partial ρ given z is 0 exactly when effect is 0."""
    z = np.arange(n, dtype=float)
    x = z + rng.normal(scale=4.0, size=n)
    own = x - z
    y = z + effect * own + rng.normal(scale=4.0, size=n)
    return Stratum(x, y, z)


def test_partial_rank_test_is_partial_spearman_and_uniform_under_a_depth_confounded_null():
    rng = np.random.default_rng(0)
    first = depth_confounded(rng, 12, 0.0)
    result = stratified_rank_test([first], n_perm=500, seed=0)
    assert result["rho"] == pytest.approx(partial_spearman(first.x, first.y, first.z))
    # x and y share depth: the marginal ρ is large, the partial one must not be called significant
    # more often than α, however strongly depth ties them together
    runs, alpha = 300, 0.1
    p_values = [stratified_rank_test([depth_confounded(rng, 12, 0.0)], n_perm=200, seed=k)["p"]
                for k in range(runs)]
    assert abs(sum(p <= alpha for p in p_values) - runs * alpha) <= binomial_bound(runs, alpha)
    assert abs(sum(p <= 0.5 for p in p_values) - runs * 0.5) <= binomial_bound(runs, 0.5)


def test_pooled_test_is_uniform_under_the_null_and_finds_a_planted_effect():
    rng = np.random.default_rng(1)
    runs, alpha = 200, 0.1
    null = [stratified_rank_test([depth_confounded(rng, 10, 0.0) for _ in range(3)], n_perm=200, seed=k)["p"]
            for k in range(runs)]
    assert abs(sum(p <= alpha for p in null) - runs * alpha) <= binomial_bound(runs, alpha)
    planted = [stratified_rank_test([depth_confounded(rng, 12, 3.0) for _ in range(3)], n_perm=400, seed=k)
               for k in range(20)]
    assert all(result["rho"] > 0 and result["p"] <= 0.01 for result in planted)


def test_plain_rank_test_of_one_small_stratum_is_exact_and_equals_the_existing_p_value():
    x, y = [1.0, 3.0, 2.0, 5.0, 4.0, 6.0], [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]
    result = stratified_rank_test([Stratum(x, y)])
    assert result["p_exact"] and result["n_perm"] == 720
    assert result["p"] == pytest.approx(permutation_p_values(x, y)[0])
    assert result["rho"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic)


def test_the_power_statement_is_the_null_quantile_and_shrinks_with_residual_variance():
    z = np.arange(12, dtype=float)
    rng = np.random.default_rng(2)
    # y almost exactly depth: little residual variance, so the null of the partial ρ is wide
    tight = Stratum(z + rng.normal(scale=4.0, size=12), z + rng.normal(scale=1.0, size=12), z)
    loose = Stratum(z + rng.normal(scale=4.0, size=12), z + rng.normal(scale=8.0, size=12), z)
    tight_result, loose_result = stratified_rank_test([tight], seed=0), stratified_rank_test([loose], seed=0)
    assert tight_result["residual_share_y"] < 0.1 < loose_result["residual_share_y"]
    assert tight_result["residual_share_y"] == pytest.approx(residual_share(tight.y, z))
    # for one stratum of n the permutation null of a correlation has sd ≈ 1/√(n − 1); the
    # two-sided 95% point is near 1.96/√11 = 0.59, whatever the residual variance
    assert 0.45 < tight_result["critical_rho"] < 0.75
    pooled = stratified_rank_test([tight, loose, tight], seed=0)
    assert pooled["critical_rho"] < tight_result["critical_rho"]  # three seeds: a narrower null
    assert pooled["strata"] == 3 and pooled["n"] == 36


def test_rank_tests_are_seeded_and_refuse_bad_input():
    stratum = depth_confounded(np.random.default_rng(3), 12, 1.0)
    assert stratified_rank_test([stratum], seed=4) == stratified_rank_test([stratum], seed=4)
    assert stratified_rank_test([stratum], seed=4)["p"] != stratified_rank_test([stratum], seed=5)["p"]
    with pytest.raises(DihalError, match="too few"):
        stratified_rank_test([Stratum([1, 2, 3], [1, 2, 3], [1, 2, 3])])
    with pytest.raises(DihalError, match="one length"):
        stratified_rank_test([Stratum([1, 2, 3, 4], [1, 2, 3], None)])
    with pytest.raises(DihalError, match="finite"):
        stratified_rank_test([Stratum([1, 2, math.nan, 4], [1, 2, 3, 4])])
    with pytest.raises(DihalError, match="stratum"):
        stratified_rank_test([])
    with pytest.raises(DihalError, match="every stratum"):
        stratified_rank_test([stratum, Stratum(stratum.x, stratum.y)])
    z = np.arange(6.0)
    flat = stratified_rank_test([Stratum(z ** 2, np.sin(z), z)])
    assert flat["rho"] is None and flat["p"] is None and "nothing" in flat["warning"]


def test_holm_matches_a_hand_computed_example():
    # m = 4 tested: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, max(0.04, 0.06), max(0.06, 0.06), 0.5
    assert holm([0.03, None, 0.01, 0.5, 0.02]) == pytest.approx([0.06, None, 0.04, 0.5, 0.06])
    assert holm([0.4, 0.4]) == [0.8, 0.8]
    assert holm([0.9, 0.6]) == [1.0, 1.0]
    assert holm([]) == []
    with pytest.raises(DihalError, match="p-value"):
        holm([1.5])


def test_spearman_versus_a_claim_rejects_only_what_is_far_below_it():
    # one seed, n = 12, ρ = 0.38 against 0.91: z distance (atanh .38 − atanh .91)/√((1 + .91²/2)/9)
    result = spearman_versus([0.38], [12], 0.91)
    expected = (math.atanh(0.38) - math.atanh(0.91)) / math.sqrt((1 + 0.91 ** 2 / 2) / 9)
    assert result["z"] == pytest.approx(expected)
    assert result["p_below"] == pytest.approx(scipy.stats.norm.cdf(expected))
    assert result["p_below"] < 0.01 and result["low"] < 0.38 < result["high"] < 0.91
    close = spearman_versus([0.88, 0.9], [12, 12], 0.91)
    assert close["p_below"] > 0.2 and close["low"] < 0.91 < close["high"]
    # two equal seeds: the same centre, a standard error smaller by √2
    twice = spearman_versus([0.38, 0.38], [12, 12], 0.91)
    assert twice["rho"] == pytest.approx(0.38) and twice["z"] == pytest.approx(expected * math.sqrt(2))
    with pytest.raises(DihalError, match="at least 4"):
        spearman_versus([0.5], [3], 0.91)
    with pytest.raises(DihalError, match="inside"):
        spearman_versus([0.5], [12], 1.0)
    perfect = spearman_versus([1.0], [12], 0.91)  # a perfect ordering: the limit, not an error
    assert perfect["p_below"] == pytest.approx(1.0) and perfect["high"] == pytest.approx(1.0)


def test_spearman_versus_covers_the_true_rho_at_about_its_level():
    # bivariate normal pairs with Pearson r give Spearman ρ = (6/π)·asin(r/2)
    rng = np.random.default_rng(5)
    r, n, runs = 0.85, 20, 400
    true = 6 / math.pi * math.asin(r / 2)
    covered = 0
    for _ in range(runs):
        x = rng.normal(size=n)
        y = r * x + math.sqrt(1 - r ** 2) * rng.normal(size=n)
        result = spearman_versus([scipy.stats.spearmanr(x, y).statistic], [n], true)
        covered += result["low"] <= true <= result["high"]
    assert abs(covered - 0.95 * runs) <= binomial_bound(runs, 0.95)


def samples_with_log_ppl(rng, count: int, log_ppl: float, noise: np.ndarray) -> SampleNLL:
    tokens = rng.integers(40, 70, size=count)
    return SampleNLL(list((log_ppl + noise) * tokens), list(tokens))


def test_paired_difference_is_the_log_ratio_of_gen_ppls_and_covers_a_planted_gap():
    rng = np.random.default_rng(6)
    shared = {seed: rng.normal(scale=0.5, size=128) for seed in (0, 1, 2)}  # common random numbers
    a = {seed: samples_with_log_ppl(rng, 128, 6.0, shared[seed] + rng.normal(scale=0.05, size=128))
         for seed in shared}
    b = {seed: samples_with_log_ppl(rng, 128, 6.2, shared[seed] + rng.normal(scale=0.05, size=128))
         for seed in shared}
    result = paired_log_ppl_difference(a, b, n_boot=500, seed=0)

    def log_ppl(side):
        return float(np.sum(side.nll) / np.sum(side.tokens))

    assert result["difference"] == pytest.approx(np.mean([log_ppl(a[s]) - log_ppl(b[s]) for s in shared]))
    assert result["paired"] and result["seeds"] == 3 and result["samples"] == 384
    assert result["low"] < result["difference"] < result["high"] < 0  # a lower Gen.PPL, shown
    assert result["low"] < -0.2 < result["high"]
    assert result["ratio"] == pytest.approx(math.exp(result["difference"]))
    assert paired_log_ppl_difference(a, b, n_boot=500, seed=0) == result


def test_pairing_removes_shared_noise_from_the_interval():
    rng = np.random.default_rng(7)
    shared = rng.normal(scale=1.0, size=128)
    a = {0: samples_with_log_ppl(rng, 128, 6.0, shared)}
    # same lengths, nearly the same per-token NLL: the difference has almost no noise of its own
    b = {0: SampleNLL(list((6.0 + shared + rng.normal(scale=0.01, size=128)) * np.array(a[0].tokens)), a[0].tokens)}
    paired = paired_log_ppl_difference(a, b, n_boot=400)
    shorter = {0: SampleNLL(a[0].nll[:127], a[0].tokens[:127])}  # unequal counts: resampled apart
    unpaired = paired_log_ppl_difference(shorter, b, n_boot=400)
    assert not unpaired["paired"]
    assert (paired["high"] - paired["low"]) * 10 < unpaired["high"] - unpaired["low"]


def test_invalid_samples_drop_out_and_bad_input_is_refused():
    a = {0: SampleNLL([10.0, None, 30.0], [10, 5, 10])}
    b = {0: SampleNLL([20.0, 20.0, 20.0], [10, 10, 10])}
    result = paired_log_ppl_difference(a, b, n_boot=50)
    assert result["difference"] == pytest.approx(40 / 20 - 60 / 30)
    with pytest.raises(DihalError, match="same seeds"):
        paired_log_ppl_difference(a, {1: b[0]})
    with pytest.raises(DihalError, match="one length"):
        paired_log_ppl_difference({0: SampleNLL([1.0], [1, 2])}, {0: SampleNLL([1.0], [1])})
    with pytest.raises(DihalError, match="no valid"):
        paired_log_ppl_difference({0: SampleNLL([None], [3])}, {0: SampleNLL([1.0], [1])})
