"""What a set of seeds can decide: a t interval over per-seed estimates, and how many seeds a claim
that is "not shown" would need (docs/method.md#claims-and-decision-rules, "Seeds needed").

Seeds are the independent units of a study (each trains its own weights and samples its own text);
samples or timing rounds within a seed are not, so intervals and power are over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dihal_bench.errors import DihalError

#: power a "seeds needed" figure asks for, and the most seeds it reports
POWER, MAX_SEEDS = 0.8, 10_000


def t_interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its two-sided t interval (df = n − 1); needs 2 or more values."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2 or not np.isfinite(x).all():
        raise DihalError(f"a t interval needs at least 2 finite values, got {list(values)}")
    mean, half = float(x.mean()), float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def t_test_power(effect: float, sd: float, seeds: int, *, alpha: float = 0.05) -> float:
    """Probability that a two-sided one-sample t test at ``alpha`` over ``seeds`` values of mean
    ``effect`` (distance from the boundary) and standard deviation ``sd`` rejects."""
    if seeds < 2:
        return 0.0
    df = seeds - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    noncentrality = abs(effect) * math.sqrt(seeds) / sd
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality))


@dataclass(frozen=True)
class SeedsNeeded:
    """How many seeds would decide a claim: ``seeds`` (None when the records cannot say, with
    ``reason``), the effect and the variance components it was computed from."""

    seeds: int | None
    effect: float
    between: float  # τ², the seed-to-seed variance beyond sampling noise
    within: float  # mean within-seed variance of a seed's estimate
    reason: str = ""

    def text(self) -> str:
        if self.seeds is None:
            return f"seeds needed: unknown ({self.reason})"
        count = f"more than {MAX_SEEDS:,}" if self.seeds > MAX_SEEDS else f"{self.seeds}"
        return (f"seeds needed for {100 * POWER:.0f}% power: {count} (effect {self.effect:+.3g} from the boundary; "
                f"per seed: between-seed variance {self.between:.3g}, within-seed {self.within:.3g})")


def seeds_needed(estimates: Sequence[float], within_variances: Sequence[float], boundary: float = 0.0, *,
                 alpha: float = 0.05, power: float = POWER) -> SeedsNeeded:
    """The smallest number of seeds S ≥ 2 at which a two-sided t test at ``alpha`` over S per-seed
    estimates decides the claim (rejects "mean = boundary") with probability ≥ ``power``, if the
    true mean is the measured one and each seed varies as the measured seeds do.

    ``estimates`` are the per-seed statistics, ``within_variances`` each one's sampling variance
    within its seed. Between-seed variance τ² = max(0, var(estimates) − mean within); one seed's
    variance σ² = τ² + mean within. Beyond `MAX_SEEDS`, ``seeds`` is MAX_SEEDS + 1.
    """
    d, w = np.asarray(estimates, dtype=np.float64), np.asarray(within_variances, dtype=np.float64)
    if len(d) != len(w) or not len(d) or not (np.isfinite(d).all() and np.isfinite(w).all()) or (w < 0).any():
        raise DihalError("seeds_needed: one finite estimate and one non-negative within-seed variance per seed")
    effect, within = float(d.mean() - boundary), float(w.mean())
    if len(d) < 2:
        return SeedsNeeded(None, effect, math.nan, within, "one seed: the seed-to-seed variance needs two")
    between = max(0.0, float(d.var(ddof=1)) - within)
    sd = math.sqrt(between + within)
    if sd == 0.0:
        return SeedsNeeded(2, effect, between, within)
    if effect == 0.0:
        return SeedsNeeded(MAX_SEEDS + 1, effect, between, within)
    # power grows with S: double to bracket, then bisect
    low, high = 1, 2
    while t_test_power(effect, sd, high, alpha=alpha) < power:
        if high > MAX_SEEDS:
            return SeedsNeeded(MAX_SEEDS + 1, effect, between, within)
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if t_test_power(effect, sd, middle, alpha=alpha) < power else (low, middle)
    return SeedsNeeded(high, effect, between, within)
