"""Leaderboards from hand-built run records: pooled mean ± std against numpy, grouping,
foreign files skipped with a warning and damaged records refused, self-contained HTML,
names from records rendered inertly in every format, and all-or-nothing output."""

from __future__ import annotations

import base64
import copy
import csv
import html
import itertools
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard import build_leaderboards, render
from dihal_bench.leaderboard.aggregate import pareto_front
from dihal_bench.leaderboard.page import SORT_SCRIPT
from dihal_bench.leaderboard.read import read_groups
from dihal_bench.leaderboard.render import format_cell, format_mean_std, format_p
from dihal_bench.study.records import RECORD_FORMAT, RECORD_FORMAT_V1, seal_record
from dihal_bench.training.budget import Budget

GROUP = "diag-tiny-tiny"  # the folder of suite "diag", backbone "tiny", evaluator "tiny"


def metric(display_name: str, higher_is_better: bool | None, description: str = "", source: str = "x 1.0") -> dict:
    """One entry of a record's ``metrics`` mapping."""
    return {"higher_is_better": higher_is_better, "display_name": display_name, "description": description,
            "source": source}


#: The records' metrics mapping: the built-in metrics, in the order the runner lists them.
METRICS = {"gen_ppl": metric("Gen.PPL", False, "corpus-level perplexity"),
           "gen_ppl_sample_mean": metric("Gen.PPL (mean)", False), "entropy": metric("Entropy", True),
           "diversity": metric("Diversity", True), "mauve": metric("MAUVE", True)}


def seed_entry(seed: int, gen_ppl: float, chosen: int, bridge_mse: dict[int, float], spearman: float) -> dict:
    """One seed of a run record, minimal but shaped like the runner's (and valid under the v2
    schema): locate over layers 1..4 with one proxy, a sweep over layers 1..3, DiHAL at ℓ* and
    the backbone."""
    layers = [1, 2, 3, 4]
    correlation = {"spearman": spearman, "spearman_low": spearman - 0.2, "spearman_high": min(1.0, spearman + 0.1),
                   "kendall": spearman / 2, "kendall_low": -0.1, "kendall_high": 0.9, "n": 3}
    return {
        "seed": seed,
        "units": [],
        "locate": {
            "layers": layers,
            "score": [0.1 * layer + seed for layer in layers],
            "chosen_layer": chosen,
            "proxies": {"curvature": {"values": [layer * 10.0 + seed for layer in layers],
                                      "z": [layer - 2.5 for layer in layers], "higher_is_better": True,
                                      "params": {}, "weight": 1.0}},
            "preprocessing": "trace",
        },
        "sweep": {
            "layers": [{"layer": layer, "bridge_mse": mse, "bridge_r2": 1 - mse, "hybrid_ppl": 100 * mse,
                        "kl_to_backbone": mse / 2, "skip_ppl": 1e4} for layer, mse in bridge_mse.items()],
            "budget": {},
            "correlations": {"score": correlation, "curvature": correlation},
        },
        "roles": {"chosen": chosen, "worst": 4, "oracle": 1},
        "budget": {},
        "methods": {
            "dihal-chosen": {
                "kind": "dihal", "in_budget": True, "layer": chosen, "parameters": {"bridge": 1000},
                "train": {"steps": 6, "tokens_seen": 768}, "samples": {"path": "s.jsonl", "count": 4},
                "metrics": {"gen_ppl": gen_ppl, "gen_ppl_sample_mean": gen_ppl + 1, "entropy": 2.5,
                            "diversity": 0.5 + seed / 10, "mauve": None, "mauve_n": 4, "mauve_warning": "too few"},
                "latency": {"batch1_ms_per_token": 40.0, "batch1_ratio_to_backbone": 2.0},
            },
            "ar-backbone": {
                "kind": "baseline", "in_budget": False, "parameters": {}, "train": {"steps": 0, "tokens_seen": 0},
                "samples": {"path": "s.jsonl", "count": 4},
                "metrics": {"gen_ppl": 50.0, "gen_ppl_sample_mean": 60.0, "entropy": 2.6, "diversity": 0.9},
                "latency": {"batch1_ms_per_token": 20.0, "batch1_ratio_to_backbone": 1.0},
            },
        },
    }


def record(seeds: list[dict], *, evaluator: str = "tiny", metrics: dict | None = None, **names) -> dict:
    """A v2 run record of ``seeds``."""
    return {"format": RECORD_FORMAT, "suite": "diag", "backbone": "tiny", "corpus": "toy", "evaluator": evaluator,
            "seeds": [s["seed"] for s in seeds], "config": {}, "created": "2026-12-01T00:00:00Z", "environment": {},
            "timings": {}, "jobs": "runs/jobs", "metrics": METRICS if metrics is None else metrics,
            "per_seed": seeds, **names}


def write_record(folder: Path, name: str, seeds: list[dict], *, sealed: bool = True, **options) -> Path:
    """A record file, sealed as the runner's are (``sealed=False``: as written before seals)."""
    path = folder / name
    built = record(seeds, **options)
    path.write_text(json.dumps(seal_record(built) if sealed else built))
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
    assert methods.loc["ar-backbone", "budget"] == "outside"
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
    # one pooled permutation p, not a mean of per-seed p-values: per seed, ρ of S(ℓ) with −MSE is
    # 0.5, 0.5 and 1 (layer 2's MSE 0.4, 0.6, 0.9 against 1.0 and 0.8); the null permutes each
    # seed's three layers apart, 6³ orderings counted here
    per_ordering = [1.0, 0.5, 0.5, -0.5, -0.5, -1.0]  # ρ of the 3! orderings of 3 layers
    null = [np.mean(draw) for draw in itertools.product(per_ordering, repeat=3)]
    exact = np.mean([abs(v) >= 2 / 3 - 1e-12 for v in null])
    pooled = proxies.loc["score", "spearman_p_mean"]
    assert abs(pooled - exact) <= 4 * math.sqrt(exact * (1 - exact) / 10_000) + 1e-4  # Monte-Carlo, 10⁴ draws
    assert proxies.loc["score", "spearman_p_n"] == 3 and math.isnan(proxies.loc["score", "spearman_p_std"])
    # two tests in the family (score's and curvature's ρ, the same ranking): Holm doubles both
    assert proxies.loc["curvature", "spearman_p_holm_mean"] == pytest.approx(min(1.0, 2 * pooled))
    assert "spearman_high_mean" not in proxies.columns and "spearman_low_mean" not in proxies.columns

    markdown = (out / GROUP / "methods.md").read_text()
    assert markdown.splitlines()[0] == "Built from 2 run records (3 seeds): a.json (seeds 0, 1); b.json (seed 2)."
    # mean 13, std √13 = 3.606: the std to two significant figures, the mean to the same digit
    assert "| 13.0 ± 3.6 |" in re.sub(r" +", " ", markdown) and markdown.count("over n = 3 seeds") == 1
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


def test_foreign_json_is_skipped_with_a_warning_naming_it(results, tmp_path):
    (results / "foreign.json").write_text(json.dumps({"format": "someone-else/v2", "rows": []}))
    (results / "unlabelled.json").write_text(json.dumps({"rows": []}))
    out = tmp_path / "out"
    _, warnings = build(results, out, formats=("md",))
    assert len(warnings) == 2
    for name in ("foreign.json", "unlabelled.json"):
        assert any(str(results / name) in w and "not a dihal-bench run record" in w for w in warnings), name
    assert (out / GROUP / "methods.md").read_text().startswith("Built from 2 run records (3 seeds): a.json")


def damaged(change: Callable[[dict], object]) -> str:
    """A valid one-seed record as JSON text after ``change(record)`` edited it in place."""
    whole = record([seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    change(whole)
    return json.dumps(whole)


def take_proxy_named_layer(record: dict) -> None:
    proxies = record["per_seed"][0]["locate"]["proxies"]
    proxies["layer"] = proxies["curvature"]


def add_metric_named_steps(record: dict) -> None:
    record["metrics"] = {**record["metrics"], "steps": metric("Steps", True)}


DAMAGED = {  # file name -> (content, what the error says)
    "truncated.json": (damaged(lambda r: None)[:300], "is not readable JSON"),
    "latin1.json": (b'{"suite": "caf\xe9"}', "is not readable JSON"),
    "list.json": ("[]", "is not a JSON object but a JSON list"),
    "null.json": ("null", "is not a JSON object but a JSON NoneType"),
    "hollow.json": (json.dumps({"format": RECORD_FORMAT, "suite": "diag"}), "'backbone' is a required property"),
    "no-seeds.json": (damaged(lambda r: r.update(per_seed=[])), "per_seed: []"),
    "nameless.json": (damaged(lambda r: r.update(suite="")), "'suite' must be a non-empty string"),
    "text-seed.json": (damaged(lambda r: r["per_seed"][0].update(seed="0")), "seed: '0' is not of type 'integer'"),
    "text-layer.json": (damaged(lambda r: r["per_seed"][0]["methods"]["dihal-chosen"].update(layer="two")),
                        "layer: 'two' is not of type 'integer'"),
    "methods-list.json": (damaged(lambda r: r["per_seed"][0].update(methods=[])), "methods: [] is not of type"),
    "proxy-named-layer.json": (damaged(take_proxy_named_layer), "proxy name 'layer' is taken"),
    "metric-named-steps.json": (damaged(add_metric_named_steps), "metric name 'steps' is taken"),
    "surrogate.json": (damaged(lambda r: r.update(corpus="\ud800")), "not valid Unicode"),
    # a format this version cannot read is ours all the same: an error, not a skipped file
    "future.json": (damaged(lambda r: r.update(format="dihal-bench/run-record/v9")), "'dihal-bench/run-record/v9'"),
}


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_record_is_an_error_naming_it_and_nothing_is_written(results, tmp_path, name):
    content, why = DAMAGED[name]
    (results / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    with pytest.raises(DihalError) as raised:
        build(results, out)
    message = str(raised.value)
    assert str(results / name) in message and why in message
    assert "\n" not in message  # the CLI's one Error: line
    assert not out.exists()


# --- seals: an edited record is left out, an unsealed one marked --------------------------------


def test_an_edited_record_is_named_and_kept_out_of_every_table(results, tmp_path):
    path = results / "b.json"
    edited = json.loads(path.read_text())
    edited["per_seed"][0]["methods"]["ar-backbone"]["metrics"]["gen_ppl"] = 12.5  # was 50.0
    path.write_text(json.dumps(edited, indent=2))
    out = tmp_path / "out"
    written, warnings = build(results, out)
    assert warnings == [f"left out {path}: it does not match the sha256 in its seal: edited or damaged since "
                        "it was written"]
    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    assert methods.loc["ar-backbone", "gen_ppl_n"] == 2 and methods.loc["ar-backbone", "gen_ppl_mean"] == 50.0
    assert methods.loc["dihal-chosen", "gen_ppl_mean"] == pytest.approx(11.0)  # a.json's two seeds only
    for text in (p.read_text() for p in written if p.suffix in (".md", ".csv", ".html")):
        assert "b.json" not in text and "12.5" not in text


def test_a_record_whose_seal_is_edited_too_is_left_out(results, tmp_path):
    path = results / "b.json"
    edited = json.loads(path.read_text())
    edited["integrity"]["algorithm"] = "none"
    path.write_text(json.dumps(edited))
    written, warnings = build(results, tmp_path / "out")
    assert len(warnings) == 1 and warnings[0].startswith(f"left out {path}: it has a malformed seal")


def test_only_edited_records_is_an_error_naming_them(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    path = write_record(results, "only.json", [seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    path.write_text(path.read_text().replace('"gen_ppl": 10.0', '"gen_ppl": 1.0'))
    with pytest.raises(DihalError, match=r"no intact run records in .*: only.json left out \(edited or damaged\)"):
        build(results, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_record_written_before_seals_is_included_and_marked_unverified(results, tmp_path):
    old = write_record(results, "old.json", [seed_entry(5, 14.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)], sealed=False)
    out = tmp_path / "out"
    written, warnings = build(results, out, formats=("md", "csv", "html", "latex"))
    assert warnings == [f"{old} has no seal (written before run records carried one): its numbers cannot be "
                        "verified; included, marked unverified"]
    assert pd.read_csv(out / GROUP / "methods.csv").set_index("method").loc["dihal-chosen", "gen_ppl_n"] == 4
    line = ("Built from 3 run records (4 seeds): a.json (seeds 0, 1); b.json (seed 2); "
            "old.json (seed 5, unverified: no seal).")
    assert (out / GROUP / "methods.md").read_text().splitlines()[0] == line
    assert line in (out / GROUP / "methods.tex").read_text().splitlines()[0]
    assert html.escape(line) in (out / "leaderboard.html").read_text()


def test_no_records_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DihalError, match=f"no run records in {re.escape(str(empty))}"):
        build(empty, tmp_path / "out")
    (empty / "foreign.json").write_text(json.dumps({"format": "someone-else/v2"}))
    with pytest.raises(DihalError, match="no run records in"):
        build(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def without_sort_script(page: str) -> str:
    """The page less its one script, the sort script, which must be there exactly once."""
    assert page.count("<script") == 1 and f"<script>{SORT_SCRIPT}</script>" in page
    return page.replace(f"<script>{SORT_SCRIPT}</script>", "")


def test_html_page_is_self_contained(results, tmp_path):
    out = tmp_path / "out"
    build(results, out, formats=("html",))
    page = (out / "leaderboard.html").read_text()
    images = re.findall(r'<img src="([^"]*)"', page)
    assert len(images) == 3  # proxies vs layer, score vs bridge MSE, Gen.PPL vs entropy
    for source in images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    for external in ("http://", "https://", "<link", "<script", "src=\"/", "@import"):
        assert external not in without_sort_script(page)
    # the n is said once for the table, and no line breaks inside a value
    assert "Built from 2 run records (3 seeds)" in page and '>13.0<span class="sd">&nbsp;± 3.6</span><' in page
    table_page = (out / GROUP / "methods.html").read_text()
    assert table_page.split("<body>\n", 1)[1].startswith("<p>Built from 2 run records (3 seeds): a.json")
    assert ">13.0 ± 3.6<" in table_page and table_page.count("over n = 3 seeds") == 1  # n said once here too
    assert sorted(p.name for p in (out / GROUP).iterdir()) == [
        "layers.html", "methods.html", "methods_tradeoff.png", "metrics.html", "proxies.html",
        "proxies_vs_layer.png", "score_vs_bridge_mse.png"]


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

    monkeypatch.setitem(render.TABLE_RENDERERS, "html", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="renderer broke"):
        build(results, out)
    assert not out.exists() or not any(out.iterdir())


def test_lm_eval_results_become_method_columns(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entry = seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"]["dihal-chosen"]["lm_eval"] = {"wikitext": {"bits_per_byte": 1.25, "bits_per_byte_stderr": 0.01,
                                                               "alias": "wikitext"}}
    write_record(results, "one.json", [entry])
    out = tmp_path / "out"
    build(results, out, formats=("csv", "md"))
    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    assert methods.loc["dihal-chosen", "lm_eval/wikitext/bits_per_byte_mean"] == 1.25
    assert methods.loc["ar-backbone", "lm_eval/wikitext/bits_per_byte_n"] == 0
    assert not any("stderr" in column for column in methods.columns)  # a seed's stderr is not averaged over seeds
    assert "wikitext bits_per_byte" in (out / GROUP / "methods.md").read_text()


def test_valid_sample_counts_and_a_metrics_interval_become_method_columns(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entries = [seed_entry(seed, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5) for seed in (0, 1)]
    # seed 0's record says how its interval was made, seed 1's (an older record) does not
    for entry, (low, high, valid, kind) in zip(entries, [(0.2, 0.4, 120, "half-sample"), (0.3, 0.7, 100, None)]):
        entry["methods"]["dihal-chosen"]["metrics"].update(
            {"mauve": (low + high) / 2, "mauve_ci_low": low, "mauve_ci_high": high, "gen_ppl_n_valid": valid,
             "mauve_n_valid": valid, **({"mauve_interval": kind} if kind else {})})
    write_record(results, "two.json", entries)
    out = tmp_path / "out"
    build(results, out, formats=("csv", "md"))
    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    # each seed's own interval, side by side: averaged bounds would be no interval at all
    # and the older kind, a with-replacement bootstrap, is marked as spread
    assert methods.loc["dihal-chosen", "mauve_intervals"] == "s0 0.20–0.40; s1 0.30–0.70†"
    assert "mauve_low_mean" not in methods.columns
    assert methods.loc["dihal-chosen", "valid_samples_mean"] == pytest.approx(110)
    assert methods.loc["ar-backbone", "valid_samples_n"] == 0  # its metrics report no count
    markdown = re.sub(r" +", " ", (out / GROUP / "methods.md").read_text())
    assert "MAUVE 95% CI per seed" in markdown and "s0 0.20–0.40; s1 0.30–0.70" in markdown
    assert "MAUVE (closeness to the corpus) ↑" in markdown
    assert "Valid samples" in markdown


def test_partial_rho_is_tested_pooled_over_seeds_with_its_power_statement(tmp_path):
    from dihal_bench.numerics.stats import Stratum, stratified_rank_test

    results = tmp_path / "results"
    results.mkdir()
    layers = [1, 2, 3, 4, 5, 6]
    mse = {0: [0.1, 0.3, 0.2, 0.5, 0.4, 0.6], 1: [0.2, 0.1, 0.4, 0.3, 0.6, 0.5]}
    entries = []
    for seed in (0, 1):
        entry = seed_entry(seed, 10.0, 2, dict(zip(layers, mse[seed])), 0.5)
        entry["locate"].update(layers=layers, score=[0.5, 2.0, 1.0, 3.0, -1.0, 0.0])
        entry["locate"]["proxies"]["curvature"].update(values=[6.0, 1.0, 4.0, 3.0, 2.0, 5.0], z=[0.0] * 6)
        entries.append(entry)
    write_record(results, "six.json", entries)
    out = tmp_path / "out"
    build(results, out, formats=("csv",))
    proxies = pd.read_csv(out / GROUP / "proxies.csv").set_index("proxy")
    strata = [Stratum([0.5, 2.0, 1.0, 3.0, -1.0, 0.0], [-v for v in mse[seed]], layers) for seed in (0, 1)]
    expected = stratified_rank_test(strata, n_perm=10_000, seed=0)
    row = proxies.loc["score"]
    assert row["partial_p_mean"] == pytest.approx(expected["p"])
    assert row["partial_detectable_mean"] == pytest.approx(expected["critical_rho"])
    assert row["residual_share_y_mean"] == pytest.approx(expected["residual_share_y"])
    # four tests (ρ and partial ρ of two rows): each Holm p is at least its raw one, at most 4×
    for proxy in ("score", "curvature"):
        for key in ("spearman_p", "partial_p"):
            raw, adjusted = proxies.loc[proxy, f"{key}_mean"], proxies.loc[proxy, f"{key}_holm_mean"]
            assert raw <= adjusted <= min(1.0, 4 * raw) + 1e-12


def test_a_geometry_only_record_gets_layer_and_proxy_tables_and_no_methods_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entry = seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"] = {}  # a geometry-only suite: locate, the sweep and the correlations
    write_record(results, "geometry.json", [entry])
    out = tmp_path / "out"
    written, warnings = build(results, out)
    names = {path.name for path in written if path.parent.name == GROUP}
    assert warnings == [] and {"layers.md", "proxies.csv", "score_vs_bridge_mse.png"} <= names
    assert not any(name.startswith(("methods", "metrics", "steps")) for name in names)  # no steps axis either
    page = (out / "leaderboard.html").read_text()
    assert "Proxies" in page and "<h3>Methods" not in page



def test_the_sampling_steps_axis_is_pooled_over_seeds_into_its_own_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    entries = []
    for seed, shift in ((1, 0.0), (2, 0.2)):
        entry = seed_entry(seed, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
        entry["steps_axis"] = [{"steps": k, "layer": 2, "sampler": "mean", "bridge_mse": 0.1 * k + shift,
                                "gen_ppl": 100.0 * k + 100 * shift, "hybrid_ppl": 50.0} for k in (4, 1)]
        entries.append(entry)
    built = record(entries)
    built["config"] = {"bridge": {"sample_steps": 4}}
    (results / "steps.json").write_text(json.dumps(seal_record(built)))
    out = tmp_path / "out"
    written, warnings = build(results, out)
    assert warnings == []
    steps = pd.read_csv(out / GROUP / "steps.csv")
    assert list(steps["steps"]) == ["1", "4 (the suite’s)"]  # sorted by K; the suite's own K marked
    assert steps.loc[1, "bridge_mse_mean"] == pytest.approx(0.5) and steps.loc[1, "bridge_mse_n"] == 2
    assert steps.loc[1, "bridge_mse_std"] == pytest.approx(0.2 / math.sqrt(2))
    assert steps.loc[0, "gen_ppl_mean"] == pytest.approx(110.0)
    assert steps.loc[0, "kl_to_backbone_n"] == 0  # a value no point reports: no number
    assert "Sampling steps K" in (out / "leaderboard.html").read_text()


def test_each_records_stages_are_set_against_its_own_estimate_never_pooled(tmp_path):
    """Two runs of one group, each with its estimate: a line per (record, stage), the ratio of the time
    taken to the time estimated and whether it is within 25%; a record without an estimate adds none."""
    results = tmp_path / "results"
    results.mkdir()
    taken = {"a.json": {"sweep": 120.0, "metrics": 50.0}, "b.json": {"sweep": 70.0, "metrics": 30.0}}
    for seed, (name, timings) in enumerate(taken.items()):
        built = record([seed_entry(seed, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
        built["timings"] = {**timings, "total_seconds": sum(timings.values())}
        built["estimate"] = {"source": "measured on this machine (cpu, float32)", "total_seconds": 200.0,
                             "stages": {"sweep": 100.0, "metrics": 100.0}}
        built["compute"] = {"sweep": {"flops": 2e15, "seconds": timings["sweep"],
                                      "flops_per_second": 2e15 / timings["sweep"]}}
        if name == "a.json":  # 30 s of its sweep are jobs other machines did, taken from the store
            built["environment"]["host_sha256"] = "aaa"
            built["estimate"]["machine"] = {"host_sha256": "aaa", "cpu": "X", "boot": "1"}
            built["provenance"] = {"revisions": [], "stages": {"sweep": {"process": None, "jobs": [], "machines": [
                {"host_sha256": "aaa", "cpu": "X", "boot": "1", "jobs": 2, "seconds": 90.0},
                {"host_sha256": "aaa", "cpu": "X", "boot": "2", "jobs": 1, "seconds": 20.0},  # same name, next lease
                {"host_sha256": "bbb", "cpu": "Y", "boot": "1", "jobs": 1, "seconds": 10.0}]}}}
        (results / name).write_text(json.dumps(seal_record(built)))
    write_record(results, "c.json", [seed_entry(5, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])  # no estimate
    out = tmp_path / "out"
    _, warnings = build(results, out)
    assert warnings == []
    stages = pd.read_csv(out / GROUP / "stages.csv")
    assert list(zip(stages["record"], stages["stage"])) == [("a.json", "sweep"), ("a.json", "metrics"),
                                                            ("b.json", "sweep"), ("b.json", "metrics")]
    assert list(stages["ratio_mean"]) == pytest.approx([1.2, 0.5, 0.7, 0.3])
    assert list(stages["met"]) == ["met", "faster", "faster", "faster"]
    # the share of a stage's time done on the machine that estimated it; none where the record does not say
    assert stages.loc[0, "made_here_mean"] == pytest.approx(0.75)
    assert list(stages["made_here_n"]) == [1, 0, 0, 0]
    assert stages.loc[0, "gflop_per_second_mean"] == pytest.approx(2e15 / 120.0 / 1e9)
    assert stages.loc[1, "pflop_n"] == 0  # a stage whose FLOPs are not counted: no number
    markdown = (out / GROUP / "stages.md").read_text()
    assert "one run record's value for one stage" in markdown and "mean ± sample std" not in markdown
    assert "Stages against the estimate" in (out / "leaderboard.html").read_text()


def test_the_method_stages_share_the_made_here_figure_of_the_one_executor_stage_that_ran_them(tmp_path):
    """The runner hands DiHAL's, the controls', the references' and the baselines' jobs out as one stage
    (`methods`): each of the four gets that stage's share, its time over all four's."""
    results = tmp_path / "results"
    results.mkdir()
    built = record([seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    built["timings"] = {"dihal": 30.0, "baselines": 70.0, "total_seconds": 100.0}
    built["environment"]["host_sha256"] = "aaa"
    built["estimate"] = {"source": "measured on this machine (cpu, float32)", "total_seconds": 100.0,
                         "stages": {"dihal": 30.0, "baselines": 70.0},
                         "machine": {"host_sha256": "aaa", "cpu": "X", "boot": "1"}}
    built["provenance"] = {"revisions": [], "stages": {"methods": {"process": None, "jobs": [], "machines": [
        {"host_sha256": "aaa", "cpu": "X", "boot": "1", "jobs": 3, "seconds": 60.0},
        {"host_sha256": "bbb", "cpu": "Y", "boot": "1", "jobs": 2, "seconds": 40.0}]}}}
    (results / "a.json").write_text(json.dumps(seal_record(built)))
    build(results, tmp_path / "out")
    stages = pd.read_csv(tmp_path / "out" / GROUP / "stages.csv")
    assert list(stages["stage"]) == ["dihal", "baselines"]
    assert list(stages["made_here_mean"]) == pytest.approx([0.6, 0.6])


# --- metric columns come from the records' metrics mapping --------------------------------------


def third_party_record(results: Path, name: str = "mine.json", seeds: tuple[int, int] = (0, 1), **my_metric) -> None:
    """A record of two ``seeds`` whose runs had the (inline, now uninstalled) plugin metric ``my_metric``,
    lower is better, and ``undirected``, which has no better direction."""
    entries = [seed_entry(seed, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5) for seed in seeds]
    for entry, value in zip(entries, (3.0, 5.0)):
        for method in entry["methods"].values():
            method["metrics"] |= {"my_metric": value, "my_metric_n": 7, "undirected": 1.5}
    declared = {"higher_is_better": False, "display_name": "My metric", "description": "how mine it is",
                "source": "my-plugin 1.0"} | my_metric
    metrics = {**METRICS, "my_metric": declared, "undirected": metric("Undirected", None)}
    write_record(results, name, entries, metrics=metrics)


def test_a_third_party_metric_gets_its_column_and_arrow_in_every_format(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    third_party_record(results)
    out = tmp_path / "out"
    build(results, out, formats=("md", "csv", "html"))

    markdown = (out / GROUP / "methods.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| Method"))
    assert "| My metric ↓ |" in re.sub(r" +", " ", header) and "| Undirected |" in re.sub(r" +", " ", header)
    assert header.index("MAUVE (closeness to the corpus) ↑") < header.index("My metric ↓") < header.index("Undirected")  # the mapping's order
    assert "| My metric samples |" in re.sub(r" +", " ", header)  # from my_metric_n

    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    assert methods.loc["ar-backbone", "my_metric_mean"] == 4.0 and methods.loc["ar-backbone", "my_metric_n"] == 2
    assert methods.loc["ar-backbone", "my_metric_std"] == pytest.approx(math.sqrt(2))
    described = pd.read_csv(out / GROUP / "metrics.csv", keep_default_na=False).set_index("metric")
    assert described.loc["my_metric", ["higher_is_better", "arrow", "source"]].tolist() == ["False", "↓", "my-plugin 1.0"]
    assert described.loc["undirected", ["higher_is_better", "arrow"]].tolist() == ["", ""]
    assert "| My metric | my_metric | ↓ lower | how mine it is |" in re.sub(r" +", " ", (out / GROUP / "metrics.md").read_text())

    assert '<th scope="col" title="how mine it is">My metric ↓</th>' in (out / GROUP / "methods.html").read_text()
    page = (out / "leaderboard.html").read_text()
    ranked, rest = page.split("<h3>Methods</h3>", 1)[1].split("<details>", 1)
    assert "My metric ↓</th>" in ranked and "Undirected</th>" not in ranked  # no direction: one click away
    assert "Undirected</th>" in rest.split("</details>", 1)[0]


def test_records_that_disagree_on_a_direction_get_no_arrow(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    third_party_record(results, "a.json")
    third_party_record(results, "b.json", seeds=(2, 3), higher_is_better=True)
    out = tmp_path / "out"
    build(results, out, formats=("md",))
    markdown = re.sub(r" +", " ", (out / GROUP / "methods.md").read_text())
    assert "| My metric |" in markdown and "My metric ↓" not in markdown and "My metric ↑" not in markdown
    assert "The records disagree on whether a higher my_metric is better (b.json says True)" in markdown


def test_a_v1_record_takes_its_metric_columns_from_the_registry(results, tmp_path):
    v1 = record([seed_entry(3, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)])
    del v1["metrics"]
    (results / "c.json").write_text(json.dumps({**v1, "format": RECORD_FORMAT_V1}))
    out = tmp_path / "out"
    build(results, out, formats=("csv",))
    described = pd.read_csv(out / GROUP / "metrics.csv").set_index("metric")
    assert described.loc["gen_ppl", "arrow"] == "↓" and described.loc["entropy", "arrow"] == "↑"
    methods = pd.read_csv(out / GROUP / "methods.csv").set_index("method")
    assert methods.loc["dihal-chosen", "gen_ppl_n"] == 4  # pooled with the three v2 seeds


# --- the single page ------------------------------------------------------------------------------


def test_the_page_states_n_once_per_table(results, tmp_path):
    entry = seed_entry(3, 20.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"]["ar-backbone"]["metrics"]["entropy"] = None  # so its entropy cell has n=3 of 4
    write_record(results, "c.json", [entry])
    out = tmp_path / "out"
    build(results, out, formats=("html",))
    page = (out / "leaderboard.html").read_text()
    stated = "Each cell: mean ± sample std (ddof=1) over n = 4 seeds"
    assert page.count(stated) == 3  # methods, proxies, layers
    assert "(n=4 seeds)" not in page
    ranked = page.split("<h3>Methods</h3>", 1)[1].split("</table>", 1)[0]
    cells = [html.unescape(re.sub(r"<[^>]+>", "", cell)).replace("\xa0", " ")  # a number's text, less its link
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", ranked, re.S)]
    assert "2.600 ± 0 (n=3 seeds)" in cells  # the one cell over fewer seeds says so
    ppl = [p for p, *_ in POOLED] + [20.0]
    assert format_mean_std(np.mean(ppl), np.std(ppl, ddof=1)) in cells  # "14.8 ± 4.6": no n where all 4 have it


def test_the_page_shows_a_few_escaped_samples_per_method(results, tmp_path):
    entry = seed_entry(3, 20.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    entry["methods"]["dihal-chosen"]["samples"]["examples"] = [
        "<b>bold</b> & \"quoted\"\nsecond line", "", *(f"sample {i}" for i in range(2, 9))]
    write_record(results, "c.json", [entry])
    out = tmp_path / "out"
    build(results, out, formats=("html",))
    page = (out / "leaderboard.html").read_text()
    samples = page.split("<h3>Samples</h3>", 1)[1].split("<h3>", 1)[0]
    assert "<summary><span class=\"method\">DiHAL (ℓ*∈{2, 3})</span>" in samples
    assert "<pre>&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;\nsecond line</pre>" in samples
    assert "<li><em>(empty)</em></li>" in samples
    assert samples.count("<li>") == 5 and "sample 4" in samples and "sample 5" not in samples
    assert "ar-backbone" not in samples  # no examples in its records: not listed
    assert "seed 3 of c.json" in samples


def test_the_budget_column_says_what_was_trained():
    from dihal_bench.leaderboard.aggregate import budget_label

    def label(kind: str, in_budget: bool) -> str:
        return budget_label(pd.DataFrame({"kind": [kind, kind], "in_budget": [in_budget, in_budget]}))

    assert [label("dihal", True), label("baseline", False), label("control", False), label("reference", False)] == [
        "matched", "outside", "nothing trained", "no model"]  # the intact backbone, the skip control, a drawn text


def test_number_formatting():
    assert format_mean_std(62.6185, 1.234) == "62.6 ± 1.2"
    assert format_mean_std(0.5, 0.0123) == "0.500 ± 0.012"
    assert format_mean_std(3.3e27, 1.2e26) == "3.30e+27 ± 1.2e+26"
    assert format_mean_std(2.0, 0.0) == "2.000 ± 0"
    assert format_cell(62.6185, math.nan, 1) == "62.62 (n=1 seed)"
    assert format_cell(math.nan, math.nan, 0) == "—"
    assert format_cell(2285888.0, 0.0, 3, count=True) == "2,285,888"
    assert format_cell(6.0, 1.0, 2, count=True) == "6.0 ± 1.0 (n=2 seeds)"
    # p-values to two significant figures: the smallest a 10,000-permutation test gives, then Holm's and a raw one
    assert [format_p(p) for p in (1 / 10001, 0.0026, 0.6682, 1.0, math.nan)] == ["1.0e-04", "0.0026", "0.67", "1", "—"]


def test_pareto_front_keeps_the_undominated_points():
    # (diversity, Gen.PPL): more diversity and less Gen.PPL are better
    points = [(0.5, 10.0), (0.6, 20.0), (0.4, 30.0), (0.6, 15.0)]
    assert pareto_front(points) == [0, 3]


# --- names from records are data, in every format and in file names ----------------------------

SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
LIVE_TEX = "\n\\input{/etc/passwd}\n\\immediate\\write18{touch pwned}"
TEX_SPECIALS = "\\ { } $ & # ^ _ % ~"
#: Markdown's own syntax: a link, an image, emphasis, code, strikethrough and bare autolinks
MARKDOWN = ("[link](javascript:alert(3)) ![img](http://evil.example/x.png) *em* _u_ __strong__ `code` "
            "~~gone~~ www.evil.example mail@evil.example")
#: HTML, a Markdown cell break and Markdown's syntax, LaTeX's specials and lines of live LaTeX,
#: a bare carriage return (which minimal CSV quoting misses) and a mathtext formula (matplotlib labels)
HOSTILE = f"{SCRIPT} {ATTRIBUTE} a|b {MARKDOWN} {TEX_SPECIALS}{LIVE_TEX}\r$\\input{{x}}$"
#: names a spreadsheet would run as formulas (CSV injection): one per character that starts one
FORMULAS = ['=HYPERLINK("http://evil.example","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1,2)"]


def hostile_record(results: Path) -> Path:
    entry = seed_entry(0, 10.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
    for formula in FORMULAS:
        entry["methods"][formula] = copy.deepcopy(entry["methods"]["ar-backbone"])
    entry["methods"][f"{HOSTILE} method"] = entry["methods"].pop("ar-backbone")
    proxies = entry["locate"]["proxies"]
    proxies[f"{HOSTILE} proxy"] = proxies.pop("curvature")
    correlations = entry["sweep"]["correlations"]
    correlations[f"{HOSTILE} proxy"] = correlations.pop("curvature")
    correlations["score"] = f"too few layers {HOSTILE}"  # becomes a note under the proxy table
    chosen = entry["methods"]["dihal-chosen"]
    chosen["samples"]["examples"] = [f"{SCRIPT} sample", HOSTILE]
    # first of the lower-is-better metrics: the y axis of the trade-off plot
    chosen["metrics"][f"{HOSTILE} metric"] = 1.0
    chosen["metrics"][FORMULAS[0]] = 2.0
    metrics = {f"{HOSTILE} metric": metric(f"{HOSTILE} title", False, f"{HOSTILE} description", f"{HOSTILE} 1.0"),
               FORMULAS[0]: metric(FORMULAS[3], None, FORMULAS[1], FORMULAS[2]), **METRICS}
    return write_record(results, "run |<b>x\n\\input{y}.json", [entry], suite=f"../../{HOSTILE} suite",
                        backbone=f"/etc/{HOSTILE} backbone", evaluator=f"{HOSTILE}\x00 evaluator",
                        corpus=f"{HOSTILE} corpus", metrics=metrics)


def unescaped(character: str, line: str) -> int:
    """How many times ``character`` occurs in ``line`` not escaped by a backslash."""
    return len(re.findall(rf"(?<!\\)(?:\\\\)*{re.escape(character)}", line))


def test_names_from_records_render_inertly_in_every_format(tmp_path, monkeypatch):
    import matplotlib

    # a matplotlibrc with usetex would make every plot label LaTeX: the leaderboard turns it off
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    results = tmp_path / "results"
    results.mkdir()
    hostile_record(results)
    out = tmp_path / "out"
    written, warnings = build(results, out, formats=("md", "csv", "html", "latex"))
    assert warnings == []
    [folder] = [path for path in out.iterdir() if path.is_dir()]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "results"]
    assert all(path.resolve().is_relative_to(out.resolve()) for path in written)
    assert {path.suffix for path in folder.iterdir()} == {".md", ".csv", ".html", ".tex", ".png"}

    for path in [*folder.glob("*.md"), out / "index.md"]:
        text = path.read_text()
        assert "<script" not in text and "<img" not in text and "&lt;script&gt;" in text, path.name
        table = [line for line in text.splitlines() if line.startswith("|")]
        assert len({unescaped("|", line) for line in table}) == 1, path.name  # no cell split, no row broken
        assert not any(line.startswith(("\\input", "\\immediate", "$")) for line in text.splitlines()), path.name
    assert "a\\|b" in (folder / "methods.md").read_text()

    for path in [*folder.glob("*.html"), out / "leaderboard.html"]:
        text = path.read_text()
        if path.name == "leaderboard.html":
            text = without_sort_script(text)
        assert "<script" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text, path.name
        assert all(image.startswith('<img src="data:image/png;base64,') for image in re.findall(r"<img[^>]*", text))
        assert "<title>" in text and SCRIPT not in text.split("<title>")[1].split("</title>")[0]
    assert "<pre>&lt;script&gt;alert(1)&lt;/script&gt; sample</pre>" in (out / "leaderboard.html").read_text()

    # CSV keeps every name exactly (a formula behind a quote), line breaks included, and every row whole
    methods = pd.read_csv(folder / "methods.csv")
    assert sorted(methods["method"]) == sorted(["dihal-chosen", f"{HOSTILE} method", *(f"'{f}" for f in FORMULAS)])
    assert f"{HOSTILE} proxy_mean" in pd.read_csv(folder / "layers.csv").columns
    assert set(pd.read_csv(folder / "proxies.csv")["proxy"]) == {f"{HOSTILE} proxy"}
    described = pd.read_csv(folder / "metrics.csv").set_index("metric")
    assert described.loc[f"{HOSTILE} metric", "display_name"] == f"{HOSTILE} title"
    assert methods.set_index("method").loc["dihal-chosen", f"{HOSTILE} metric_mean"] == 1.0
    assert "too few layers &lt;script&gt;" in (folder / "proxies.md").read_text()  # the note

    for path in folder.glob("*.tex"):
        lines = re.split(r"\r\n|\r|\n", path.read_text())
        assert lines[0].startswith("% Built from") and lines[1].startswith("% ") and not lines[2].startswith("%")
        body = "\n".join(lines[2:])
        assert re.search(r"\\(input|immediate|write18)", body) is None, path.name
        rows = [line for line in lines if line.endswith("\\\\")]
        assert len({unescaped("&", row) for row in rows}) == 1, path.name  # no name adds a column
    latex = (folder / "methods.tex").read_text()
    assert r"\textless{}script\textgreater{}alert(1)\textless{}/script\textgreater{}" in latex
    assert r"\textbackslash{} \{ \} \$ \& \# \textasciicircum{} \_ \% \textasciitilde{}" in latex
    assert r"\textbackslash{}input\{/etc/passwd\}" in latex and r"a\textbar{}b" in latex


def test_no_output_holds_a_live_markdown_link_or_a_formula_cell(tmp_path):
    """The crafted record of issue 24, through every format: Markdown renders no link, image,
    emphasis or code from a name (only index.md's own links to its files), no bare URL is left for
    GFM to autolink, and no CSV text cell starts like a spreadsheet formula."""
    results = tmp_path / "results"
    results.mkdir()
    hostile_record(results)
    out = tmp_path / "out"
    written, _ = build(results, out, formats=("md", "csv", "html", "latex"))
    ours = {path.relative_to(out).as_posix() for path in written}
    markdown = [path for path in written if path.suffix == ".md"]
    assert len(markdown) >= 4
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # the textual checks below still hold
        MarkdownIt = None
    for path in markdown:
        text = path.read_text()
        assert "://" not in text and "www." not in text and "@evil" not in text, path.name  # GFM autolinks
        if MarkdownIt is not None:
            rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
            assert re.search(r"<(img|em|strong|code|s|del)\b", rendered) is None, path.name
            assert set(re.findall(r'<a href="([^"]*)"', rendered)) <= ours, path.name
            assert "[link](javascript:alert(3))" in html.unescape(rendered), path.name  # shown, as text
    for path in (path for path in written if path.suffix == ".csv"):
        with path.open(newline="") as handle:
            fields = [field for row in csv.reader(handle) for field in row]
        formulas = [field for field in fields if field.startswith(render.FORMULA_STARTS) and not _is_number(field)]
        assert formulas == [], path.name
    assert "'=HYPERLINK" in (out / GROUP_OF_HOSTILE(out) / "methods.csv").read_text()


def GROUP_OF_HOSTILE(out: Path) -> str:
    [folder] = [path.name for path in out.iterdir() if path.is_dir()]
    return folder


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_group_folders_stay_inside_the_output_folder_and_apart(tmp_path):
    names = [
        ("../..", "/etc/passwd", "x"), ("..", "..", ".."), ("-rf", "a\x00b", "c" * 1000),
        ("diag", "tiny", "big/eval"), ("diag", "tiny", "big_eval"), ("diag", "Tiny", "big_eval"),
        ("a-b", "c", "d"), ("a", "b-c", "d"),
    ]
    results = tmp_path / "results"
    results.mkdir()
    for i, (suite, backbone, evaluator) in enumerate(names):  # Gen.PPL i tells the groups apart
        write_record(results, f"{i}.json", [seed_entry(0, float(i), 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)],
                     suite=suite, backbone=backbone, evaluator=evaluator)
    out = tmp_path / "out"
    written, _ = build(results, out, formats=("csv",))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "results"]
    assert all(path.resolve().parent.parent == out.resolve() for path in written)
    folders = list(out.iterdir())
    assert len(folders) == len(names)
    assert all(len(folder.name.encode()) <= 255 and not folder.name.startswith((".", "-")) for folder in folders)
    # no group overwrote another: each folder holds its own record's numbers
    found = {pd.read_csv(folder / "methods.csv").set_index("method").loc["dihal-chosen", "gen_ppl_mean"]
             for folder in folders}
    assert found == set(map(float, range(len(names))))
    assert not (out / "diag-tiny-big_eval").exists()  # those three clash (case too): all get digests


def test_a_seed_run_again_is_pooled_once_from_the_newer_record(results, tmp_path):
    rerun = seed_entry(1, 99.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.6)  # seed 1 again, later
    write_record(results, "c.json", [rerun], created="2026-12-02T00:00:00Z")
    out = tmp_path / "out"
    _, warnings = build(results, out)
    assert warnings == ["seed 1 of a.json is also in the newer c.json: only the newer is pooled"]
    dihal = pd.read_csv(out / GROUP / "methods.csv").set_index("method").loc["dihal-chosen"]
    assert dihal["gen_ppl_n"] == 3  # seeds 0, 1, 2: three, not four
    assert dihal["gen_ppl_mean"] == pytest.approx(np.mean([10.0, 99.0, 17.0]))
    # the same seed under another configuration that trains the same (a --set of the sampling) is another
    # measurement of the same rows: pooled
    write_record(results, "d.json", [rerun], created="2026-12-03T00:00:00Z", config={"sampling": {"samples": 9}})
    _, warnings = build(results, tmp_path / "again")
    assert warnings == ["seed 1 of a.json is also in the newer c.json: only the newer is pooled"]
    again = pd.read_csv(tmp_path / "again" / GROUP / "methods.csv").set_index("method").loc["dihal-chosen"]
    assert again["gen_ppl_n"] == 4


def test_records_trained_under_two_matched_budgets_are_never_pooled(results, tmp_path):
    """A `--set budget.steps=2400` variant is another protocol under the same row labels: a group of its own,
    titled with its budget, and the first group's numbers stay as they were."""
    variant = seed_entry(1, 99.0, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.6)
    write_record(results, "d.json", [variant], created="2026-12-03T00:00:00Z",
                 config={"budget": {"steps": 2400, "epochs": 4}})
    groups = read_groups(results, lambda message: None)
    assert len(groups) == 2 and len({group.folder for group in groups}) == 2
    by_steps = {group.budget.split("×")[0]: group for group in groups}
    assert set(by_steps) == {"2400", str(Budget().steps)} and "budget 2400×16×64, 4 epochs" in by_steps["2400"].title
    assert by_steps["2400"].sources == {"d.json": [1]} and "d.json" not in by_steps[str(Budget().steps)].sources
    out = tmp_path / "out"
    build(results, out)
    first = [folder for folder in out.iterdir() if folder.is_dir() and (folder / "methods.csv").exists()]
    counts = sorted(pd.read_csv(folder / "methods.csv").set_index("method").loc["dihal-chosen", "gen_ppl_n"]
                    for folder in first)
    assert counts == [1, 3]  # the variant's seed 1 alone; the first group keeps its three, its own seed 1 included



def test_every_methods_table_states_its_scorer_sample_length_n_and_precision():
    from dihal_bench.leaderboard.aggregate import method_table
    from dihal_bench.leaderboard.read import read_groups

    groups = {group.folder: group for group in read_groups(Path(__file__).parents[1] / "results", lambda m: None)}
    diagnostic = method_table(groups["diagnostic-smollm2-135m-gemma3-270m"]).note
    assert diagnostic.startswith("Scored by gemma3-270m (not the backbone); 128 samples of 64 tokens per seed; "
                                 "models in float32; the built-in decoders draw tokens from float32 probabilities")
    assert method_table(groups["sanity-smollm2-135m-smollm2-135m"]).note.startswith(
        "Scored by smollm2-135m (the backbone itself)")


def test_the_test_nll_column_pools_seeds_and_says_exact_or_bound(tmp_path):
    """Held-out likelihoods (docs/method.md#test-nll): a column only where some row has one, pooled over
    seeds like a metric, its kind beside it, "—" for a row without one."""
    folder = tmp_path / "results"
    folder.mkdir()
    entries = [seed_entry(seed, 10.0 + seed, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5) for seed in range(2)]
    for entry, nll in zip(entries, (3.0, 3.5), strict=True):
        entry["methods"]["dihal-chosen"]["test_nll"] = {"kind": "exact", "nats_per_token": nll, "nll_sum": nll * 64,
                                                        "tokens": 64, "windows": 1, "test_windows": 9,
                                                        "covered_windows": 4}
        entry["methods"]["ar-backbone"]["test_nll"] = None
    write_record(folder, "a.json", entries)
    build(folder, tmp_path / "out")
    methods = pd.read_csv(tmp_path / "out" / GROUP / "methods.csv").set_index("method")
    assert methods.loc["dihal-chosen", "test_nll_mean"] == pytest.approx(3.25)
    assert methods.loc["dihal-chosen", "test_nll_n"] == 2 and methods.loc["ar-backbone", "test_nll_n"] == 0
    assert methods.loc["dihal-chosen", "test_nll_kind"] == "exact" and methods.loc["ar-backbone", "test_nll_kind"] == "—"
    assert "Test NLL ↓" in (tmp_path / "out" / GROUP / "methods.md").read_text()


def test_records_without_likelihoods_get_no_test_nll_column(results, tmp_path):
    build(results, tmp_path / "out")
    methods = pd.read_csv(tmp_path / "out" / GROUP / "methods.csv")
    assert not any(column.startswith("test_nll") for column in methods.columns)
