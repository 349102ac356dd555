"""The claims table over budget scales (docs/method.md, "Claims across budget scales"): a paired
Gen.PPL claim is decided at each scale where both sides were trained and names where its verdict
turns; at matched training compute DiHAL at ℓ* is taken at its largest scale that costs no more than
the other row; a group at one scale reads as it always did."""

from __future__ import annotations

import math

import numpy as np
from test_claims import LAYERS, entry, group_of, method, samples

from dihal_bench.leaderboard.claims import NO, NOT_REPRODUCED, NOT_TESTED, REPRODUCED, VERDICTS, YES, evaluate
from dihal_bench.leaderboard.read import Group
from dihal_bench.leaderboard.render import markdown_text
from dihal_bench.study.plan import split_scale

#: one unit of training compute, in PFLOP (a size `fmt` shows as "0.02", "0.08", "0.1")
UNIT = 0.02
ERRORS = [0.1 * layer for layer in LAYERS]


def kind_of(row: str) -> str:
    return "dihal" if row.startswith("dihal") else "control" if row.startswith("control") else "baseline"


def seed_methods(seed: int, log_ppls: dict[str, float]) -> dict:
    """One seed's rows at the given log Gen.PPLs (labels with their ``@<s>x``), each with the
    ``scale`` a new record writes; the samples share most of their noise, as paired rows do."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(scale=0.3, size=128)
    methods = {}
    for label, log_ppl in log_ppls.items():
        row, scale = split_scale(label)
        nll, tokens = samples(log_ppl, shared + rng.normal(scale=0.05, size=128))
        methods[label] = {**method(kind_of(row), nll, tokens, latency=0.9 if label == "dihal-chosen" else None),
                          "scale": scale}
    return methods


def scaled_group(log_ppls: dict[str, float], flops: dict[str, float | None]) -> Group:
    """Two seeds of a diagnostic-like group; ``flops``: each label's training compute in units, the
    seeds' counts 10% either side of it (their mean is it); None: not counted."""
    group = group_of([entry(seed, [-e for e in ERRORS], ERRORS, seed_methods(seed, log_ppls)) for seed in (0, 1)])
    for label, units in flops.items():
        for seed, spread in ((0, 0.9), (1, 1.1)):
            pflop = math.nan if units is None else units * UNIT * spread
            group.rows["methods"].append({"record": "r.json", "seed": seed, "method": label, "train_pflop": pflop})
    return group


#: the rows every group here has at the matched budget
MATCHED = {"dihal-chosen": 5.0, "dihal-oracle": 4.98, "control-regressor": 5.5, "sed": 6.0}
MATCHED_FLOPS = {"dihal-chosen": 1, "control-regressor": 1, "sed": 1}


def row(rows: list, start: str, contains: str = ""):
    (found,) = [r for r in rows if r.claim.startswith(start) and contains in r.claim]
    return found


def test_a_claim_is_decided_at_each_scale_and_names_the_scales_where_its_verdict_turns():
    # DiHAL beats SED by a wide margin at 1× and 2×; at 4× DiHAL has got worse and SED has passed it,
    # though not DiHAL at 1× nor SED at 1×: a side read at the wrong scale would turn the 4× verdict
    scaled = {"dihal-chosen@2x": 4.8, "sed@2x": 5.6, "control-regressor@2x": 4.9,
              "dihal-chosen@4x": 5.8, "sed@4x": 5.4, "control-regressor@4x": 6.3}
    group = scaled_group({**MATCHED, **scaled}, {**MATCHED_FLOPS, **{label: split_scale(label)[1] for label in scaled}})
    rows = evaluate([group])
    baselines = row(rows, "under a matched budget")
    assert baselines.verdict == f"1×: {REPRODUCED} · 2×: {REPRODUCED} · 4×: {NOT_REPRODUCED}"
    assert "3 budget scales tested (1×, 2×, 4×)" in baselines.interval
    turn = f"The verdict changes between 2× and 4× ({REPRODUCED} → {NOT_REPRODUCED}): "
    # both intervals, each of its own scale's rows: SED at 2× is worse than DiHAL, at 4× better
    at_2x, at_4x = baselines.interval.split(turn)[1].split(f"; 4×: {markdown_text('sed@4x')} ratio ")
    ratio_2x = float(at_2x.split(f"2×: {markdown_text('sed@2x')} ratio ")[1].split(",")[0])
    assert ratio_2x < 1 < float(at_4x.split(",")[0])
    assert "Other scales: 1×: sed ratio" in baselines.interval  # the one scale no change names
    assert "No correction across scales" in baselines.rule
    regressor = row(rows, "diffusion steps")
    assert regressor.verdict == f"1×: {REPRODUCED} · 2×: {REPRODUCED} · 4×: {REPRODUCED}"
    assert "The same verdict at every scale" in regressor.interval and "changes" not in regressor.interval
    # the oracle claim compares two layers of DiHAL, not DiHAL with another row: matched budget only
    assert row(rows, "geometry-chosen").verdict in VERDICTS


def test_the_compute_matched_pick_is_dihal_at_the_largest_scale_that_costs_no_more():
    # DiHAL's scales cost 1, 2, 4, 8 units; MDLM's 1× costs 5 and its 2× exactly 8. Of DiHAL's scales
    # only 4× is worse than MDLM at 1×, so the verdict says which scale was picked as well as the text
    group = scaled_group({**MATCHED, "mdlm": 5.5, "mdlm@2x": 4.0, "dihal-chosen@2x": 3.0,
                          "dihal-chosen@4x": 6.0, "dihal-chosen@8x": 3.0},
                         {**MATCHED_FLOPS, "mdlm": 5, "mdlm@2x": 8, "dihal-chosen@2x": 2,
                          "dihal-chosen@4x": 4, "dihal-chosen@8x": 8})
    rows = evaluate([group])
    matched = row(rows, "(this benchmark's question)", "(MDLM) trained from scratch on Gen.PPL at matched")
    assert matched.verdict == f"1× (DiHAL 4×): {NO} · 2× (DiHAL 8×): {YES}"
    first, second = matched.measurement.split("; 2× (DiHAL 8×): ")
    assert "against DiHAL at ℓ\\* at 4× (0.08 PFLOP, 0.8× mdlm's FLOPs)" in first
    assert "against DiHAL at ℓ\\* at 8× (0.16 PFLOP, 1× " in second  # at most: equal cost is matched
    assert f"The verdict changes between 1× (DiHAL 4×) and 2× (DiHAL 8×) ({NO} → {YES})" in matched.interval
    # scale for scale (DiHAL the cheaper at each) DiHAL wins at both: the per-scale question is its own row
    same_scale = row(rows, "(this benchmark's question)", "(MDLM) trained from scratch on Gen.PPL under the same")
    assert same_scale.verdict == f"1×: {YES} · 2×: {YES}"


def test_a_row_cheaper_than_dihals_smallest_scale_is_not_tested_and_says_both_counts():
    group = scaled_group({**MATCHED, "mdlm": 5.0, "dihal-chosen@2x": 4.8}, {**MATCHED_FLOPS, "mdlm": 0.5,
                                                                          "dihal-chosen@2x": 2})
    matched = row(evaluate([group]), "(this benchmark's question)", "(MDLM) trained from scratch on Gen.PPL at matched")
    assert matched.verdict == f"1×: {NOT_TESTED}"
    assert "smallest scale (1×) trains on 0.02 PFLOP, more than mdlm's 0.01 PFLOP" in matched.interval


def test_a_compute_matched_pair_without_a_flop_count_is_not_tested():
    group = scaled_group({**MATCHED, "dihal-chosen@2x": 4.8, "sed@2x": 5.6},
                         {**MATCHED_FLOPS, "dihal-chosen@2x": 2, "sed@2x": None})
    matched = row(evaluate([group]), "DiHAL at ℓ\\* beats sed on Gen.PPL at matched training compute")
    assert matched.verdict == f"1× (DiHAL 1×): {REPRODUCED} · 2×: {NOT_TESTED}"
    assert f"no training FLOP count for {markdown_text('sed@2x')}" in matched.interval


def test_a_group_at_one_scale_reads_as_before_and_one_scaled_row_turns_on_the_scales_reading():
    one = evaluate([scaled_group({**MATCHED, "mdlm": 5.2}, {**MATCHED_FLOPS, "mdlm": 1})])
    assert all(r.verdict in VERDICTS for r in one)
    assert not any("matched training compute" in r.claim or "budget scale" in r.interval for r in one)
    # DiHAL trained once more at 2×, nothing else: every pair still has only 1× in common
    more = evaluate([scaled_group({**MATCHED, "mdlm": 5.2, "dihal-chosen@2x": 4.8},
                                  {**MATCHED_FLOPS, "mdlm": 1, "dihal-chosen@2x": 2})])
    paired = ("under a matched budget", "diffusion steps", "(this benchmark's question) DiHAL at ℓ\\* beats masked")
    for start in paired:
        at_scales = row(more, start, "" if start.startswith(("under", "diffusion")) else "same allowance")
        assert at_scales.verdict == f"1×: {row(one, start).verdict}"
        assert "1 budget scale tested (1×)" in at_scales.interval
    unpaired = [r for r in one if not r.claim.startswith(paired)]
    assert unpaired and unpaired == [r for r in more if not r.claim.startswith(paired)
                                     and "matched training compute" not in r.claim]
    compute_rows = [r.claim for r in more if "matched training compute" in r.claim]
    assert len(compute_rows) == 3  # SED, the regressor, MDLM
