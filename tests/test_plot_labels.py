"""No label of a committed plot covers another: the plots of every group the committed records make are
drawn, and the boxes of their texts (point labels, annotations, legend entries) measured with the renderer
that draws them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dihal_bench.leaderboard.aggregate import tables
from dihal_bench.leaderboard.plot import STYLE, _figure, drawings, overlapping_texts, place_labels
from dihal_bench.leaderboard.read import read_groups

COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / "results"


def quiet(_message: str) -> None:
    pass


def test_the_measure_finds_two_labels_on_one_point_and_placement_parts_them():
    import matplotlib

    with matplotlib.rc_context(STYLE):
        figure, axes = _figure()
        xs, ys = [1.0, 1.0, 1.02, 3.0], [2.0, 2.0, 2.01, 5.0]
        axes.scatter(xs, ys)
        for x, y, name in zip(xs, ys, ("control-regressor", "DiHAL (ℓ*=3)", "DiHAL oracle (ℓ=1)", "far")):
            axes.text(x, y, name, fontsize="small")
        crowded = overlapping_texts(figure)
        assert {pair for pair in crowded} >= {("control-regressor", "DiHAL (ℓ*=3)")}  # the measure sees them
        assert ("far", "DiHAL (ℓ*=3)") not in crowded and ("control-regressor", "far") not in crowded

        figure, axes = _figure()
        axes.scatter(xs, ys)
        place_labels(axes, xs, ys, ["control-regressor", "DiHAL (ℓ*=3)", "DiHAL oracle (ℓ=1)", "far"])
        assert overlapping_texts(figure) == []


@pytest.mark.skipif(not any(COMMITTED_RESULTS.glob("*.json")), reason="no committed run record")
def test_no_committed_plot_has_overlapping_labels():
    drawn = 0
    for group in read_groups(COMMITTED_RESULTS, quiet):
        methods = next((table for table in tables(group) if table.name == "methods"), None)
        for stem, drawing in drawings(group, methods).items():
            assert overlapping_texts(drawing.figure) == [], f"{group.folder}/{stem}.png"
            drawn += 1
    assert drawn >= 3
