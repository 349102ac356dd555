"""Rank statistics over layers (docs/method.md#metrics): how well a geometry score orders the
layers by bridgeability.

:func:`rank_correlations` gives Spearman ρ and Kendall τ-b with percentile-bootstrap
intervals and two-sided permutation p-values; :func:`partial_spearman` gives Spearman's ρ of
two series with a third one held fixed (e.g. a proxy against bridgeability, controlling for
depth). A sweep has a handful of layers, so the p-values are exact wherever enumerating every
ordering is cheap.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import scipy.stats

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
