"""Bad input, battery style: every case through the command line, each refused before any work
with one ``Error:`` line, exit code 2, no traceback, and nothing written.

Every case here fails before a model is loaded, so the whole module takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dihal_bench.cli import cli


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A working folder holding only the bad files the cases refer to; runs write under it."""
    monkeypatch.chdir(tmp_path)
    Path("binary.toml").write_bytes(b"\xff\xfe\x00 seeds = [0]\n\x9c")
    Path("string_seeds.toml").write_text('seeds = "x"\n')
    Path("string_tokens.toml").write_text('[locate]\ntokens = "abc"\n')
    Path("typo.toml").write_text('[locate]\ntokenz = 5\n')
    Path("axis_without_chosen.toml").write_text('[methods]\ndihal = ["worst"]\n[bridge]\nsteps_axis = [1, 8]\n')
    Path("a_file").write_text("not a folder\n")
    Path("damaged.json").write_text('{"format": "dihal-bench/run-record/v1", "per_seed": [')
    Path("not_a_record.json").write_text("[1, 2, 3]\n")
    return tmp_path


RUN = ("run", "--out", "out/runs", "--results", "out/results")

CASES = {
    # suite files
    "binary suite file": (*RUN, "--suite", "binary.toml"),
    "seeds a string in a file": (*RUN, "--suite", "string_seeds.toml"),
    "tokens a string in a file": (*RUN, "--suite", "string_tokens.toml"),
    "misspelt key in a file": (*RUN, "--suite", "typo.toml"),
    "a steps axis without DiHAL at ℓ*": (*RUN, "--suite", "axis_without_chosen.toml"),
    "unknown suite": (*RUN, "--suite", "nope"),
    # overrides
    "seeds not a list": (*RUN, "--suite", "smoke", "--set", "seeds=5"),
    "seeds empty": (*RUN, "--suite", "smoke", "--set", "seeds=[]"),
    "negative seed": (*RUN, "--suite", "smoke", "--seeds", "-1"),
    "seeds not integers": (*RUN, "--suite", "smoke", "--seeds", "a,b"),
    "tokens not a number": (*RUN, "--suite", "smoke", "--set", "locate.tokens=abc"),
    "steps not a number": (*RUN, "--suite", "smoke", "--set", "budget.steps=abc"),
    "steps not whole": (*RUN, "--suite", "smoke", "--set", "budget.steps=2.5"),
    "steps zero": (*RUN, "--suite", "smoke", "--set", "budget.steps=0"),
    "unknown budget key": (*RUN, "--suite", "smoke", "--set", "budget.stepz=3"),
    "unknown suite key": (*RUN, "--suite", "smoke", "--set", "sampling.temprature=1"),
    "not key=value": (*RUN, "--suite", "smoke", "--set", "budget.steps"),
    "empty dotted key": (*RUN, "--suite", "smoke", "--set", "budget..steps=3"),
    "top-p out of range": (*RUN, "--suite", "smoke", "--set", "sampling.top_p=2"),
    "temperature nan": (*RUN, "--suite", "smoke", "--set", "sampling.temperature=nan"),
    "learning rate infinite": (*RUN, "--suite", "smoke", "--set", "budget.lr=inf"),
    "sweep layer 0": (*RUN, "--suite", "smoke", "--set", "sweep.layers=[0]"),
    "automatic sweep of one layer": (*RUN, "--suite", "smoke", "--set", "sweep.layers=auto", "--set", "sweep.count=1"),
    "unknown DiHAL role": (*RUN, "--suite", "smoke", "--set", 'methods.dihal=["best"]'),
    "device unknown": (*RUN, "--suite", "smoke", "--set", "device=nosuch"),
    "device without CUDA": (*RUN, "--suite", "smoke", "--set", "device=cuda:7"),
    "dtype unknown": (*RUN, "--suite", "smoke", "--set", "dtype=float8"),
    # names, checked against the registry before anything loads
    "unknown backbone": (*RUN, "--suite", "smoke", "--backbone", "nosuch"),
    "unknown evaluator": (*RUN, "--suite", "smoke", "--evaluator", "nosuch"),
    "unknown corpus": (*RUN, "--suite", "smoke", "--corpus", "nosuch"),
    "unknown proxy": (*RUN, "--suite", "smoke", "--set", 'locate.proxies=["nosuch"]'),
    "unknown baseline": (*RUN, "--suite", "smoke", "--set", 'methods.baselines=["nosuch"]'),
    "unknown metric": (*RUN, "--suite", "smoke", "--set", 'metrics.names=["nosuch"]'),
    "unknown bridge": (*RUN, "--suite", "smoke", "--set", "bridge.name=nosuch"),
    # folders
    "results folder under a file": ("run", "--suite", "smoke", "--out", "out/runs", "--results", "a_file/results"),
    "job store under a file": ("run", "--suite", "smoke", "--out", "a_file/runs", "--results", "out/results"),
    # locate
    "locate: unknown device": ("locate", "--device", "nosuch", "--out", "out/locate"),
    "locate: weight nan": ("locate", "--weight", "effective_rank=nan", "--out", "out/locate"),
    "locate: weight of an unselected proxy": ("locate", "--weight", "nosuch=2", "--out", "out/locate"),
    "locate: param of an unselected proxy": ("locate", "--param", "nosuch.k=2", "--out", "out/locate"),
    "locate: param not a number": ("locate", "--param", "local_curvature.k=abc", "--out", "out/locate"),
    "locate: negative seed": ("locate", "--seed", "-1", "--out", "out/locate"),
    "locate: one token": ("locate", "--tokens", "1", "--out", "out/locate"),
    "locate: unknown proxy": ("locate", "--proxies", "nosuch", "--out", "out/locate"),
    "locate: no proxy": ("locate", "--proxies", ",", "--out", "out/locate"),
    "locate: unknown preprocessing": ("locate", "--preprocessing", "whiten", "--out", "out/locate"),
    "locate: unknown dtype": ("locate", "--dtype", "float8", "--out", "out/locate"),
    "locate: unknown backbone": ("locate", "--backbone", "nosuch", "--out", "out/locate"),
    "locate: output under a file": ("locate", "--out", "a_file/locate"),
    # training commands share the suite parser
    "bridge train: layer 0": ("bridge", "train", "--layer", "0", "--out", "out/bridge"),
    "bridge train: steps not a number": ("bridge", "train", "--layer", "3", "--set", "budget.steps=abc",
                                         "--out", "out/bridge"),
    "bridge train: not a budget key": ("bridge", "train", "--layer", "3", "--set", "sampling.samples=2",
                                       "--out", "out/bridge"),
    "bridge train: allowance not a number": ("bridge", "train", "--layer", "3", "--set",
                                             "budget.param_allowance=many", "--out", "out/bridge"),
    "bridge train: unknown suite": ("bridge", "train", "--layer", "3", "--suite", "nope", "--out", "out/bridge"),
    "bridge train: zero epochs": ("bridge", "train", "--layer", "3", "--epochs", "0", "--out", "out/bridge"),
    "sweep: unknown corpus": ("sweep", "--corpus", "nosuch", "--out", "out/sweep"),
    "sweep: layers not integers": ("sweep", "--layers", "a,b", "--out", "out/sweep"),
    "baseline train: unknown baseline": ("baseline", "train", "nosuch", "--out", "out/baseline"),
    "baseline sample: nothing trained": ("baseline", "sample", "sed", "--from", "out/nothing"),
    "generate: not a checkpoint": ("generate", "--checkpoint", "out/nothing"),
    "generate: zero samples": ("generate", "--checkpoint", "out/nothing", "-n", "0"),
    "generate: top-p above 1": ("generate", "--checkpoint", "out/nothing", "--top-p", "1.5"),
    # tables and records
    "leaderboard: no records": ("leaderboard", "--results", "out/nothing", "--out", "out/boards"),
    "leaderboard: unknown format": ("leaderboard", "--results", ".", "--format", "pdf", "--out", "out/boards"),
    "lm-eval: damaged record": ("lm-eval", "--record", "damaged.json", "--method", "ar-backbone"),
    "lm-eval: not a record": ("lm-eval", "--record", "not_a_record.json", "--method", "ar-backbone"),
    "check: unknown backbone": ("check", "backbone", "nosuch"),
    "check: unknown corpus": ("check", "corpus", "nosuch"),
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_bad_input_is_refused_with_one_line_before_any_work(workspace, args):
    before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    assert sorted(p.relative_to(workspace) for p in workspace.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("setting", ["budget.param_allowance=none", "budget.steps=1e2", "seeds=[0, 1]"])
def test_overrides_that_look_odd_but_are_valid_are_taken(workspace, setting):
    result = CliRunner().invoke(cli, ["run", "--suite", "smoke", "--set", setting, "--dry-run"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout.split("resolved config:\n", 1)[1].split("\n\n", 1)[0])
    key, _, _ = setting.partition("=")
    section, _, field = key.partition(".")
    value = config[section][field] if field else config[section]
    assert value == {"budget.param_allowance=none": None, "budget.steps=1e2": 100, "seeds=[0, 1]": [0, 1]}[setting]
