"""The degenerate-sample rule (docs/method.md#metrics, set 2026-12-05): the threshold where the rule
puts it, and the rows it flags in the committed records, which the README lists."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dihal_bench.leaderboard.degenerate import degenerate_seeds, flag_label, seed_flags
from dihal_bench.leaderboard.read import read_groups
from dihal_bench.numerics.degenerate import ENTROPY_MARGIN, entropy_floor, is_degenerate

ROOT = Path(__file__).resolve().parent.parent


def test_the_floor_is_a_quarter_fewer_effective_tokens_than_the_held_out_text():
    assert ENTROPY_MARGIN == pytest.approx(math.log(4 / 3))
    # exp(H) is the effective number of distinct tokens: at the floor, three quarters of the held-out's
    assert math.exp(entropy_floor(3.6)) == pytest.approx(0.75 * math.exp(3.6))
    assert is_degenerate(entropy_floor(3.6) - 1e-9, 3.6) is True
    assert is_degenerate(entropy_floor(3.6) + 1e-9, 3.6) is False
    assert is_degenerate(4.5, 3.6) is False  # more varied than natural text is not collapse
    assert is_degenerate(None, 3.6) is None and is_degenerate(2.0, None) is None
    assert is_degenerate(math.nan, 3.6) is None and is_degenerate(True, 3.6) is None


def entry(seed: int, entropies: dict[str, float]) -> dict:
    return {"seed": seed, "methods": {name: {"metrics": {"entropy": h}} for name, h in entropies.items()}}


def test_a_seed_is_judged_against_its_own_held_out_text_and_not_judged_without_one():
    first = entry(1, {"reference-human": 3.6, "collapsed": 2.0, "fine": 3.5})
    second = entry(2, {"reference-human": 3.0, "collapsed": 2.9, "fine": 3.5})
    assert seed_flags(first) == {"reference-human": False, "collapsed": True, "fine": False}
    entries = [("a.json", first), ("b.json", second)]
    assert degenerate_seeds(entries, "collapsed") == [1]
    assert flag_label(entries, "collapsed") == "seed 1" and flag_label(entries, "fine") == "no"
    unjudged = [("c.json", entry(3, {"collapsed": 0.5}))]
    assert seed_flags(unjudged[0][1]) == {"collapsed": None} and flag_label(unjudged, "collapsed") == "—"


def test_the_committed_records_flag_what_the_readme_and_method_doc_list():
    groups = {group.suite: group for group in read_groups(ROOT / "results", lambda message: None)}
    diagnostic = groups["diagnostic"].entries
    assert degenerate_seeds(diagnostic, "sed-detached-readout") == [1, 2, 3, 4, 5]
    assert degenerate_seeds(diagnostic, "diffusion-lm") == [2, 3, 4, 5]
    flagged = {name for _, e in diagnostic for name, flag in seed_flags(e).items() if flag}
    assert flagged == {"sed-detached-readout", "diffusion-lm"}
    assert not any(flag for _, e in groups["rivals"].entries for flag in seed_flags(e).values())
    # the superseded 4x record (kept for docs/results.md, outside the leaderboard)
    four_x = read_groups(ROOT / "results" / "superseded", lambda message: None)
    four_x = next(g for g in four_x if g.suite == "diagnostic-4x").entries
    assert {name for _, e in four_x for name, flag in seed_flags(e).items() if flag} == {"sed", "sed-detached-readout"}


def test_the_methods_table_names_the_degenerate_seeds_of_each_row():
    from dihal_bench.leaderboard.aggregate import method_table

    group = next(g for g in read_groups(ROOT / "results", lambda message: None) if g.suite == "diagnostic")
    table = method_table(group)
    labels = dict(zip(table.numbers["method"], table.labels["degenerate"]))
    assert labels["diffusion-lm"] == "seeds 2, 3, 4, 5" and labels["sed-detached-readout"] == "seeds 1, 2, 3, 4, 5"
    assert labels["dihal-chosen"] == "no" and labels["reference-human"] == "no"
    assert any(column.key == "degenerate" and column.main for column in table.columns)
