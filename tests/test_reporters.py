"""Reporters (issue 41): a plugin kind that a finished run is handed to (``dihal-bench run --report-to
NAME``, none by default) with its params, metrics and artifacts; the built-in ``tensorboard`` one
writes an event file whose values are the record's own; an unknown name or a missing package stops
the command before any work; a failing reporter leaves the record and says so in one line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from test_leaderboard import record, seed_entry

from dihal_bench import hookimpl
from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import build_registry
from dihal_bench.study.records import write_record
from dihal_bench.study.preflight import check_reporters
from dihal_bench.study.reporting import flatten, report_run
from dihal_bench.study.sample_export import samples_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = {"backbone": "tiny", "seeds": [3], "budget": {"steps": 6, "batch_size": 4},
          "bridge": {"name": "dihal-bridge", "options": {}, "sink_passthrough": True},
          "metrics": {"names": ["gen_ppl", "mauve"], "mauve": False}}
#: CONFIG flattened, written out by hand
PARAMS = {"backbone": "tiny", "seeds": [3], "budget.steps": 6, "budget.batch_size": 4,
          "bridge.name": "dihal-bridge", "bridge.options": {}, "bridge.sink_passthrough": True,
          "metrics.names": ["gen_ppl", "mauve"], "metrics.mauve": False}
#: every numeric metric value of the record below, written out by hand: seed 3's DiHAL row (its
#: mauve None, mauve_warning text and per-sample list left out) and the backbone's
METRICS = {"seed3/dihal-chosen/gen_ppl": 12.25, "seed3/dihal-chosen/gen_ppl_sample_mean": 13.25,
           "seed3/dihal-chosen/entropy": 2.5, "seed3/dihal-chosen/diversity": 0.8, "seed3/dihal-chosen/mauve_n": 4,
           "seed3/ar-backbone@4x/gen_ppl": 50.0, "seed3/ar-backbone@4x/gen_ppl_sample_mean": 60.0,
           "seed3/ar-backbone@4x/entropy": 2.6, "seed3/ar-backbone@4x/diversity": 0.9}


@pytest.fixture
def written(tmp_path) -> Path:
    """A sealed record of one seed, with a per-sample list, a bool and a row at a budget scale."""
    entry = seed_entry(3, 12.25, 2, {1: 1.0, 2: 0.5}, 0.5)
    entry["methods"]["dihal-chosen"]["metrics"]["gen_ppl_nll_per_sample"] = [1.5, None, 2.0, 3.0]
    entry["methods"]["ar-backbone@4x"] = entry["methods"].pop("ar-backbone")
    entry["methods"]["ar-backbone@4x"]["metrics"]["lm_eval_done"] = True  # a bool is no metric value
    built = record([entry])
    built["config"] = CONFIG
    path = tmp_path / "results" / "diag-tiny-20261201T000000Z.json"
    write_record(path, built)
    return path


class Capture:
    """A reporter plugin that keeps every report it gets."""

    def __init__(self, name: str = "capture"):
        self.name, self.reports = name, []

    @hookimpl
    def register_reporters(self, register):
        register(self.name, self.reports.append, description="keeps what it gets")


def test_flatten_keeps_lists_and_empty_tables_as_values():
    assert flatten(CONFIG) == PARAMS
    assert flatten({"a": {"b": {"c": 1}}, "d": {}}) == {"a.b.c": 1, "d": {}}


def test_a_reporter_gets_the_records_params_metrics_and_artifacts(written, tmp_path, inline_plugin):
    capture = Capture()
    inline_plugin(capture, "capture-plugin")
    assert report_run(written, ["capture"], tmp_path / "runs") == ["capture"]
    samples_path(written).write_text("{}\n")  # now a samples file is beside the record
    assert report_run(written, ["capture", "capture"], tmp_path / "runs") == ["capture"]  # each name once
    first, second = capture.reports
    for report in (first, second):
        assert report.record_path == written
        assert report.record == json.loads(written.read_text()) and "integrity" in report.record  # as sealed
        assert report.params == PARAMS
        assert report.metrics == METRICS
        assert list(report.metrics) == list(METRICS)  # in the record's order
        assert report.out_dir == tmp_path / "runs" / "reports" / "capture"
    assert first.artifacts == {"record": written}
    assert second.artifacts == {"record": written, "samples": written.with_name(written.stem + ".samples.jsonl")}
    assert not (tmp_path / "runs").exists()  # the folder is the reporter's to create


def test_a_failing_reporter_leaves_the_record_and_warns_in_one_line(written, tmp_path, inline_plugin, capsys):
    def broken(report):
        report.record["suite"] = "edited"  # its edits reach no other reporter
        raise RuntimeError("tracker offline\nsecond line")

    capture = Capture()
    inline_plugin(SimpleNamespace(register_reporters=hookimpl(lambda register: register("broken", broken))),
                  "broken-plugin")
    inline_plugin(capture, "capture-plugin")
    before = written.read_bytes()
    capsys.readouterr()
    assert report_run(written, ["broken", "capture"], tmp_path / "runs") == ["capture"]
    assert written.read_bytes() == before
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (f"Warning: reporter 'broken' from broken-plugin (not installed) failed (RuntimeError: tracker "
                    f"offline second line); the record {written} is written")
    [report] = capture.reports
    assert report.record["suite"] == "diag"


def test_an_unknown_reporter_is_one_line_naming_the_known_ones(tmp_path, inline_plugin):
    inline_plugin(Capture(), "capture-plugin")
    result = CliRunner().invoke(cli, ["run", "--suite", "smoke", "--report-to", "tensorboard", "--report-to",
                                      "tensorbord", "--out", str(tmp_path / "runs"),
                                      "--results", str(tmp_path / "results")])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line == "Error: --report-to: unknown reporter 'tensorbord'; known: capture, tensorboard"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def test_a_missing_package_stops_the_run_before_it_starts(tmp_path, monkeypatch):
    # as if tensorboard were not installed: an import of None in sys.modules raises ImportError
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(DihalError, match=r"^reporter 'tensorboard' needs the tensorboard package"):
        check_reporters(["tensorboard"])
    for dry_run in ([], ["--dry-run"]):
        result = CliRunner().invoke(cli, ["run", "--suite", "smoke", "--report-to", "tensorboard", *dry_run,
                                          "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results")])
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("Error: reporter 'tensorboard' needs the tensorboard package, which is not installed")
        assert line.endswith("install the extra: pip install 'dihal-bench[tensorboard]'")
        assert result.stdout == ""  # not even a plan
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def test_a_check_that_raises_a_bug_is_one_line_naming_the_reporter(inline_plugin):
    def check():
        raise KeyError("token")

    plugin = SimpleNamespace(register_reporters=hookimpl(
        lambda register: register("picky", lambda report: None, check=check)))
    inline_plugin(plugin, "picky-plugin")
    with pytest.raises(DihalError) as raised:
        check_reporters(["picky"])
    assert str(raised.value) == "reporter 'picky' from picky-plugin (not installed): its check failed: KeyError: 'token'"


def test_the_tensorboard_reporter_writes_the_records_exact_values(written, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    samples_path(written).write_text("{}\n")
    assert report_run(written, ["tensorboard"], tmp_path / "runs") == ["tensorboard"]
    [logdir] = (tmp_path / "runs" / "reports" / "tensorboard").iterdir()
    assert logdir.name == written.stem and len(list(logdir.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert set(events.Tags()["tensors"]) == {*METRICS, "config/text_summary", "record/text_summary",
                                             "samples/text_summary"}

    def value(tag: str):
        [event] = events.Tensors(tag)
        return event.step, tensor_util.make_ndarray(event.tensor_proto)

    for tag, expected in METRICS.items():
        step, array = value(tag)
        assert (step, array.dtype.name, array.item()) == (0, "float64", expected), tag
    assert value("record/text_summary")[1].item().decode() == f"`{written}`"
    assert value("samples/text_summary")[1].item().decode() == f"`{samples_path(written)}`"
    table = value("config/text_summary")[1].item().decode().splitlines()
    assert table[2:] == [f"| `{key}` | `{json.dumps(v)}` |" for key, v in PARAMS.items()]

    hparams = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
               for tag, content in events.PluginTagToContent("hparams").items()}
    started = hparams["_hparams_/session_start_info"].session_start_info.hparams
    shown = {key: v.number_value if v.HasField("number_value") else v.string_value for key, v in started.items()}
    assert shown == {"backbone": "tiny", "seeds": "[3]", "budget.steps": 6, "budget.batch_size": 4,
                     "bridge.name": "dihal-bridge", "bridge.options": "{}", "bridge.sink_passthrough": "true",
                     "metrics.names": '["gen_ppl", "mauve"]', "metrics.mauve": "false"}
    experiment = hparams["_hparams_/experiment"].experiment
    assert [info.name.tag for info in experiment.metric_infos] == list(METRICS)


def test_plugins_lists_the_reporter_kind(inline_plugin):
    inline_plugin(Capture(), "capture-plugin")
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {(row["kind"], row["name"]): row for row in json.loads(result.stdout)["plugins"]}
    assert rows["reporter", "tensorboard"]["distribution"] == "dihal-bench"
    assert rows["reporter", "capture"]["plugin"] == "capture-plugin"
    text = CliRunner().invoke(cli, ["plugins"]).stdout
    assert any(line.split()[:2] == ["reporter", "tensorboard"] for line in text.splitlines())


@pytest.mark.parametrize(("registration", "reason"), [
    (("late", 42, {}), "reporter 'late': 42 is not callable"),
    (("late", lambda: None, {}), "reporter 'late': <lambda> cannot be called with one argument (the run's RunReport)"),
    (("late", lambda report, extra: None, {}),
     "reporter 'late': <lambda> cannot be called with one argument (the run's RunReport)"),
    (("late", print, {"check": True}),
     "reporter 'late': check=True is not a callable() -> None that raises DihalError when the reporter cannot run here"),
    (("late", print, {"on_error": "ignore"}),
     "reporter 'late': unknown meta key 'on_error' (allowed: description, check)"),
])
def test_a_registration_that_breaks_the_reporter_contract_fails_its_plugin(registration, reason):
    name, obj, meta = registration
    plugin = SimpleNamespace(register_reporters=hookimpl(lambda register: register(name, obj, **meta)))
    registry = build_registry(entry_points=[], extra_plugins=[("bad", plugin)])
    [failure] = registry.failures
    assert failure.reason == f"register_reporters: {reason}"
    assert registry.names("reporter") == []


def test_a_run_hands_its_written_record_and_samples_file_to_the_reporter(tiny_suite_file, tmp_path, inline_plugin):
    """The tiny suite, trimmed, end to end through the command: the reporter is called once, after the
    record and its samples file are written, with the record's own metrics."""
    seen = []

    def reporter(report):
        # what is on disk when the reporter is called
        seen.append((report, report.record_path.is_file(), samples_path(report.record_path).is_file()))

    inline_plugin(SimpleNamespace(register_reporters=hookimpl(lambda register: register("seen", reporter))),
                  "seen-plugin")
    result = CliRunner().invoke(cli, [
        "run", "--suite", str(tiny_suite_file), "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"),
        "--set", 'methods.dihal=["chosen"]', "--set", "methods.controls=[]", "--set", 'methods.references=["unigram"]',
        "--set", "methods.baselines=[]", "--set", "bridge.steps_axis=[]", "--report-to", "seen", "--quiet"])
    assert result.exit_code == 0, result.output
    [path] = (tmp_path / "results").glob("*.json")
    assert result.stdout.strip() == f"wrote run record {path}"
    [(report, record_there, samples_there)] = seen
    assert record_there and samples_there
    assert report.record_path == path and report.record == json.loads(path.read_text())
    assert report.artifacts == {"record": path, "samples": samples_path(path)}
    assert report.out_dir == tmp_path / "runs" / "reports" / "seen"
    [entry] = report.record["per_seed"]
    assert set(entry["methods"]) == {"dihal-chosen", "reference-unigram"}
    expected = {f"seed0/{method}/{name}": value for method, row in entry["methods"].items()
                for name, value in row["metrics"].items()
                if type(value) in (int, float) and math.isfinite(value)}
    assert report.metrics == expected
    assert {key.split("/")[1] for key in expected} == {"dihal-chosen", "reference-unigram"}
    assert report.params["budget.steps"] == 6 and report.params["methods.baselines"] == []
