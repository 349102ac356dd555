"""Leaderboards from hand-built run records: pooled mean ± std against numpy, grouping,
bad records skipped with a warning, self-contained HTML, and all-or-nothing output."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dihal_bench import leaderboard
from dihal_bench.errors import DihalError
from dihal_bench.leaderboard import build_leaderboards, format_cell, format_mean_std, pareto_front
from dihal_bench.records import RECORD_FORMAT

GROUP = "diag-tiny-tiny"  # the folder of suite "diag", backbone "tiny", evaluator "tiny"


def seed_entry(seed: int, gen_ppl: float, chosen: int, bridge_mse: dict[int, float], spearman: float) -> dict:
    """One seed of a run record, minimal but shaped like the runner's: locate over layers
    1..4 with one proxy, a sweep over layers 1..3, DiHAL at ℓ* and the backbone."""
    layers = [1, 2, 3, 4]
    correlation = {"spearman": spearman, "spearman_low": spearman - 0.2, "spearman_high": min(1.0, spearman + 0.1),
                   "kendall": spearman / 2, "kendall_low": -0.1, "kendall_high": 0.9, "n": 3}
    return {
        "seed": seed,
        "locate": {
            "layers": layers,
            "score": [0.1 * layer + seed for layer in layers],
            "chosen_layer": chosen,
            "proxies": {"curvature": {"values": [layer * 10.0 + seed for layer in layers],
                                      "z": [layer - 2.5 for layer in layers], "higher_is_better": True,
                                      "params": {}, "weight": 1.0}},
        },
        "sweep": {
            "layers": [{"layer": layer, "bridge_mse": mse, "bridge_r2": 1 - mse, "hybrid_ppl": 100 * mse,
                        "kl_to_backbone": mse / 2, "skip_ppl": 1e4} for layer, mse in bridge_mse.items()],
            "correlations": {"score": correlation, "curvature": correlation},
        },
        "roles": {"chosen": chosen, "worst": 4, "oracle": 1},
        "methods": {
            "dihal-chosen": {
                "kind": "dihal", "in_budget": True, "layer": chosen, "parameters": {"bridge": 1000},
                "train": {"steps": 6, "tokens_seen": 768},
                "metrics": {"gen_ppl": gen_ppl, "gen_ppl_sample_mean": gen_ppl + 1, "entropy": 2.5,
                            "diversity": 0.5 + seed / 10, "mauve": None, "n": 4, "warning": "too few"},
                "latency": {"batch1_ms_per_token": 40.0, "batch1_ratio_to_backbone": 2.0},
            },
            "ar-backbone": {
                "kind": "baseline", "in_budget": False, "parameters": {}, "train": {"steps": 0, "tokens_seen": 0},
                "metrics": {"gen_ppl": 50.0, "gen_ppl_sample_mean": 60.0, "entropy": 2.6, "diversity": 0.9},
                "latency": {"batch1_ms_per_token": 20.0, "batch1_ratio_to_backbone": 1.0},
            },
        },
    }


def write_record(folder: Path, name: str, seeds: list[dict], *, evaluator: str = "tiny") -> Path:
    record = {"format": RECORD_FORMAT, "suite": "diag", "backbone": "tiny", "corpus": "toy",
              "evaluator": evaluator, "seeds": [s["seed"] for s in seeds], "per_seed": seeds}
    path = folder / name
    path.write_text(json.dumps(record))
    return path


#: Gen.PPL, ℓ*, bridge MSE of layer 2 and Spearman ρ of the three pooled seeds (two records).
POOLED = [(10.0, 2, 0.4, 0.5), (12.0, 2, 0.6, 0.7), (17.0, 3, 0.9, 1.0)]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    entries = [seed_entry(seed, ppl, chosen, {1: 1.0, 2: mse, 3: 0.8}, rho)
               for seed, (ppl, chosen, mse, rho) in enumerate(POOLED)]
    write_record(folder, "a.json", entries[:2])
    write_record(folder, "b.json", entries[2:])
    return folder


def build(results: Path, out: Path, formats=("md", "csv", "html")) -> tuple[list[Path], list[str]]:
    warnings: list[str] = []
    return build_leaderboards(results, out, formats, warn=warnings.append), warnings


def test_mean_std_pool_the_seeds_of_all_records(results, tmp_path):
    out = tmp_path / "out"
    written, warnings = build(results, out)
    assert warnings == []
    ppl = np.array([p for p, *_ in POOLED])

    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    dihal = methods.loc["dihal-chosen"]
    assert dihal["gen_ppl_mean"] == pytest.approx(np.mean(ppl))
    assert dihal["gen_ppl_std"] == pytest.approx(np.std(ppl, ddof=1))
    assert dihal["gen_ppl_n"] == 3
    assert dihal["name"] == "DiHAL (ℓ*∈{2, 3})"  # ℓ* differs across seeds: the set
    assert methods.loc["ar-backbone", "budget"] == "reference (outside budget)"
    assert methods.loc["ar-backbone", "gen_ppl_std"] == 0
    assert dihal["mauve_n"] == 0 and math.isnan(dihal["mauve_mean"])  # None in every seed: no value

    layers = pd.read_csv(out / GROUP / "layers.csv").set_index("layer")
    mse = np.array([m for _, _, m, _ in POOLED])
    assert layers.loc[2, "bridge_mse_mean"] == pytest.approx(np.mean(mse))
    assert layers.loc[2, "bridge_mse_std"] == pytest.approx(np.std(mse, ddof=1))
    assert layers.loc[2, "curvature_mean"] == pytest.approx(np.mean([20.0, 21.0, 22.0]))  # raw proxy values
    assert str(layers.loc[2, "chosen_for_seeds"]) == "0 1" and str(layers.loc[3, "chosen_for_seeds"]) == "2"
    assert list(layers.index) == [1, 2, 3]

    proxies = pd.read_csv(out / GROUP / "proxies.csv").set_index("proxy")
    rho = np.array([r for *_, r in POOLED])
    assert proxies.loc["curvature", "spearman_mean"] == pytest.approx(np.mean(rho))
    assert proxies.loc["curvature", "spearman_std"] == pytest.approx(np.std(rho, ddof=1))
    assert proxies.loc["score", "spearman_high_mean"] == pytest.approx(np.mean([0.6, 0.8, 1.0]))

    markdown = (out / GROUP / "methods.md").read_text()
    assert markdown.splitlines()[0] == "Built from 2 run records (3 seeds): a.json (seeds 0, 1); b.json (seed 2)."
    # mean 13, std √13 = 3.606: the std to two significant figures, the mean to the same digit
    assert "| 13.0 ± 3.6 (n=3 seeds) |" in re.sub(r" +", " ", markdown)
    assert (out / "index.md").is_file() and (out / "leaderboard.html").is_file()
    assert all(path.is_file() for path in written)


def test_groups_keep_evaluators_apart(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    write_record(results, "one.json", [seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)], evaluator="tiny")
    write_record(results, "two.json", [seed_entry(0, 99.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)], evaluator="big/eval")
    out = tmp_path / "out"
    build(results, out, formats=("csv",))
    apart = {folder: pd.read_csv(out / folder / "methods.csv").set_index("method").loc["dihal-chosen"]
             for folder in ("diag-tiny-tiny", "diag-tiny-big_eval")}
    assert apart["diag-tiny-tiny"]["gen_ppl_mean"] == 10.0 and apart["diag-tiny-tiny"]["gen_ppl_n"] == 1
    assert apart["diag-tiny-big_eval"]["gen_ppl_mean"] == 99.0 and apart["diag-tiny-big_eval"]["gen_ppl_n"] == 1
    assert not (out / "index.md").exists()  # index.md comes with the md format


def test_bad_records_are_skipped_with_a_warning_naming_each(results, tmp_path):
    (results / "corrupt.json").write_text('{"format": "dihal-bench/run-record/v1", "suite": ')
    (results / "foreign.json").write_text(json.dumps({"format": "someone-else/v2", "rows": []}))
    (results / "hollow.json").write_text(json.dumps({"format": RECORD_FORMAT, "suite": "diag"}))
    out = tmp_path / "out"
    _, warnings = build(results, out, formats=("md",))
    assert len(warnings) == 3
    for name, why in (("corrupt.json", "not readable JSON"), ("foreign.json", "not a dihal-bench run record"),
                      ("hollow.json", "malformed run record")):
        assert any(str(results / name) in warning and why in warning for warning in warnings), name
    assert (out / GROUP / "methods.md").read_text().startswith("Built from 2 run records (3 seeds): a.json")


def test_no_records_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DihalError, match=f"no run records in {re.escape(str(empty))}"):
        build(empty, tmp_path / "out")
    (empty / "foreign.json").write_text("[]")
    with pytest.raises(DihalError, match="no run records in"):
        build(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_html_page_is_self_contained(results, tmp_path):
    out = tmp_path / "out"
    build(results, out, formats=("html",))
    page = (out / "leaderboard.html").read_text()
    images = re.findall(r'<img src="([^"]*)"', page)
    assert len(images) == 3  # proxies vs layer, score vs bridge MSE, Gen.PPL vs diversity
    for source in images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    for external in ("http://", "https://", "<link", "<script", "src=\"/", "@import"):
        assert external not in page
    assert "Built from 2 run records (3 seeds)" in page and "13.0 ± 3.6 (n=3 seeds)" in page
    table_page = (out / GROUP / "methods.html").read_text()
    assert table_page.split("<body>\n", 1)[1].startswith("<p>Built from 2 run records (3 seeds): a.json")
    assert sorted(p.name for p in (out / GROUP).iterdir()) == [
        "gen_ppl_vs_diversity.png", "layers.html", "methods.html", "proxies.html", "proxies_vs_layer.png",
        "score_vs_bridge_mse.png"]


def test_csv_columns_are_numeric(results, tmp_path):
    out = tmp_path / "out"
    build(results, out, formats=("csv",))
    for table in ("methods", "layers", "proxies"):
        frame = pd.read_csv(out / GROUP / f"{table}.csv")
        stats = [c for c in frame.columns if c.endswith(("_mean", "_std", "_n"))]
        assert stats and all(pd.api.types.is_numeric_dtype(frame[c]) for c in stats), table


def test_latex_and_format_validation(results, tmp_path):
    out = tmp_path / "out"
    build(results, out, formats=("latex",))
    latex = (out / GROUP / "methods.tex").read_text()
    assert latex.startswith("% Built from 2 run records") and r"13.0 $\pm$ 3.6" in latex
    assert "±" not in latex and "ℓ" not in latex
    with pytest.raises(DihalError, match="unknown leaderboard format 'pdf'; known: csv, html, latex, md"):
        build(results, tmp_path / "other", formats=("md", "pdf"))
    assert not (tmp_path / "other").exists()


def test_nothing_is_written_when_rendering_fails(results, tmp_path, monkeypatch):
    def broken(table, group):
        raise RuntimeError("renderer broke")

    monkeypatch.setitem(leaderboard.TABLE_RENDERERS, "html", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="renderer broke"):
        build(results, out)
    assert not out.exists() or not any(out.iterdir())


def test_lm_eval_results_become_method_columns(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entry = seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"]["dihal-chosen"]["lm_eval"] = {"wikitext": {"bits_per_byte": 1.25, "alias": "wikitext"}}
    write_record(results, "one.json", [entry])
    out = tmp_path / "out"
    build(results, out, formats=("csv", "md"))
    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    assert methods.loc["dihal-chosen", "lm_eval/wikitext/bits_per_byte_mean"] == 1.25
    assert methods.loc["ar-backbone", "lm_eval/wikitext/bits_per_byte_n"] == 0
    assert "wikitext bits_per_byte" in (out / GROUP / "methods.md").read_text()


def test_number_formatting():
    assert format_mean_std(62.6185, 1.234) == "62.6 ± 1.2"
    assert format_mean_std(0.5, 0.0123) == "0.500 ± 0.012"
    assert format_mean_std(3.3e27, 1.2e26) == "3.30e+27 ± 1.2e+26"
    assert format_mean_std(2.0, 0.0) == "2.000 ± 0"
    assert format_cell(62.6185, math.nan, 1) == "62.62 (n=1 seed)"
    assert format_cell(math.nan, math.nan, 0) == "—"
    assert format_cell(2285888.0, 0.0, 3, count=True) == "2,285,888"
    assert format_cell(6.0, 1.0, 2, count=True) == "6.0 ± 1.0 (n=2 seeds)"


def test_pareto_front_keeps_the_undominated_points():
    # (diversity, Gen.PPL): more diversity and less Gen.PPL are better
    points = [(0.5, 10.0), (0.6, 20.0), (0.4, 30.0), (0.6, 15.0)]
    assert pareto_front(points) == [0, 3]
