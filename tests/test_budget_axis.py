"""Budget scales in the leaderboard (docs/method.md#budget-scales): a row trained at several scales of the
matched budget is one methods-table row per scale (never pooled), a budget table lists each row through
its scales with its training FLOPs, and a plot puts Gen.PPL against training FLOPs with the Pareto front."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard import build_leaderboards
from dihal_bench.leaderboard.aggregate import tables
from dihal_bench.leaderboard.plot import drawings, overlapping_texts
from dihal_bench.leaderboard.read import read_groups
from test_leaderboard import GROUP, METRICS, metric, seed_entry, write_record

PLOT = "gen_ppl_vs_train_flops.png"
#: Gen.PPL of row x at each scale on seed 0; seed i adds 2·i. x@4x ran on seeds 0 and 1 only.
X_PPL = {1: 40.0, 2: 30.0, 4: 20.0}
SEEDS = (0, 1, 2)
#: training FLOPs of x at scale 1 (× s at scale s), and of y, the row trained at one scale
X_FLOPS, Y_FLOPS, Y_PPL = 1e13, 5e12, 60.0
#: the extra metrics of the scaled records: a held-out NLL and the share of copied 8-grams
EXTRA_METRICS = {"heldout_nll": metric("Held-out NLL", False), "copied_8grams": metric("Copied 8-grams", False)}


def trained(gen_ppl: float, flops: float, *, scale: int | None, entropy: float = 2.5, **extra) -> dict:
    """A trained baseline row at a budget scale (``scale`` None: a record from before scales)."""
    row = {"kind": "baseline", "in_budget": True, "parameters": {"net": 100},
           "train": {"steps": 6 * (scale or 1), "tokens_seen": 768 * (scale or 1)},
           "samples": {"path": "s.jsonl", "count": 4},
           "metrics": {"gen_ppl": gen_ppl, "entropy": entropy, "diversity": 0.5, **extra},
           "compute": {"train_flops": flops, "inference_flops_per_token": 1e8, "counted": "test"}}
    if scale is not None:
        row["scale"] = scale
        if scale != 1:
            row["budget"] = {"steps": 6 * scale}
    return row


def scaled_entry(seed: int) -> dict:
    """A seed with x at scales 1, 2 and 4 (x@4x on seeds 0 and 1 only), y at scale 1, and the held-out text;
    x@2x collapses on seed 0 (its entropy far below the held-out text's)."""
    entry = seed_entry(seed, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    for method in entry["methods"].values():
        method["scale"] = 1
    entry["methods"]["reference-human"] = {
        "kind": "reference", "in_budget": False, "parameters": {}, "scale": 1,
        "samples": {"path": "s.jsonl", "count": 4}, "metrics": {"gen_ppl": 15.0, "entropy": 2.6},
        "compute": {"train_flops": 0, "inference_flops_per_token": 0, "counted": "nothing"}}
    for scale, ppl in X_PPL.items():
        if scale == 4 and seed == 2:
            continue
        collapsed = scale == 2 and seed == 0
        entry["methods"]["x" if scale == 1 else f"x@{scale}x"] = trained(
            ppl + 2 * seed, X_FLOPS * scale, scale=scale, entropy=1.0 if collapsed else 2.5,
            heldout_nll=3.0 / scale + seed, copied_8grams=0.01 * scale)
    entry["methods"]["y"] = trained(Y_PPL + seed, Y_FLOPS, scale=1)
    return entry


@pytest.fixture
def scaled(tmp_path: Path) -> Path:
    """A results folder with one group whose row x was trained at scales 1, 2 and 4 over three seeds."""
    results = tmp_path / "results"
    results.mkdir()
    write_record(results, "scaled.json", [scaled_entry(seed) for seed in SEEDS], metrics=METRICS | EXTRA_METRICS)
    return results


def build(results: Path, out: Path) -> Path:
    warnings: list[str] = []
    build_leaderboards(results, out, ("md", "csv", "html"), warn=warnings.append)
    assert warnings == []
    return out / GROUP


def test_no_table_pools_two_scales(scaled, tmp_path):
    methods = pd.read_csv(build(scaled, tmp_path / "out") / "methods.csv").set_index("method")
    assert {"x", "x@2x", "x@4x", "y"} <= set(methods.index)
    for label, scale in (("x", 1), ("x@2x", 2), ("x@4x", 4)):
        seeds = [seed for seed in SEEDS if not (scale == 4 and seed == 2)]
        assert methods.loc[label, "gen_ppl_n"] == len(seeds)
        assert methods.loc[label, "gen_ppl_mean"] == pytest.approx(X_PPL[scale] + 2 * sum(seeds) / len(seeds))
        assert methods.loc[label, "train_pflop_mean"] == pytest.approx(X_FLOPS * scale / 1e15)
    assert methods.loc["x", "budget"] == "matched" and methods.loc["x@4x", "budget"] == "matched ×4"
    assert methods.loc["ar-backbone", "budget"] == "outside"


def test_the_budget_table_lists_each_scaled_row_through_its_scales(scaled, tmp_path):
    folder = build(scaled, tmp_path / "out")
    budget = pd.read_csv(folder / "budget.csv")
    # one line per scale of the one row trained at several; y (one scale) and the untrained rows are not in it
    assert list(budget["method"]) == ["x", "x@2x", "x@4x"]
    assert list(budget["row"]) == ["x"] * 3 and list(budget["scale"]) == ["1×", "2×", "4×"]
    assert list(budget["seeds_n"]) == [3, 3, 2]
    assert list(budget["gen_ppl_mean"]) == pytest.approx([42.0, 32.0, 21.0])  # seeds add 0, 2, 4 (x@4x: 0, 2)
    assert list(budget["train_pflop_mean"]) == pytest.approx([0.01, 0.02, 0.04])
    assert list(budget["heldout_nll_mean"]) == pytest.approx([4.0, 2.5, 1.25])
    assert list(budget["copied_8grams_mean"]) == pytest.approx([0.01, 0.02, 0.04])
    assert list(budget["degenerate"]) == ["no", "seed 0", "no"]
    markdown = re.sub(r" +", " ", (folder / "budget.md").read_text())
    assert "| x | 4× | 2 |" in markdown and "docs/method.md#budget-scales" in markdown
    assert "21.0 ± 1.4 (n=2 seeds)" in markdown  # x@4x: 20 and 22, fewer seeds than the table's 3
    assert "Budget scales" in (folder / "budget.html").read_text()
    page = (tmp_path / "out" / "leaderboard.html").read_text()
    assert "<h3>Budget scales</h3>" in page and "against training FLOPs" in page


def test_the_budget_table_shows_the_extra_metrics_only_where_the_records_carry_them(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entries = [scaled_entry(seed) for seed in SEEDS]
    write_record(results, "plain.json", entries)  # METRICS: no held-out NLL, no copied 8-grams
    budget = pd.read_csv(build(results, tmp_path / "out") / "budget.csv")
    assert "gen_ppl_mean" in budget and "mauve_mean" in budget and "entropy_mean" in budget
    assert not any("nll" in column or "copied" in column for column in budget.columns)


def test_the_compute_plot_is_drawn_for_scaled_rows_the_same_every_time(scaled, tmp_path):
    one, two = build(scaled, tmp_path / "one"), build(scaled, tmp_path / "two")
    assert (one / PLOT).read_bytes() == (two / PLOT).read_bytes()
    group = read_groups(scaled, lambda message: None)[0]
    methods = next(table for table in tables(group) if table.name == "methods")
    figure = drawings(group, methods)["gen_ppl_vs_train_flops"].figure
    axes = figure.axes[0]
    assert axes.get_xscale() == axes.get_yscale() == "log"
    front = next(line for line in axes.get_lines() if line.get_label() == "Pareto front")
    # y is cheapest, then x through its scales, each better than the last: all on the front
    assert list(front.get_xdata()) == pytest.approx([Y_FLOPS, X_FLOPS, 2 * X_FLOPS, 4 * X_FLOPS])
    assert list(front.get_ydata()) == pytest.approx([61.0, 42.0, 32.0, 21.0])
    markers = [collection for collection in axes.collections if isinstance(collection, PathCollection)]
    hollow = [tuple(point) for collection in markers if not collection.get_facecolor().size
              for point in collection.get_offsets()]
    assert hollow == [pytest.approx((2 * X_FLOPS, 32.0))]  # x@2x, degenerate on seed 0; no other point
    assert sum(len(collection.get_offsets()) for collection in markers) == 4  # x at 3 scales, y
    labels = sorted(text.get_text() for text in axes.texts if text.get_text())
    # each row labelled once; the held-out text, which trains nothing, as a dotted level at its Gen.PPL
    assert labels == ["reference-human (no training here)", "x", "y"]
    levels = [line for line in axes.get_lines() if line.get_linestyle() == ":"]
    assert [tuple(line.get_ydata()) for line in levels] == [(15.0, 15.0)]
    assert overlapping_texts(figure) == []


def test_a_record_without_scales_reads_as_scale_1_with_no_budget_table_or_plot(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entry = seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"]["x"] = trained(40.0, X_FLOPS, scale=None)
    write_record(results, "old.json", [entry])
    group = read_groups(results, lambda message: None)[0]
    assert {(row["method"], row["row"], row["scale"]) for row in group.rows["methods"]} == {
        ("dihal-chosen", "dihal-chosen", 1), ("ar-backbone", "ar-backbone", 1), ("x", "x", 1)}
    assert "budget" not in {table.name for table in tables(group)}
    folder = build(results, tmp_path / "out")
    assert not (folder / "budget.csv").exists() and not (folder / PLOT).exists()
    assert (folder / "methods.csv").exists() and (folder / "methods_tradeoff.png").exists()


def test_a_label_without_a_scale_key_takes_its_scale_from_the_label_and_a_disagreement_is_an_error(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entry = scaled_entry(0)
    for method in entry["methods"].values():
        method.pop("scale")
    write_record(results, "unkeyed.json", [entry])
    rows = {row["method"]: row for row in read_groups(results, lambda message: None)[0].rows["methods"]}
    assert (rows["x@4x"]["row"], rows["x@4x"]["scale"]) == ("x", 4)

    wrong = copy.deepcopy(scaled_entry(0))
    wrong["methods"]["x@4x"]["scale"] = 2
    write_record(results, "unkeyed.json", [wrong])
    with pytest.raises(DihalError, match=r"unkeyed\.json.*'x@4x' says scale 2"):
        read_groups(results, lambda message: None)


def test_a_scaled_dihal_row_is_named_and_budgeted_with_its_scale():
    from dihal_bench.leaderboard.aggregate import budget_label, method_name

    rows = pd.DataFrame({"kind": ["dihal"] * 2, "in_budget": [True] * 2, "layer": [3, 3], "scale": [4, 4]})
    assert method_name("dihal-chosen@4x", rows) == "DiHAL@4x (ℓ*=3)"
    assert method_name("dihal-chosen", rows.assign(scale=1)) == "DiHAL (ℓ*=3)"
    assert budget_label(rows) == "matched ×4" and budget_label(rows.assign(scale=1)) == "matched"


def test_a_readme_block_holds_the_budget_table_and_a_group_without_scales_is_refused(scaled, tmp_path):
    """The README's headline curve is generated like its other tables (a ``results:GROUP/budget`` block);
    a block naming the budget table of a group whose rows have one scale each is an error naming the
    tables the group has."""
    from dihal_bench.leaderboard.readme import embed_results

    groups = read_groups(scaled, lambda message: None)
    block = f"<!-- results:{GROUP}/budget:start -->\nstale\n<!-- results:{GROUP}/budget:end -->\n"
    filled = embed_results("Prose.\n" + block, groups)
    assert "stale" not in filled and "| x | 4× | 2 |" in re.sub(r" +", " ", filled)
    plain = tmp_path / "plain"
    plain.mkdir()
    write_record(plain, "plain.json", [seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    with pytest.raises(DihalError, match=r"/budget: that group has no 'budget' table \(a block can hold: layers\)"):
        embed_results(block, read_groups(plain, lambda message: None))


def test_the_folded_scales_block_reads_each_row_as_its_curve_on_one_line(scaled, tmp_path):
    """``results:GROUP/scales`` holds the budget table's Gen.PPL with one column per scale and names the
    scales the degenerate rule flagged; ``scales_nll`` the same for the held-out likelihood (a scale where no
    row has one gets no column), refused for a group whose rows have none."""
    from dihal_bench.leaderboard.readme import embed_results
    from dihal_bench.leaderboard.scales import scales_table

    group = read_groups(scaled, lambda message: None)[0]
    table = scales_table(group)
    assert [column.header for column in table.columns] == [
        "Row", "1×", "2×", "4×", "Train PFLOP (lowest scale)", "Degenerate at"]
    line = table.numbers.iloc[0]
    assert table.labels["row"] == ["x"] and table.labels["degenerate"] == ["2× (seed 0)"]
    # seeds add 0, 2, 4 to x's Gen.PPL (x@4x ran on seeds 0 and 1 only), as in the budget table
    assert [line[f"{s}×_mean"] for s in (1, 2, 4)] == pytest.approx([42.0, 32.0, 21.0])
    assert [line[f"{s}×_n"] for s in (1, 2, 4)] == [3, 3, 2] and line["train_pflop_mean"] == pytest.approx(0.01)
    block = f"<!-- results:{GROUP}/scales:start -->\nstale\n<!-- results:{GROUP}/scales:end -->\n"
    filled = re.sub(r" +", " ", embed_results(block, [group]))
    assert "| x | 42.0 ± 2.0 | 32.0 ± 2.0 | 21.0 ± 1.4 (n=2 seeds) | 0.01000 ± 0 | 2× (seed 0) |" in filled
    nll_block = block.replace("/scales:", "/scales_nll:")
    with pytest.raises(DihalError, match=r"/scales_nll: that group has no 'scales_nll' table"):
        embed_results(nll_block, [group])

    results = tmp_path / "nll"
    results.mkdir()
    entries = [scaled_entry(seed) for seed in SEEDS]
    for seed, entry in zip(SEEDS, entries):
        for label in ("x", "x@2x"):  # x@4x has no likelihood, and no other row is at 4×: no 4× column
            nll = 3.0 + seed / 10
            entry["methods"][label]["test_nll"] = {"kind": "exact", "nats_per_token": nll, "nll_sum": nll * 64,
                                                   "tokens": 64, "windows": 1, "test_windows": 9, "covered_windows": 4}
        # z, trained at 1× and 8×: an 8× column, in which x reads —
        entry["methods"]["z"], entry["methods"]["z@8x"] = (trained(ppl, X_FLOPS * s, scale=s)
                                                           for ppl, s in ((50.0, 1), (25.0, 8)))
    write_record(results, "nll.json", entries, metrics=METRICS | EXTRA_METRICS)
    nll = scales_table(read_groups(results, lambda message: None)[0], "test_nll")
    assert [column.header for column in nll.columns][1:3] == ["1×", "2×"] and len(nll.columns) == 5
    filled = re.sub(r" +", " ", embed_results(nll_block, read_groups(results, lambda message: None)))
    assert "| x | 3.10 ± 0.10 | 3.10 ± 0.10 | 0.01000 ± 0 | 2× (seed 0) |" in filled
    ppl = re.sub(r" +", " ", embed_results(block, read_groups(results, lambda message: None)))
    assert "| x | 42.0 ± 2.0 | 32.0 ± 2.0 | 21.0 ± 1.4 (n=2 seeds) | — |" in ppl
    assert "| z | 50.00 ± 0 | — | — | 25.00 ± 0 |" in ppl
