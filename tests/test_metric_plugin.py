"""A metric plugin from outside the package: one word in a suite runs it, and its column reaches
every leaderboard format. The built-in defaults come from the registry, not from a list in a core
module, and an outside plugin cannot join them."""

from __future__ import annotations

import csv

import pytest

from dihal_bench import hookimpl
from dihal_bench.config.suite import DEFAULTS, apply_overrides, load_suite_file
from dihal_bench.errors import DihalError
from dihal_bench.leaderboard import build_leaderboards
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.records import load_record
from dihal_bench.study.runner import run_suite

BUILTIN_DEFAULTS = ["gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity", "diversity_pooled", "mauve"]


def words_per_sample(samples, ctx) -> dict:
    """Mean whitespace words per sample: a metric whose value the test can compute by hand."""
    counts = [len(text.split()) for text in samples.texts]
    return {"words_per_sample": sum(counts) / len(counts), "words_per_sample_n": len(counts)}


class WordsPlugin:
    @hookimpl
    def register_metrics(self, register):
        # asks to be a default: an outside plugin must not change what built-in suites measure
        register("words_per_sample", words_per_sample, higher_is_better=None, display_name="Words/sample",
                 description="mean whitespace words per sample", default=True)


def test_default_stands_for_the_builtin_metrics_registered_as_default():
    assert DEFAULTS["metrics"]["names"] == ["default"]  # no core module lists built-in metric names
    assert get_registry().default_metrics() == BUILTIN_DEFAULTS


def test_an_outside_metric_is_one_word_and_never_a_default(inline_plugin, tmp_path):
    inline_plugin(WordsPlugin(), "words-plugin")
    suite = tmp_path / "s.toml"
    suite.write_text('backbone = "smollm2-135m"\ncorpus = "stdlib-docs"\n')
    config = load_suite_file(suite)
    assert list(config.metrics.names) == BUILTIN_DEFAULTS
    config = apply_overrides(config, {"metrics.names": '["default", "words_per_sample"]'})
    assert list(config.metrics.names) == [*BUILTIN_DEFAULTS, "words_per_sample"]
    # the same name twice runs once
    config = apply_overrides(config, {"metrics.names": '["default", "gen_ppl"]'})
    assert list(config.metrics.names) == BUILTIN_DEFAULTS


def test_a_default_flag_must_be_a_bool(inline_plugin):
    class Broken:
        @hookimpl
        def register_metrics(self, register):
            register("broken_default", words_per_sample, higher_is_better=None, default="yes")

    inline_plugin(Broken(), "broken-default")
    with pytest.raises(DihalError, match="default"):
        get_registry(refresh=True).get("metric", "broken_default")


def test_an_outside_metric_runs_in_a_suite_and_reaches_every_leaderboard(inline_plugin, tiny_suite_file, tmp_path):
    inline_plugin(WordsPlugin(), "words-plugin")
    config = apply_overrides(load_suite_file(tiny_suite_file), {"metrics.names": '["gen_ppl", "words_per_sample"]'})
    path = run_suite("tiny", config, out_root=tmp_path / "runs", results_dir=tmp_path / "results", progress=False)
    record = load_record(path)
    [seed] = record["per_seed"]
    for name, method in seed["methods"].items():
        texts = method["samples"]["examples"]
        assert method["metrics"]["words_per_sample"] > 0, name
        if len(texts) == method["metrics"]["words_per_sample_n"]:  # every sample is an example
            assert method["metrics"]["words_per_sample"] == pytest.approx(sum(len(t.split()) for t in texts) / len(texts))
    assert record["metrics"]["words_per_sample"]["display_name"] == "Words/sample"
    written = build_leaderboards(tmp_path / "results", tmp_path / "boards", formats=("md", "csv", "html"))
    tables = [p for p in written if p.stem.startswith("methods")]
    assert {p.suffix for p in tables} == {".md", ".csv", ".html"}
    for table in tables:  # its display name in the tables people read, its own name in the CSV
        assert ("words_per_sample" if table.suffix == ".csv" else "Words/sample") in table.read_text(encoding="utf-8")
    with next(p for p in tables if p.suffix == ".csv").open(newline="", encoding="utf-8") as f:
        assert "words_per_sample_mean" in next(csv.reader(f))
