"""One line per kind of metric warning under a methods table (dihal_bench/leaderboard/metric_warnings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dihal_bench.leaderboard.metric_warnings import merged_text, warning_notes
from dihal_bench.leaderboard.read import Group, read_groups

COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / "results"
TOO_FEW = "MAUVE on {} samples per side is optimistic; use at least 1000 (its paper uses 5000)"


def group_with(warnings: dict[str, list[str]], methods: list[str]) -> Group:
    group = Group("s", "b", "e")
    group.metrics = {"mauve": {"display_name": "MAUVE"}, "gen_ppl": {"display_name": "Gen.PPL"}}
    group.rows["methods"] = [{"method": method} for method in methods]
    for text, warned in warnings.items():
        metric = "gen_ppl" if text.startswith("Gen") else "mauve"
        group.warnings[(metric, text)] = warned
    return group


def test_warnings_that_differ_in_their_numbers_are_said_once_with_the_range():
    group = group_with({TOO_FEW.format(127): ["a", "c"], TOO_FEW.format(128): ["b", "a"],
                        TOO_FEW.format(124): ["d"]}, ["a", "b", "c", "d"])
    assert warning_notes(group) == [f"MAUVE warns (every method): {TOO_FEW.format('124–128')}."]


def test_warnings_of_other_kinds_or_metrics_stay_apart_and_name_their_rows():
    group = group_with({TOO_FEW.format(128): ["a"], "MAUVE could not embed 3 texts": ["b"],
                        "Gen.PPL saw 3 empty samples": ["b"]}, ["a", "b", "c"])
    assert warning_notes(group) == [f"MAUVE warns (a): {TOO_FEW.format(128)}.", "MAUVE warns (b): MAUVE could not embed 3 texts.",
                                    "Gen.PPL warns (b): Gen.PPL saw 3 empty samples."]


def test_a_number_all_warnings_share_is_kept_as_it_is():
    assert merged_text(["x 2 of 10.", "x 3 of 10"]) == "x 2–3 of 10"


@pytest.mark.skipif(not any(COMMITTED_RESULTS.glob("*.json")), reason="no committed run record")
def test_the_committed_diagnostic_records_give_one_mauve_warning():
    group = next(g for g in read_groups(COMMITTED_RESULTS, lambda message: None) if g.suite == "diagnostic")
    notes = warning_notes(group)
    assert len([note for note in notes if note.startswith("MAUVE warns")]) == 1 and len(group.warnings) > 1
