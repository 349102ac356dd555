"""What a set of seeds can decide (dihal_bench.numerics.seeds), checked by simulation: the power a
"seeds needed" figure promises is the rejection rate of the t test it stands for, and the variance it
splits into between- and within-seed parts is the one planted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dihal_bench.errors import DihalError
from dihal_bench.numerics.seeds import MAX_SEEDS, seeds_needed, t_interval, t_test_power


def rejection_rate(effect: float, sd: float, seeds: int, studies: int, rng: np.random.Generator) -> float:
    """Share of simulated studies of ``seeds`` per-seed values whose two-sided 5% t test rejects 0."""
    values = rng.normal(effect, sd, size=(studies, seeds))
    t = values.mean(axis=1) / (values.std(axis=1, ddof=1) / math.sqrt(seeds))
    return float(np.mean(np.abs(t) > stats.t.ppf(0.975, seeds - 1)))


@pytest.mark.parametrize("effect, sd", [(0.09, 0.18), (0.3, 0.2), (-0.05, 0.25)])
def test_the_seeds_needed_are_the_fewest_whose_simulated_t_test_decides_80_percent_of_the_time(effect, sd):
    rng = np.random.default_rng(0)
    # measured seeds whose mean and spread are exactly the planted ones (no within-seed noise)
    z = rng.normal(size=6)
    measured = effect + sd * (z - z.mean()) / z.std(ddof=1)
    needed = seeds_needed(measured, [0.0] * 6)
    assert needed.effect == pytest.approx(effect) and needed.between == pytest.approx(sd ** 2)
    studies = 8_000  # Monte Carlo standard error of a rate near 0.8: 0.0045
    at = rejection_rate(effect, sd, needed.seeds, studies, rng)
    assert at == pytest.approx(t_test_power(effect, sd, needed.seeds), abs=0.02)
    assert at >= 0.8 - 0.02
    if needed.seeds > 2:
        assert rejection_rate(effect, sd, needed.seeds - 1, studies, rng) < 0.8 + 0.02
        assert t_test_power(effect, sd, needed.seeds - 1) < 0.8 <= t_test_power(effect, sd, needed.seeds)


def test_between_and_within_seed_variances_are_told_apart():
    rng = np.random.default_rng(1)
    tau2, within = 0.04, 0.01
    seeds = 4_000
    estimates = 0.2 + rng.normal(0, math.sqrt(tau2), seeds) + rng.normal(0, math.sqrt(within), seeds)
    needed = seeds_needed(estimates, [within] * seeds)
    # var of a sample variance over 4,000 draws: 2σ⁴/(n−1), σ² = 0.05, so its sd is 0.0011
    assert needed.between == pytest.approx(tau2, abs=0.005)
    assert needed.within == within


def test_seeds_needed_says_when_the_records_cannot_tell():
    one = seeds_needed([0.1], [0.01])
    assert one.seeds is None and "two" in one.text()
    no_effect = seeds_needed([0.1, -0.1], [0.0, 0.0])
    assert no_effect.seeds == MAX_SEEDS + 1 and f"more than {MAX_SEEDS:,}" in no_effect.text()
    assert seeds_needed([0.1, 0.1], [0.0, 0.0]).seeds == 2  # no spread at all: two seeds decide
    with pytest.raises(DihalError, match="one finite estimate"):
        seeds_needed([0.1, math.nan], [0.0, 0.0])


def test_the_t_interval_covers_the_mean_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    held = sum(low <= 1.0 <= high for _, low, high in (t_interval(rng.normal(1.0, 2.0, 4)) for _ in range(4_000)))
    assert held / 4_000 == pytest.approx(0.95, abs=0.015)  # binomial sd 0.0034
    with pytest.raises(DihalError, match="at least 2"):
        t_interval([1.0])
