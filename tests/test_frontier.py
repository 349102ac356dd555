"""Quality frontiers (docs/method.md#frontiers): which rows get which points, and that a point is the row
under the suite with one sampling setting changed (the same jobs, the training found done)."""

from __future__ import annotations

import json

import pytest

from dihal_bench.config.suite import DEFAULTS, apply_overrides, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.study.costs import unit_work
from dihal_bench.study.plan import frontier_points, seed_units
from test_runner import run_cli


def points_of(sets: dict[str, str]) -> dict[str, list]:
    _, config = resolve_suite("smoke")
    config = apply_overrides(config, sets)
    points: dict[str, list] = {}
    for point in frontier_points(config):
        points.setdefault(point.label, []).append(point.setting)
    return points


def test_temperatures_go_to_token_drawing_rows_and_steps_to_diffusion_rows():
    points = points_of({"frontier.temperatures": "[0.7, 1.0]", "frontier.diffusion_steps": "[2, 4, 8]"})
    # the suite's own settings (temperature 1, 4 diffusion steps) are the rows themselves, not points
    assert points["dihal-chosen"] == points["control-skip"] == points["ar-backbone"] == [("temperature", 0.7)]
    assert points["mdlm"] == [("temperature", 0.7), ("diffusion_steps", 2), ("diffusion_steps", 8)]
    # argmax rounding draws no token from a distribution: steps only
    assert points["diffusion-lm"] == points["sed"] == [("diffusion_steps", 2), ("diffusion_steps", 8)]
    assert points["ar-scratch"] == [("temperature", 0.7)]
    assert not any(label.startswith("reference-") for label in points)


def test_no_frontier_by_default_and_bad_settings_are_refused():
    assert DEFAULTS["frontier"] == {"temperatures": [], "diffusion_steps": []} and points_of({}) == {}
    _, config = resolve_suite("smoke")
    with pytest.raises(DihalError, match="frontier.temperatures"):
        apply_overrides(config, {"frontier.temperatures": "[0.0]"})
    with pytest.raises(DihalError, match="frontier.diffusion_steps"):
        apply_overrides(config, {"frontier.diffusion_steps": "[0]"})


def test_a_diffusion_point_costs_its_steps_share_of_the_rows_decodes():
    _, config = resolve_suite("smoke")
    config = apply_overrides(config, {"frontier.diffusion_steps": "[8]"})
    [unit] = [u for u in seed_units(config) if u.stage == "frontier" and u.point.name == "mdlm"]
    [decodes] = unit_work(unit, config).baseline_decodes
    # the suite samples 4 texts of 16 tokens in one batch of 4 at 4 steps: 8 steps decode twice that
    assert (decodes.batches, decodes.tokens) == (2, 128) and unit.label == "mdlm at 8 steps"


def test_a_point_is_the_row_under_the_suite_at_that_setting(tiny_suite_file, tmp_path):
    """The tiny suite with a frontier at T=0.5, then the same suite run at temperature 0.5 on the same
    store: the second run finds every sample job the first one's points made, and trains nothing."""
    out, results = tmp_path / "runs", tmp_path / "results"
    first = run_cli("run", "--suite", str(tiny_suite_file), "--quiet", "--out", str(out), "--results", str(results),
                    "--set=frontier.temperatures=[0.5, 1.0]")
    assert first.returncode == 0, first.stderr[-3000:]
    [path] = results.glob("*.json")
    seed = json.loads(path.read_text())["per_seed"][0]
    points = {point["method"]: point for point in seed["frontier"]}
    assert set(points) == {"dihal-chosen", "dihal-worst", "dihal-oracle", "control-skip", "control-regressor",
                           "ar-backbone"}
    assert all(point["temperature"] == 0.5 and point["metrics"]["entropy"] > 0 for point in points.values())
    assert all(point["samples_job"] != seed["methods"][name]["samples_job"] for name, point in points.items())
    assert [label for label in seed["units"] if " at T=" in label] == [f"{name} at T=0.5" for name in points]
    exported = [json.loads(line) for line in path.with_name(path.stem + ".samples.jsonl").read_text().splitlines()]
    tempered = [line for line in exported if "temperature" in line]
    assert len(tempered) == 6 * 4 and {line["temperature"] for line in tempered} == {0.5}
    trained = sorted(p.name for p in (out / "tiny" / "jobs").iterdir() if "train" in p.name)
    path.unlink()
    second = run_cli("run", "--suite", str(tiny_suite_file), "--quiet", "--out", str(out), "--results", str(results),
                     "--set=sampling.temperature=0.5")
    assert second.returncode == 0, second.stderr[-3000:]
    [path] = results.glob("*.json")
    again = json.loads(path.read_text())["per_seed"][0]
    assert {name: again["methods"][name]["samples_job"] for name in points} == \
        {name: point["samples_job"] for name, point in points.items()}
    assert {name: again["methods"][name]["metrics"]["entropy"] for name in points} == \
        {name: point["metrics"]["entropy"] for name, point in points.items()}
    assert sorted(p.name for p in (out / "tiny" / "jobs").iterdir() if "train" in p.name) == trained


def test_the_frontier_table_puts_each_rows_own_setting_among_its_points(tmp_path):
    """Two seeds; DiHAL at T = 0.5 and 0.7 beside its own T = 1 (Gen.PPL 10 + seed): the table lists the
    three settings in order, pooled over the seeds, the suite's own marked, the metrics as the methods table's."""
    import pandas as pd

    from dihal_bench.leaderboard import build_leaderboards
    from test_leaderboard import GROUP

    results = frontier_results(tmp_path, lambda seed: [
        point("temperature", t, 10 * t + seed, 2 * t) for t in (0.7, 0.5)])
    build_leaderboards(results, tmp_path / "out", ["md", "csv", "html"], warn=lambda message: None)
    table = pd.read_csv(tmp_path / "out" / GROUP / "frontier.csv")
    assert list(table["method"]) == ["dihal-chosen"] * 3 and set(table["axis"]) == {"temperature"}
    assert list(table["setting"]) == ["0.5", "0.7", "1 (the suite’s)"]
    assert list(table["gen_ppl_mean"]) == pytest.approx([5.5, 7.5, 10.5])  # seeds 0 and 1 pooled
    assert list(table["entropy_mean"]) == pytest.approx([1.0, 1.4, 2.5])
    assert "Frontiers" in (tmp_path / "out" / GROUP / "frontier.md").read_text()
    assert "<h3>Frontiers</h3>" in (tmp_path / "out" / "leaderboard.html").read_text()
    assert (tmp_path / "out" / GROUP / "gen_ppl_vs_entropy.png").stat().st_size > 0


def test_no_frontier_plot_without_a_frontier(tmp_path):
    from dihal_bench.leaderboard.plot import drawings
    from dihal_bench.leaderboard.read import read_groups
    from test_leaderboard import seed_entry, write_record

    results = tmp_path / "results"
    results.mkdir()
    write_record(results, "a.json", [seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    [group] = read_groups(results, lambda message: None)
    assert "gen_ppl_vs_entropy" not in drawings(group, None) and "gen_ppl_vs_steps" not in drawings(group, None)


def test_the_steps_frontier_draws_each_diffusion_row_through_its_steps_with_its_own_among_them(tmp_path):
    """Gen.PPL against NFE: the row's own steps (the suite's 50) joins its points, pooled over seeds, a tick
    at each count; temperature points are not on it."""
    from dihal_bench.leaderboard.plot import drawings, one_two_five
    from dihal_bench.leaderboard.read import read_groups

    results = frontier_results(tmp_path, lambda seed: [  # the row's own Gen.PPL: 10 + seed
        *(point("diffusion_steps", k, 100.0 / k + seed, 2.0) for k in (25, 5)), point("temperature", 0.5, 3.0, 1.0)])
    [group] = read_groups(results, lambda message: None)
    axes = drawings(group, None)["gen_ppl_vs_steps"].figure.axes[0]
    [line] = [line for line in axes.get_lines() if len(line.get_xdata())]
    assert list(line.get_xdata()) == [5, 25, 50]
    assert list(line.get_ydata()) == pytest.approx([20.5, 4.5, 10.5])  # seeds 0 and 1 pooled; 50 is the row
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["5", "25", "50"]
    assert [one_two_five(v) for v in (20000.0, 30000.0, 50.0, 0.2, 7.0)] == ["20000", "", "50", "0.2", ""]


def point(axis: str, setting: float, gen_ppl: float, entropy: float) -> dict:
    """A frontier point of dihal-chosen at ``setting`` of ``axis``."""
    return {"method": "dihal-chosen", axis: setting, "samples": {"path": "p", "count": 4}, "samples_job": "x",
            "metrics": {"gen_ppl": gen_ppl, "entropy": entropy}}


def frontier_results(tmp_path, points_of_seed):
    """A results folder with one sealed record of seeds 0 and 1 (dihal-chosen's Gen.PPL 10 + seed) whose
    frontier points are ``points_of_seed(seed)``, under a suite sampling at temperature 1 in 50 steps."""
    from dihal_bench.study.records import seal_record
    from test_leaderboard import record, seed_entry

    entries = []
    for seed in (0, 1):
        entry = seed_entry(seed, 10.0 + seed, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
        entry["frontier"] = points_of_seed(seed)
        entries.append(entry)
    built = record(entries)
    built["config"] = {"sampling": {"temperature": 1.0, "diffusion_steps": 50}}
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps(seal_record(built)))
    return results
