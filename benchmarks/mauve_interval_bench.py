"""Coverage of MAUVE's 95% interval on Gaussian features with a known answer: the half-sample
interval the metrics use now against the with-replacement bootstrap of the records before 2026-12-05.

The target of both is MAUVE's expectation at the sample size n (what a fresh sample set of n per side
gives on average), computed once by Monte Carlo over many independent sample sets. Each replicate
draws one sample set per side, builds each interval from it, and counts whether it holds the target.
Three cases: P and Q from one Gaussian (MAUVE near its ceiling of 1), Q shifted a little and Q shifted
far (MAUVE near 0). Run: ``python benchmarks/mauve_interval_bench.py --json
benchmarks/results/mauve_interval.json`` (about 5 minutes on 2 cores; ``--quick`` is a check that it
runs). docs/method.md#metrics cites it.
"""

from __future__ import annotations

import numpy as np
from common import parser, report

import dihal_builtin.metrics as builtin

#: the committed records' size: 128 samples a side; features narrow so that MAUVE is fast
N, DIM, SHIFTS = 128, 16, (0.0, 0.35, 0.8)


def with_replacement_interval(p: np.ndarray, q: np.ndarray, seed: int, draws: int) -> tuple[float, float]:
    """The interval of the records before 2026-12-05: the central 95% of MAUVE over resamples that
    draw both sides' rows with replacement (reimplemented here, it is no longer in the metrics)."""
    rng = np.random.default_rng(seed)
    values = [builtin.mauve_score(p[rng.integers(0, len(p), len(p))], q[rng.integers(0, len(q), len(q))],
                                  seed=int(rng.integers(0, 2**31 - 3)))["mauve"] for _ in range(draws)]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def sample(rng: np.random.Generator, shift: float) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(size=(N, DIM)), rng.normal(size=(N, DIM)) + shift


def case(name: str, shift: float, replicates: int, draws: int, truth_sets: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    target = float(np.mean([builtin.mauve_score(*sample(rng, shift), seed=int(rng.integers(0, 2**31 - 3)))["mauve"]
                            for _ in range(truth_sets)]))
    held = {"half_sample": 0, "with_replacement": 0}
    below_point = {"half_sample": 0, "with_replacement": 0}
    widths = {"half_sample": [], "with_replacement": []}
    for r in range(replicates):
        p, q = sample(rng, shift)
        scored = builtin.mauve_score(p, q, seed=r, bootstrap=draws)
        intervals = {"half_sample": (scored["mauve_ci_low"], scored["mauve_ci_high"]),
                     "with_replacement": with_replacement_interval(p, q, r, draws)}
        for kind, (low, high) in intervals.items():
            held[kind] += low <= target <= high
            below_point[kind] += high < scored["mauve"]
            widths[kind].append(high - low)
    return {"case": name, "shift": shift, "target_mauve": target, "replicates": replicates, "draws": draws,
            **{f"{kind}_coverage": held[kind] / replicates for kind in held},
            **{f"{kind}_interval_below_its_point": below_point[kind] / replicates for kind in held},
            **{f"{kind}_mean_width": float(np.mean(widths[kind])) for kind in held}}


def main() -> None:
    args = parser(__doc__).parse_args()
    replicates, draws, truth_sets = (6, 5, 20) if args.quick else (200, 50, 1000)
    cases = [case(f"Q shifted by {shift}" if shift else "one Gaussian", shift, replicates, draws, truth_sets,
                  args.seed + i) for i, shift in enumerate(SHIFTS)]
    for row in cases:
        print(f"{row['case']:>22}: target {row['target_mauve']:.3f}; coverage half-sample "
              f"{row['half_sample_coverage']:.3f}, with replacement {row['with_replacement_coverage']:.3f}; "
              f"interval below its point {row['with_replacement_interval_below_its_point']:.3f} (with replacement)")
    report("mauve_interval", {"cases": cases},
           {"n": N, "dim": DIM, "level": 0.95, "replicates": replicates, "draws": draws, "truth_sets": truth_sets,
            "quick": args.quick, "seed": args.seed}, args.json)


if __name__ == "__main__":
    main()
