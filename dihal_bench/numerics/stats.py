"""Rank statistics over layers (docs/method.md#metrics): how well a geometry score orders the
layers by bridgeability.

:func:`rank_correlations` gives Spearman ρ and Kendall τ-b with percentile-bootstrap
intervals and two-sided permutation p-values; :func:`partial_spearman` gives Spearman's ρ of
two series with a third one held fixed (e.g. a proxy against bridgeability, controlling for
depth). A sweep has a handful of layers, so the p-values are exact wherever enumerating every
ordering is cheap.

Over pooled seeds (docs/method.md#claims-and-decision-rules): :func:`stratified_rank_test`, a
permutation test of (partial) ρ that permutes within each seed, with its power statement;
:func:`holm`, the step-down correction of a family of p-values; :func:`spearman_versus`, a test of
ρ against a claimed value; :func:`paired_log_ppl_difference`, a paired bootstrap interval for the
difference of two methods' log Gen.PPL from per-sample NLLs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats

from dihal_bench.errors import DihalError

Result = dict[str, float | int | str | bool | None]

#: up to this many pairs the p-values enumerate all n! orderings (8! = 40320); beyond, they
#: are Monte-Carlo estimates from `n_perm` seeded random orderings
EXACT_MAX_N = 8
#: permutation statistics evaluated at once: bounds the (orderings, pairs) arrays of Kendall's S
_BLOCK_ELEMENTS = 1 << 22


def rank_correlations(x: Sequence[float], y: Sequence[float], *, n_boot: int = 1000, seed: int = 0,
                      n_perm: int = 10_000) -> Result:
    """Spearman ρ and Kendall τ (τ-b) between paired x and y, with bootstrap 95% intervals and
    permutation p-values.

    The intervals are percentile intervals (2.5th, 97.5th) over `n_boot` resamples of the
    pairs with replacement (for DiHAL: over layers). A resample in which x or y is constant
    has no rank correlation and is skipped; `n_boot_valid` says how many counted.

    The p-values are two-sided permutation tests of no association: the share of orderings of
    y against x whose statistic is at least as far from zero as the observed one. For n up to
    `EXACT_MAX_N` every one of the n! orderings is counted (exact; ``p_exact`` True);
    beyond, `n_perm` orderings drawn with ``seed`` give (1 + hits) / (1 + n_perm), the observed
    ordering counted as one more draw, so that the estimate is never 0 and remains a valid
    p-value (Phipson & Smyth 2010). ``n_perm`` in the result is how many orderings were counted.

    Returns keys spearman, spearman_low, spearman_high, spearman_p, kendall, kendall_low,
    kendall_high, kendall_p, n, n_boot, n_boot_valid, n_perm, p_exact; values are None (with a
    `warning`) where undefined: fewer than 3 pairs, or x or y constant.
    """
    x, y = _paired(x, y, "rank_correlations")
    result: Result = dict.fromkeys(("spearman", "spearman_low", "spearman_high", "spearman_p",
                                    "kendall", "kendall_low", "kendall_high", "kendall_p"))
    result |= {"n": len(x), "n_boot": n_boot, "n_boot_valid": 0, "n_perm": 0, "p_exact": len(x) <= EXACT_MAX_N}
    if len(x) < 3:
        return result | {"warning": f"rank correlation needs at least 3 pairs, got {len(x)}"}
    if _is_constant(x) or _is_constant(y):
        return result | {"warning": "rank correlation undefined: one side is constant"}
    result["spearman"] = float(scipy.stats.spearmanr(x, y).statistic)
    result["kendall"] = float(scipy.stats.kendalltau(x, y).statistic)

    rng = np.random.default_rng(seed)
    rhos, taus = [], []
    for idx in rng.integers(0, len(x), size=(n_boot, len(x))):
        xb, yb = x[idx], y[idx]
        if _is_constant(xb) or _is_constant(yb):
            continue
        rhos.append(scipy.stats.spearmanr(xb, yb).statistic)
        taus.append(scipy.stats.kendalltau(xb, yb).statistic)
    result["n_boot_valid"] = len(rhos)
    if rhos:
        result["spearman_low"], result["spearman_high"] = (float(v) for v in np.percentile(rhos, [2.5, 97.5]))
        result["kendall_low"], result["kendall_high"] = (float(v) for v in np.percentile(taus, [2.5, 97.5]))

    result["spearman_p"], result["kendall_p"], result["n_perm"] = permutation_p_values(x, y, seed=seed, n_perm=n_perm)
    return result


def permutation_p_values(x: Sequence[float], y: Sequence[float], *, seed: int = 0,
                         n_perm: int = 10_000) -> tuple[float, float, int]:
    """Two-sided permutation p-values of Spearman ρ and Kendall τ-b, and how many orderings
    they count (see :func:`rank_correlations`; x and y must not be constant).

    Both are computed from integer statistics with the same ordering of the null distribution
    as ρ and τ-b (each is an increasing affine function of its statistic for fixed x and y,
    ties included), so "at least as extreme" is decided without rounding error:
    Spearman's n·Σ a_i b_π(i) − Σa·Σb with a, b twice the average ranks, and Kendall's
    S = Σ_{i<j} sign(x_i − x_j)·sign(y_π(i) − y_π(j)).
    """
    x, y = _paired(x, y, "permutation_p_values")
    if n_perm < 1:
        raise ValueError(f"n_perm must be at least 1, got {n_perm}")
    n = len(x)
    a = np.rint(2 * scipy.stats.rankdata(x)).astype(np.int64)
    b = np.rint(2 * scipy.stats.rankdata(y)).astype(np.int64)
    first, second = np.triu_indices(n, k=1)
    x_signs = np.sign(x[first] - x[second]).astype(np.int64)

    def statistics(orderings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spearman = n * (b[orderings] @ a) - a.sum() * b.sum()
        shuffled = y[orderings]
        kendall = np.sign(shuffled[:, first] - shuffled[:, second]).astype(np.int64) @ x_signs
        return np.abs(spearman), np.abs(kendall)

    observed_spearman, observed_kendall = (s[0] for s in statistics(np.arange(n)[None, :]))
    block = max(1, _BLOCK_ELEMENTS // max(len(first), n))
    if n <= EXACT_MAX_N:
        every = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        blocks = np.array_split(every, -(-len(every) // block))
        total, observed_draw = len(every), 0  # the identity is one of the n! orderings already
    else:
        # a stream of its own: the bootstrap's size does not move the p-values
        rng = np.random.default_rng([seed, 1])
        blocks = (rng.permuted(np.tile(np.arange(n), (min(block, n_perm - start), 1)), axis=1)
                  for start in range(0, n_perm, block))
        total, observed_draw = n_perm, 1  # the observed ordering counts as one more draw
    hits_spearman = hits_kendall = observed_draw
    for orderings in blocks:
        spearman, kendall = statistics(orderings)
        hits_spearman += int((spearman >= observed_spearman).sum())
        hits_kendall += int((kendall >= observed_kendall).sum())
    return hits_spearman / (total + observed_draw), hits_kendall / (total + observed_draw), total


def partial_spearman(x: Sequence[float], y: Sequence[float], z: Sequence[float]) -> float | None:
    """Spearman's ρ of x and y given z: the Pearson correlation of the residuals of rank(x) and
    rank(y) after a least-squares fit (with intercept) of each on rank(z). Average ranks for ties.

    None where it is undefined: fewer than 4 triples (with 3, both residuals lie on one line
    and the answer is ±1 whatever the data), or rank(x) or rank(y) a linear function of rank(z).
    """
    x, y = _paired(x, y, "partial_spearman")
    x, z = _paired(x, z, "partial_spearman")
    if len(x) < 4:
        return None
    design = np.column_stack([np.ones(len(z)), scipy.stats.rankdata(z)])
    residuals = []
    for values in (x, y):
        ranks = scipy.stats.rankdata(values)
        centred = ranks - ranks.mean()
        residual = ranks - design @ np.linalg.lstsq(design, ranks, rcond=None)[0]
        # rounding leaves residuals of order n·ε·‖ranks‖ (ε = 2.2e-16) where the fit is exact;
        # a real one is larger than 1e-9 of the centred ranks for any number of layers
        if np.linalg.norm(residual) <= 1e-9 * max(np.linalg.norm(centred), 1.0):
            return None
        residuals.append(residual)
    return float(np.corrcoef(residuals[0], residuals[1])[0, 1])


def _paired(x: Sequence[float], y: Sequence[float], name: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"{name} needs 1-D sequences of equal length, got shapes {x.shape} and {y.shape}")
    return x, y


def _is_constant(values: np.ndarray) -> bool:
    return bool(np.all(values == values[0]))


# -- tests that hold over designed layers and pooled seeds (docs/method.md#claims-and-decision-rules) --


#: the two-sided level at which the power statement gives the smallest detectable |ρ|
ALPHA = 0.05
#: a permuted statistic within this of the observed one counts as "at least as extreme": both are
#: correlations in [−1, 1] computed with O(n) float64 sums, whose rounding is orders below it, while
#: distinct rank statistics of ≤ 10⁴ layers differ by far more
_TIE = 1e-9


@dataclass(frozen=True)
class Stratum:
    """One seed's rank data for a (partial) Spearman test: x and y, and the series z held fixed
    (None for plain Spearman ρ)."""

    x: Sequence[float]
    y: Sequence[float]
    z: Sequence[float] | None = None


def rank_residuals(values: Sequence[float], z: Sequence[float] | None) -> np.ndarray:
    """rank(values) less its least-squares fit (with intercept) on rank(z); centred ranks when z
    is None. Average ranks for ties."""
    ranks = scipy.stats.rankdata(np.asarray(values, dtype=np.float64))
    return _residual_maker(len(ranks), z) @ ranks


def _residual_maker(n: int, z: Sequence[float] | None) -> np.ndarray:
    """The (n, n) projection onto what an intercept and rank(z) leave unexplained."""
    columns = [np.ones(n)] if z is None else [np.ones(n), scipy.stats.rankdata(np.asarray(z, dtype=np.float64))]
    design = np.column_stack(columns)
    return np.eye(n) - design @ np.linalg.pinv(design)


def residual_share(values: Sequence[float], z: Sequence[float]) -> float:
    """The share of rank(values)' variance that rank(z) leaves unexplained (1 − R²): what a partial
    ρ given z has to work with. 0 for a constant series."""
    centred = rank_residuals(values, None)
    total = float(centred @ centred)
    if total == 0:
        return 0.0
    residual = rank_residuals(values, z)
    return float(residual @ residual) / total


def stratified_rank_test(strata: Sequence[Stratum], *, n_perm: int = 10_000, seed: int = 0,
                         alpha: float = ALPHA) -> Result:
    """A two-sided permutation test of no association between x and y (given z), pooled over
    strata (seeds) by permuting within each one, with the power statement beside it.

    Statistic: the mean over strata of each stratum's (partial) Spearman ρ, the correlation of the
    rank residuals of x and y on (intercept, rank z). Null: the residuals of y are permuted within
    their stratum and residualised on z again (Freedman & Lane 1983), so each stratum keeps its own
    depth trend and its own layers; seeds are never mixed. With z None this is the ordinary
    permutation test of Spearman ρ (permuting y), pooled over strata. Permuting raw y instead
    would break y's dependence on z and so test the marginal ρ, not the partial one.

    One stratum of at most ``EXACT_MAX_N`` layers enumerates every ordering (``p_exact``); otherwise
    ``n_perm`` seeded orderings per stratum give (1 + hits) / (1 + n_perm) (Phipson & Smyth 2010).

    Returns rho (the mean ρ), p, n_perm, p_exact, strata, n (layers per stratum, summed),
    critical_rho — the (1 − alpha) quantile of |statistic| under the permutation null, the
    smallest |ρ| this design could call significant at ``alpha`` — and, with z, residual_share_x
    and residual_share_y (means over strata of 1 − R² of each rank series on rank z). Values are
    None (with a ``warning``) where a stratum has no residual variation on either side.
    """
    if not strata:
        raise DihalError("stratified_rank_test needs at least one stratum")
    if n_perm < 1:
        raise DihalError(f"n_perm must be at least 1, got {n_perm}")
    if not 0 < alpha < 1:
        raise DihalError(f"alpha must be in (0, 1), got {alpha}")
    given = strata[0].z is not None
    if any((stratum.z is not None) != given for stratum in strata):
        raise DihalError("stratified_rank_test: either every stratum holds z fixed or none does")
    prepared = [_prepared(stratum, i) for i, stratum in enumerate(strata)]
    result: Result = {"rho": None, "p": None, "critical_rho": None, "n_perm": 0, "p_exact": False,
                      "strata": len(strata), "n": sum(len(a) for a, _, _ in prepared)}
    if given:
        result["residual_share_x"] = float(np.mean([residual_share(s.x, s.z) for s in strata]))
        result["residual_share_y"] = float(np.mean([residual_share(s.y, s.z) for s in strata]))
    flat = [i for i, (a, b, _) in enumerate(prepared) if not (a.any() and b.any())]
    if flat:
        return result | {"warning": f"seed stratum {flat[0]}: nothing of x or y is left to rank"
                                    + (" once z is held fixed" if given else "")}
    observed = float(np.mean([_correlations(a, b[None, :], maker)[0] for a, b, maker in prepared]))
    exact = len(prepared) == 1 and len(prepared[0][0]) <= EXACT_MAX_N
    if exact:
        a, b, maker = prepared[0]
        null = _correlations(a, b[np.array(list(itertools.permutations(range(len(a)))), dtype=np.intp)], maker)
        hits, total, extra = int((np.abs(null) >= abs(observed) - _TIE).sum()), len(null), 0
    else:
        rng = np.random.default_rng([seed, 2])  # apart from rank_correlations' streams
        null = np.zeros(n_perm)
        for a, b, maker in prepared:
            orderings = rng.permuted(np.tile(np.arange(len(a)), (n_perm, 1)), axis=1)
            null += _correlations(a, b[orderings], maker)
        null /= len(prepared)
        hits, total, extra = int((np.abs(null) >= abs(observed) - _TIE).sum()), n_perm, 1
    return result | {"rho": observed, "p": (hits + extra) / (total + extra), "n_perm": total, "p_exact": exact,
                     "critical_rho": float(np.quantile(np.abs(null), 1 - alpha, method="higher"))}


def _prepared(stratum: Stratum, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x's rank residuals, y's, and the residual maker of the stratum's design."""
    x, y = np.asarray(stratum.x, dtype=np.float64), np.asarray(stratum.y, dtype=np.float64)
    z = None if stratum.z is None else np.asarray(stratum.z, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or (z is not None and z.shape != x.shape):
        raise DihalError(f"seed stratum {i}: x, y and z must be 1-D of one length, got shapes "
                         f"{x.shape}, {y.shape}{'' if z is None else f' and {z.shape}'}")
    if len(x) < (4 if z is not None else 3):
        raise DihalError(f"seed stratum {i}: {len(x)} layers are too few for a rank test"
                         f"{' given z (at least 4)' if z is not None else ' (at least 3)'}")
    if not (np.isfinite(x).all() and np.isfinite(y).all() and (z is None or np.isfinite(z).all())):
        raise DihalError(f"seed stratum {i}: x, y and z must be finite numbers")
    maker = _residual_maker(len(x), z)
    a, b = maker @ scipy.stats.rankdata(x), maker @ scipy.stats.rankdata(y)
    # rounding leaves residuals of order n·ε·‖ranks‖ where the fit is exact (see partial_spearman)
    scale = 1e-9 * max(len(x), 1) ** 1.5
    return (a if np.linalg.norm(a) > scale else np.zeros_like(a),
            b if np.linalg.norm(b) > scale else np.zeros_like(b), maker)


def _correlations(a: np.ndarray, permuted_b: np.ndarray, maker: np.ndarray) -> np.ndarray:
    """corr(a, residual of each row of ``permuted_b``): a is already a residual, so only the
    permuted side is residualised again (Freedman–Lane)."""
    residual = permuted_b @ maker  # the maker is symmetric
    return (residual @ a) / (np.linalg.norm(residual, axis=1) * np.linalg.norm(a))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): the i-th smallest of m
    becomes max over j ≤ i of min(1, (m − j + 1)·p_(j)). None (a test not made) stays None and
    does not count in m. Controls the family-wise error rate under any dependence."""
    tested = [(p, i) for i, p in enumerate(p_values) if p is not None]
    for p, _ in tested:
        if not (isinstance(p, (int, float)) and 0 <= p <= 1):
            raise DihalError(f"holm: a p-value must be in [0, 1], got {p!r}")
    adjusted: list[float | None] = [None] * len(p_values)
    running, m = 0.0, len(tested)
    for rank, (p, i) in enumerate(sorted(tested)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def spearman_versus(rhos: Sequence[float], n: Sequence[int], rho0: float, *, level: float = 0.95) -> Result:
    """Is the (pooled) Spearman ρ below a claimed ρ₀? Fisher's z with Bonett & Wright's (2000)
    variance for Spearman's ρ, (1 + ρ²/2)/(n − 3), pooled over independent seeds.

    Each seed's z = atanh(ρ_s); the pooled z̄ is their inverse-variance weighted mean. The test of
    H₀: ρ = ρ₀ takes the variance at ρ₀ (the null's own), one-sided against ρ < ρ₀ (``p_below``)
    and two-sided (``p``); the ``level`` interval takes it at each seed's ρ_s. A closed form is
    used rather than a bootstrap over layers because a sweep's layers are a designed set, not
    draws, and a percentile bootstrap of a dozen of them is far too wide and badly centred; the
    Fisher-z approximation assumes the layers behave as a sample of pairs, which is the
    reading under which the paper's ρ is itself a statistic.
    """
    rhos, counts = np.asarray(rhos, dtype=np.float64), np.asarray(n, dtype=np.float64)
    if rhos.ndim != 1 or rhos.shape != counts.shape or len(rhos) == 0:
        raise DihalError("spearman_versus needs one ρ and one layer count per seed")
    if not (np.all(np.abs(rhos) <= 1) and -1 < rho0 < 1):
        raise DihalError("spearman_versus needs every ρ in [−1, 1] and ρ₀ strictly inside (−1, 1)")
    # a perfect ordering (ρ = ±1, common over a few layers) has an infinite Fisher z; just inside
    # it the test and the interval take their limits (p_below → 0 or 1, one end of the interval → ±1)
    rhos = np.clip(rhos, -1 + 1e-9, 1 - 1e-9)
    if np.any(counts < 4):
        raise DihalError(f"spearman_versus needs at least 4 layers per seed, got {int(counts.min())}")
    if not 0 < level < 1:
        raise DihalError(f"level must be in (0, 1), got {level}")
    z = np.arctanh(rhos)

    def pooled(variances: np.ndarray) -> tuple[float, float]:
        weights = 1 / variances
        return float((weights * z).sum() / weights.sum()), float(np.sqrt(1 / weights.sum()))

    centre, se_null = pooled((1 + rho0 ** 2 / 2) / (counts - 3))
    statistic = (centre - np.arctanh(rho0)) / se_null
    estimate, se = pooled((1 + rhos ** 2 / 2) / (counts - 3))
    half = scipy.stats.norm.ppf(0.5 + level / 2) * se
    return {"rho": float(np.tanh(estimate)), "rho0": rho0, "z": float(statistic),
            "p_below": float(scipy.stats.norm.cdf(statistic)), "p": float(2 * scipy.stats.norm.sf(abs(statistic))),
            "low": float(np.tanh(estimate - half)), "high": float(np.tanh(estimate + half)), "level": level,
            "seeds": len(rhos)}


@dataclass(frozen=True)
class SampleNLL:
    """One method's samples of one seed under the evaluator: each sample's summed NLL (None for an
    invalid sample, which Gen.PPL leaves out) and its scored token count, in sample order."""

    nll: Sequence[float | None]
    tokens: Sequence[int]


def paired_log_ppl_difference(a: dict[int, SampleNLL], b: dict[int, SampleNLL], *, n_boot: int = 2000,
                              seed: int = 0, level: float = 0.95) -> Result:
    """log Gen.PPL(a) − log Gen.PPL(b), corpus-level Gen.PPL per seed and the seeds weighed
    equally, with a two-stage percentile bootstrap interval.

    Pairing: by seed (methods share seeds), and within a seed by sample index, one resample of
    indices applied to both sides (an index invalid for one method still counts for the other).
    The hybrids (DiHAL at any layer, the regressor control) draw sample i from the same position
    of the seed's generator, so their sample i share random numbers and pairing removes that
    shared noise; for methods with their own generators the pairs are independent, and resampling
    independent pairs jointly has the same distribution as resampling each side alone. Where the
    sample counts differ no index pairing exists and each side is resampled on its own
    (``paired`` False). Stage one resamples the seeds with
    replacement when there are several, so the interval carries training-seed spread, not only
    sampling noise; with one seed it is conditional on that seed's trained models.

    Returns difference, ratio (exp difference: the ratio of Gen.PPLs), low, high (and their
    ratios), sd (the bootstrap draws' standard deviation), level, n_boot, seeds, samples, paired.
    """
    if set(a) != set(b) or not a:
        raise DihalError(f"paired_log_ppl_difference needs the same seeds on both sides, got {sorted(a)} and {sorted(b)}")
    if n_boot < 1 or not 0 < level < 1:
        raise DihalError(f"n_boot must be ≥ 1 and level in (0, 1), got {n_boot} and {level}")
    seeds = sorted(a)
    sides = [(_nll_arrays(a[s], s), _nll_arrays(b[s], s)) for s in seeds]
    paired = all(len(x[0]) == len(y[0]) for x, y in sides)
    point = float(np.mean([_log_ppl(*x) - _log_ppl(*y) for x, y in sides]))
    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot)
    for k in range(n_boot):
        picked = rng.integers(0, len(seeds), len(seeds)) if len(seeds) > 1 else [0]
        differences = []
        for i in picked:
            (nll_a, tok_a), (nll_b, tok_b) = sides[i]
            rows_a = rng.integers(0, len(nll_a), len(nll_a))
            rows_b = rows_a if paired else rng.integers(0, len(nll_b), len(nll_b))
            differences.append(_log_ppl(nll_a[rows_a], tok_a[rows_a]) - _log_ppl(nll_b[rows_b], tok_b[rows_b]))
        draws[k] = np.mean(differences)
    draws = draws[np.isfinite(draws)]
    low, high = (float(v) for v in np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2]))
    return {"difference": point, "ratio": float(np.exp(point)), "low": low, "high": high,
            "sd": float(draws.std(ddof=1)) if len(draws) > 1 else math.nan,
            "ratio_low": float(np.exp(low)), "ratio_high": float(np.exp(high)), "level": level,
            "n_boot": n_boot, "n_boot_valid": len(draws), "seeds": len(seeds), "paired": paired,
            "samples": int(sum(len(x[0]) for x, _ in sides))}


def log_gen_ppl(samples: SampleNLL) -> float:
    """log of the corpus-level Gen.PPL of a method's valid samples on one seed."""
    return _log_ppl(*_nll_arrays(samples, 0))


def _nll_arrays(samples: SampleNLL, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """NLL sums with invalid samples as 0 NLL over 0 tokens (so they drop out of every sum)."""
    if len(samples.nll) != len(samples.tokens) or not samples.nll:
        raise DihalError(f"seed {seed}: per-sample NLLs and token counts must be non-empty and of one length")
    valid = np.array([value is not None for value in samples.nll])
    nll = np.array([0.0 if value is None else float(value) for value in samples.nll])
    tokens = np.where(valid, np.asarray(samples.tokens, dtype=np.float64), 0.0)
    if not valid.any() or tokens.sum() <= 0:
        raise DihalError(f"seed {seed}: no valid sample with scored tokens")
    return nll, tokens


def _log_ppl(nll: np.ndarray, tokens: np.ndarray) -> float:
    """log of corpus-level Gen.PPL; NaN for a resample without a scored token (dropped)."""
    total = tokens.sum()
    return float(nll.sum() / total) if total > 0 else math.nan
