"""Bad input, battery style: every case through the command line, each refused before any work
with one ``Error:`` line, exit code 2, no traceback, and nothing written.

Every case here fails before a model is loaded (a plugin whose factory raises fails as its
model would load; the built-in backbones' weights cannot load while a case runs), so the whole
module takes seconds. A new bad input is one row of CASES:
its name, the command line, and (``says``) the words the error line starts with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from dihal_bench import hookimpl
from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import register_plugin, unregister_plugin
from dihal_bench.study.records import seal_record


def _boom(*args, **options):
    raise RuntimeError("boom: the plugin's own bug")


#: the depth and width ``shaped-bb`` describes
SHAPED = {"layers": 4, "width": 16}


class BoomPlugin:
    """A backbone and a corpus whose factories raise, as a broken third-party plugin's would, and
    ``shaped-bb``, whose factory raises too but whose ``describe`` and ``tokenizer`` hooks work:
    a check refused with its shape was made without building it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @hookimpl
    def register_backbones(self, register):
        register("boom-bb", _boom)
        register("shaped-bb", _boom, describe=lambda: dict(SHAPED), tokenizer=lambda: self.tokenizer)

    @hookimpl
    def register_corpora(self, register):
        register("boom-corpus", _boom)


def _bridge_checkpoint(folder: str, **meta) -> None:
    """A bridge.json in ``folder`` (weights are never reached: the description is refused)."""
    Path(folder).mkdir()
    described = {"name": "dihal-bridge", "config": {"width": 32}, "layer": 1, "backbone": "smollm2-135m",
                 "weights_sha256": "0" * 64}
    Path(folder, "bridge.json").write_text(json.dumps({**described, **meta}))


@pytest.fixture(scope="module")
def boom_plugin(char_tokenizer):
    """BoomPlugin registered for the whole module: a registry rebuild per case would cost more
    than all the cases together."""
    register_plugin(BoomPlugin(char_tokenizer), "boom-plugin")
    yield
    unregister_plugin("boom-plugin")


class _NoWeights:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise AssertionError("a bad-input case loaded model weights")


@pytest.fixture
def no_weights(monkeypatch):
    """Every built-in backbone (the embedded ones, their cache build, any Hugging Face model)
    loads its weights through this one call: a case that reaches it fails with that message."""
    import dihal_builtin.hf_backbone

    monkeypatch.setattr(dihal_builtin.hf_backbone, "AutoModelForCausalLM", _NoWeights)


@pytest.fixture
def workspace(tmp_path, monkeypatch, boom_plugin, no_weights) -> Path:
    """A working folder holding only the bad files the cases refer to; runs write under it."""
    monkeypatch.chdir(tmp_path)
    Path("binary.toml").write_bytes(b"\xff\xfe\x00 seeds = [0]\n\x9c")
    Path("string_seeds.toml").write_text('seeds = "x"\n')
    Path("string_tokens.toml").write_text('[locate]\ntokens = "abc"\n')
    Path("typo.toml").write_text('[locate]\ntokenz = 5\n')
    Path("axis_without_chosen.toml").write_text('[methods]\ndihal = ["worst"]\n[bridge]\nsteps_axis = [1, 8]\n')
    Path("a_file").write_text("not a folder\n")
    Path("bad_bridge_option.toml").write_text("[bridge.options]\nd_model = \"wide\"\n")
    Path("damaged.json").write_text('{"format": "dihal-bench/run-record/v1", "per_seed": [')
    Path("not_a_record.json").write_text("[1, 2, 3]\n")
    _bridge_checkpoint("empty_config", config={})
    _bridge_checkpoint("width_abc", config={"width": "abc"})
    _bridge_checkpoint("unknown_option", config={"width": 32, "nosuch": 1})
    _bridge_checkpoint("layer_text", layer="3")
    _bridge_checkpoint("no_sha256")
    _bridge_checkpoint("layer_999", layer=999)
    meta = json.loads(Path("no_sha256/bridge.json").read_text())
    del meta["weights_sha256"]
    Path("no_sha256/bridge.json").write_text(json.dumps(meta))
    # a sealed record whose gen_ppl was edited afterwards, alone in its folder
    Path("edited").mkdir()
    sealed = seal_record({"format": "dihal-bench/run-record/v2", "suite": "s", "metrics": {"gen_ppl": 66279.94}})
    Path("edited/r.json").write_text(json.dumps(sealed).replace("66279.94", "12.5"))
    # a job store another run holds: its lock file, locked for the test by the fixture below
    Path("busy/smoke/jobs").mkdir(parents=True)
    Path("busy/smoke/jobs/.lock").write_text("4242\n")
    return tmp_path


@pytest.fixture
def busy_store(workspace):
    """busy/smoke/jobs held as another run holds it (an flock on its .lock)."""
    import fcntl

    with (workspace / "busy/smoke/jobs/.lock").open("r") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


RUN = ("run", "--out", "out/runs", "--results", "out/results")


@dataclass(frozen=True)
class Case:
    """One bad input: the command line, the exit code and the words its one error line starts with."""

    args: tuple[str, ...]
    says: str
    exit_code: int


def refused(*args: str, says: str = "Error: ", exit_code: int = 2) -> Case:
    return Case(args, says, exit_code)


CASES = {
    # suite files
    "binary suite file": refused(*RUN, "--suite", "binary.toml"),
    "seeds a string in a file": refused(*RUN, "--suite", "string_seeds.toml"),
    "tokens a string in a file": refused(*RUN, "--suite", "string_tokens.toml"),
    "misspelt key in a file": refused(*RUN, "--suite", "typo.toml"),
    "a steps axis without DiHAL at ℓ*": refused(*RUN, "--suite", "axis_without_chosen.toml"),
    "unknown suite": refused(*RUN, "--suite", "nope"),
    # overrides
    "seeds not a list": refused(*RUN, "--suite", "smoke", "--set", "seeds=5"),
    "seeds empty": refused(*RUN, "--suite", "smoke", "--set", "seeds=[]"),
    "negative seed": refused(*RUN, "--suite", "smoke", "--seeds", "-1"),
    "seeds not integers": refused(*RUN, "--suite", "smoke", "--seeds", "a,b"),
    "tokens not a number": refused(*RUN, "--suite", "smoke", "--set", "locate.tokens=abc"),
    "steps not a number": refused(*RUN, "--suite", "smoke", "--set", "budget.steps=abc"),
    "steps not whole": refused(*RUN, "--suite", "smoke", "--set", "budget.steps=2.5"),
    "steps zero": refused(*RUN, "--suite", "smoke", "--set", "budget.steps=0"),
    "unknown budget key": refused(*RUN, "--suite", "smoke", "--set", "budget.stepz=3"),
    "unknown suite key": refused(*RUN, "--suite", "smoke", "--set", "sampling.temprature=1"),
    "not key=value": refused(*RUN, "--suite", "smoke", "--set", "budget.steps"),
    "empty dotted key": refused(*RUN, "--suite", "smoke", "--set", "budget..steps=3"),
    "top-p out of range": refused(*RUN, "--suite", "smoke", "--set", "sampling.top_p=2"),
    "temperature nan": refused(*RUN, "--suite", "smoke", "--set", "sampling.temperature=nan"),
    "learning rate infinite": refused(*RUN, "--suite", "smoke", "--set", "budget.lr=inf"),
    "sweep layer 0": refused(*RUN, "--suite", "smoke", "--set", "sweep.layers=[0]"),
    "automatic sweep of one layer": refused(*RUN, "--suite", "smoke", "--set", "sweep.layers=auto",
                                            "--set", "sweep.count=1"),
    "unknown DiHAL role": refused(*RUN, "--suite", "smoke", "--set", 'methods.dihal=["best"]'),
    "device unknown": refused(*RUN, "--suite", "smoke", "--set", "device=nosuch"),
    "device without CUDA": refused(*RUN, "--suite", "smoke", "--set", "device=cuda:7"),
    "dtype unknown": refused(*RUN, "--suite", "smoke", "--set", "dtype=float8"),
    # names, checked against the registry before anything loads
    "unknown backbone": refused(*RUN, "--suite", "smoke", "--backbone", "nosuch"),
    "unknown evaluator": refused(*RUN, "--suite", "smoke", "--evaluator", "nosuch"),
    "unknown corpus": refused(*RUN, "--suite", "smoke", "--corpus", "nosuch"),
    "unknown proxy": refused(*RUN, "--suite", "smoke", "--set", 'locate.proxies=["nosuch"]'),
    "unknown baseline": refused(*RUN, "--suite", "smoke", "--set", 'methods.baselines=["nosuch"]'),
    "unknown metric": refused(*RUN, "--suite", "smoke", "--set", 'metrics.names=["nosuch"]'),
    "unknown bridge": refused(*RUN, "--suite", "smoke", "--set", "bridge.name=nosuch"),
    # folders
    "results folder under a file": refused("run", "--suite", "smoke", "--out", "out/runs",
                                           "--results", "a_file/results"),
    "job store under a file": refused("run", "--suite", "smoke", "--out", "a_file/runs", "--results", "out/results"),
    # locate
    "locate: unknown device": refused("locate", "--device", "nosuch", "--out", "out/locate"),
    "locate: weight nan": refused("locate", "--weight", "effective_rank=nan", "--out", "out/locate"),
    "locate: weight of an unselected proxy": refused("locate", "--weight", "nosuch=2", "--out", "out/locate"),
    "locate: param of an unselected proxy": refused("locate", "--param", "nosuch.k=2", "--out", "out/locate"),
    "locate: param not a number": refused("locate", "--param", "local_curvature.k=abc", "--out", "out/locate"),
    "locate: negative seed": refused("locate", "--seed", "-1", "--out", "out/locate"),
    "locate: one token": refused("locate", "--tokens", "1", "--out", "out/locate"),
    "locate: unknown proxy": refused("locate", "--proxies", "nosuch", "--out", "out/locate"),
    "locate: no proxy": refused("locate", "--proxies", ",", "--out", "out/locate"),
    "locate: unknown preprocessing": refused("locate", "--preprocessing", "whiten", "--out", "out/locate"),
    "locate: unknown dtype": refused("locate", "--dtype", "float8", "--out", "out/locate"),
    "locate: unknown backbone": refused("locate", "--backbone", "nosuch", "--out", "out/locate"),
    "locate: output under a file": refused("locate", "--out", "a_file/locate"),
    # training commands share the suite parser
    "bridge train: layer 0": refused("bridge", "train", "--layer", "0", "--out", "out/bridge"),
    "bridge train: steps not a number": refused("bridge", "train", "--layer", "3", "--set", "budget.steps=abc",
                                                "--out", "out/bridge"),
    "bridge train: not a budget key": refused("bridge", "train", "--layer", "3", "--set", "sampling.samples=2",
                                              "--out", "out/bridge"),
    "bridge train: allowance not a number": refused("bridge", "train", "--layer", "3", "--set",
                                                    "budget.param_allowance=many", "--out", "out/bridge"),
    "bridge train: unknown suite": refused("bridge", "train", "--layer", "3", "--suite", "nope", "--out", "out/bridge"),
    "bridge train: zero epochs": refused("bridge", "train", "--layer", "3", "--epochs", "0", "--out", "out/bridge"),
    "sweep: unknown corpus": refused("sweep", "--corpus", "nosuch", "--out", "out/sweep"),
    "sweep: layers not integers": refused("sweep", "--layers", "a,b", "--out", "out/sweep"),
    "baseline train: unknown baseline": refused("baseline", "train", "nosuch", "--out", "out/baseline"),
    "baseline sample: nothing trained": refused("baseline", "sample", "sed", "--from", "out/nothing"),
    "generate: not a checkpoint": refused("generate", "--checkpoint", "out/nothing"),
    "generate: zero samples": refused("generate", "--checkpoint", "out/nothing", "-n", "0"),
    "generate: top-p above 1": refused("generate", "--checkpoint", "out/nothing", "--top-p", "1.5"),
    # tables and records
    "leaderboard: no records": refused("leaderboard", "--results", "out/nothing", "--out", "out/boards"),
    "leaderboard: unknown format": refused("leaderboard", "--results", ".", "--format", "pdf", "--out", "out/boards"),
    "leaderboard: only an edited record": refused(
        "leaderboard", "--results", "edited", "--out", "out/boards",
        says="Error: no intact run records in edited: r.json left out (edited or damaged)"),
    "lm-eval: damaged record": refused("lm-eval", "--record", "damaged.json", "--method", "ar-backbone"),
    "lm-eval: not a record": refused("lm-eval", "--record", "not_a_record.json", "--method", "ar-backbone"),
    "check: unknown backbone": refused("check", "backbone", "nosuch"),
    "check: unknown corpus": refused("check", "corpus", "nosuch"),
    # issue 24: plugins whose factory raises are named in one line
    "locate: backbone factory raises": refused(
        "locate", "--backbone", "boom-bb", "--out", "out/locate",
        says="Error: backbone 'boom-bb' from boom-plugin (not installed) failed: RuntimeError"),
    "locate: corpus factory raises": refused(
        "locate", "--corpus", "boom-corpus", "--out", "out/locate",
        says="Error: corpus 'boom-corpus' from boom-plugin (not installed) failed: RuntimeError"),
    "bridge train: backbone factory raises": refused(
        "bridge", "train", "--backbone", "boom-bb", "--layer", "3", "--out", "out/bridge",
        says="Error: backbone 'boom-bb' from boom-plugin"),
    "sweep: corpus factory raises": refused(
        "sweep", "--corpus", "boom-corpus", "--out", "out/sweep",
        says="Error: corpus 'boom-corpus' from boom-plugin"),
    "check: backbone factory raises": refused(
        "check", "backbone", "boom-bb",
        says="Error: backbone 'boom-bb' from boom-plugin"),
    "check: corpus factory raises": refused(
        "check", "corpus", "boom-corpus",
        says="Error: corpus 'boom-corpus' from boom-plugin"),
    "locate: missing corpus path": refused(
        "locate", "--corpus", "missing/x.txt", "--out", "out/locate",
        says="Error: corpus path missing/x.txt does not exist"),
    "run: missing corpus path": refused(
        "run", "--suite", "smoke", "--corpus", "missing/x.txt", "--out", "out/runs", "--results", "out/results",
        says="Error: corpus path missing/x.txt does not exist"),
    "bridge train: missing corpus path": refused(
        "bridge", "train", "--corpus", "missing/x.txt", "--layer", "3", "--out", "out/bridge",
        says="Error: corpus path missing/x.txt does not exist"),
    # issue 24: a Ray address that does not answer, refused in seconds before the store's lock
    "ray address refuses": refused(
        *RUN, "--suite", "smoke", "--executor", "ray", "--address", "127.0.0.1:1",
        says="Error: --address '127.0.0.1:1': no Ray cluster answers there"),
    "ray address not host:port": refused(
        *RUN, "--suite", "smoke", "--executor", "ray", "--address", "nowhere",
        says="Error: --address 'nowhere' is not host:port"),
    # issue 24: a second run on a store in use, refused before its models load
    "job store in use": refused(
        "run", "--suite", "smoke", "--out", "busy", "--results", "out/results",
        says="Error: job store busy/smoke/jobs is in use by another dihal-bench run (pid 4242)"),
    # issue 24: a checkpoint's bridge.json is checked before anything is built from it
    "generate: empty bridge config": refused(
        "generate", "--checkpoint", "empty_config",
        says="Error: empty_config/bridge.json: config: bridge 'dihal-bridge' needs option(s) width"),
    "generate: bridge width not a number": refused(
        "generate", "--checkpoint", "width_abc",
        says="Error: width_abc/bridge.json: config: option width of bridge 'dihal-bridge' must be int"),
    "generate: unknown bridge option": refused(
        "generate", "--checkpoint", "unknown_option",
        says="Error: unknown_option/bridge.json: config: bridge 'dihal-bridge' has no option 'nosuch'"),
    "generate: layer not an integer": refused(
        "generate", "--checkpoint", "layer_text",
        says="Error: layer_text/bridge.json is not a valid bridge description: 'layer'"),
    "generate: no weights sha256": refused(
        "generate", "--checkpoint", "no_sha256",
        says="Error: no_sha256/bridge.json records no weights_sha256"),
    "generate: temperature nan": refused(
        "generate", "--checkpoint", "no_sha256", "--temperature", "nan",
        says="Error: Invalid value for '--temperature': 'nan' is not a finite number"),
    "generate: top-p nan": refused(
        "generate", "--checkpoint", "no_sha256", "--top-p", "nan",
        says="Error: Invalid value for '--top-p': 'nan' is not a finite number"),
    "generate: seed beyond int64": refused(
        "generate", "--checkpoint", "no_sha256", "--seed", str(2**63),
        says="Error: Invalid value for '--seed'"),
    "lm-eval: checkpoint without sha256": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m,bridge=no_sha256",
        says="Error: no_sha256/bridge.json records no weights_sha256"),
    "lm-eval: checkpoint with a bad config": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m,bridge=width_abc",
        says="Error: width_abc/bridge.json: config: option width"),
    # issue 24: plugin options, checked against what the plugin declares
    "baseline train: option of the wrong type": refused(
        "baseline", "train", "sed", "--option", "embed_dim=abc", "--out", "out/baseline",
        says="Error: --option: option embed_dim of baseline 'sed' must be int"),
    "baseline train: unknown option": refused(
        "baseline", "train", "sed", "--option", "nosuch=1", "--out", "out/baseline",
        says="Error: --option: baseline 'sed' has no option 'nosuch'"),
    "bridge option unknown": refused(
        *RUN, "--suite", "smoke", "--set", "bridge.options.nosuch=1",
        says="Error: bridge.options: bridge 'dihal-bridge' has no option 'nosuch'"),
    "bridge option of the wrong type": refused(
        *RUN, "--suite", "smoke", "--set", "bridge.options.d_model=abc",
        says="Error: bridge.options: option d_model of bridge 'dihal-bridge' must be int"),
    "bridge train: bridge option in the suite file": refused(
        "bridge", "train", "--suite", "bad_bridge_option.toml", "--layer", "3", "--out", "out/bridge",
        says="Error: bridge.options: option d_model of bridge 'dihal-bridge' must be int, got 'wide'"),
    "bridge option nan": refused(
        *RUN, "--suite", "smoke", "--set", "bridge.options.sigma=nan",
        says="Error: bridge.options: option sigma of bridge 'dihal-bridge' must be finite"),
    # issue 24: integers beyond int64, which would overflow mid-run
    "seed beyond 64 bits": refused(
        *RUN, "--suite", "smoke", "--set", "seeds=[18446744073709551616]",
        says="Error: --set: seeds must be an integer >= 0 and <= 9223372036854775807"),
    "seed 1e300": refused(
        *RUN, "--suite", "smoke", "--set", "seeds=[1e300]",
        says="Error: --set: seeds must be an integer >= 0 and <= 9223372036854775807, got 1e+300"),
    "tokens beyond int64": refused(
        *RUN, "--suite", "smoke", "--set", "locate.tokens=1e30",
        says="Error: --set: locate.tokens must be an integer >= 2 and <="),
    "steps beyond int64": refused(
        *RUN, "--suite", "smoke", "--set", "budget.steps=1e30",
        says="Error: --set: budget.steps must be"),
    "drop_top beyond int64": refused(
        *RUN, "--suite", "smoke", "--set", "locate.drop_top=1e30",
        says="Error: --set: locate.drop_top must be an integer >= 0 and <="),
    "locate: seed beyond int64": refused(
        "locate", "--seed", str(2**63), "--out", "out/locate",
        says="Error: Invalid value for '--seed'"),
    # issue 24: numbers that every comparison lets through
    "check: tolerance nan": refused(
        "check", "backbone", "smollm2-135m", "--tolerance", "nan",
        says="Error: Invalid value for '--tolerance': 'nan' is not a finite number"),
    "check: tolerance inf": refused(
        "check", "backbone", "smollm2-135m", "--tolerance", "inf",
        says="Error: Invalid value for '--tolerance': 'inf' is not a finite number"),
    # issue 24: an output folder that cannot be written, refused before the evaluation
    "lm-eval: output under /proc": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m", "--out", "/proc/x",
        says="Error: cannot write to the output folder --out '/proc/x'"),
    "lm-eval: output under a file": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m", "--out", "a_file/x",
        says="Error: cannot write to the output folder --out 'a_file/x'"),
    # issue 24: what only the model or its data could refuse, refused from the backbone plugin's
    # describe and tokenizer hooks before any weights load (the built-in ones, and shaped-bb's)
    "run: tokens beyond the validation split": refused(
        *RUN, "--suite", "smoke", "--set", "locate.tokens=1000000000",
        says="Error: locate.tokens=1000000000 exceeds the "),
    "run: drop_top beyond the width": refused(
        *RUN, "--suite", "smoke", "--set", "locate.drop_top=100000",
        says="Error: locate.drop_top=100000 would remove every one of the 576 hidden dimensions"),
    "run: sweep layer beyond the backbone": refused(
        *RUN, "--suite", "smoke", "--set", "sweep.layers=[3, 999]",
        says="Error: layer 999 is out of range for smollm2-135m: choose 1..29 (30 layers)"),
    "run: steps the training split cannot feed": refused(
        *RUN, "--suite", "smoke", "--set", "budget.steps=1000000000",
        says="Error: budget needs 4,000,000,000 training sequences"),
    "run: shaped plugin, tokens beyond the validation split": refused(
        *RUN, "--suite", "smoke", "--backbone", "shaped-bb", "--set", "locate.tokens=1000000000",
        says="Error: locate.tokens=1000000000 exceeds the "),
    "run: shaped plugin, drop_top beyond the width": refused(
        *RUN, "--suite", "smoke", "--backbone", "shaped-bb", "--set", "locate.drop_top=16",
        says="Error: locate.drop_top=16 would remove every one of the 16 hidden dimensions"),
    "run: shaped plugin, sweep layer beyond it": refused(
        *RUN, "--suite", "smoke", "--backbone", "shaped-bb", "--set", "sweep.layers=[4]",
        says="Error: layer 4 is out of range for shaped-bb: choose 1..3 (4 layers)"),
    "bridge train: layer beyond the backbone": refused(
        "bridge", "train", "--layer", "999", "--out", "out/bridge",
        says="Error: layer 999 is out of range for smollm2-135m: choose 1..29 (30 layers)"),
    "bridge train: shaped plugin, layer beyond it": refused(
        "bridge", "train", "--backbone", "shaped-bb", "--layer", "4", "--out", "out/bridge",
        says="Error: layer 4 is out of range for shaped-bb: choose 1..3 (4 layers)"),
    "bridge train: steps the training split cannot feed": refused(
        "bridge", "train", "--layer", "3", "--set", "budget.steps=1000000000", "--out", "out/bridge",
        says="Error: budget needs "),
    "sweep: layer beyond the backbone": refused(
        "sweep", "--layers", "3,999", "--out", "out/sweep",
        says="Error: layer 999 is out of range for smollm2-135m"),
    "sweep: steps the training split cannot feed": refused(
        "sweep", "--set", "budget.steps=1000000000", "--out", "out/sweep", says="Error: budget needs "),
    "sweep: no layer": refused("sweep", "--layers", ",", "--out", "out/sweep", says="Error: --layers names no layer"),
    "baseline train: steps the training split cannot feed": refused(
        "baseline", "train", "sed", "--set", "budget.steps=1000000000", "--out", "out/baseline",
        says="Error: budget needs "),
    "baseline train: shaped plugin, steps its tokens cannot feed": refused(
        "baseline", "train", "sed", "--backbone", "shaped-bb", "--set", "budget.steps=1000000000",
        "--out", "out/baseline", says="Error: budget needs "),
    "locate: tokens beyond the validation split": refused(
        "locate", "--tokens", "1000000000", "--out", "out/locate",
        says="Error: --tokens=1000000000 exceeds the "),
    "locate: drop-top beyond the width": refused(
        "locate", "--drop-top", "100000", "--out", "out/locate",
        says="Error: --drop-top=100000 would remove every one of the 576 hidden dimensions"),
    "locate: gemma3 drop-top beyond its width": refused(
        "locate", "--backbone", "gemma3-270m", "--drop-top", "640", "--out", "out/locate",
        says="Error: --drop-top=640 would remove every one of the 640 hidden dimensions"),
    "locate: shaped plugin, tokens beyond the validation split": refused(
        "locate", "--backbone", "shaped-bb", "--tokens", "1000000000", "--out", "out/locate",
        says="Error: --tokens=1000000000 exceeds the "),
    "generate: checkpoint of a layer beyond its backbone": refused(
        "generate", "--checkpoint", "layer_999",
        says="Error: layer 999 is out of range for smollm2-135m"),
    "lm-eval: layer beyond the backbone": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m,layer=999",
        says="Error: layer 999 is out of range for smollm2-135m"),
    "lm-eval: device twice": refused(
        "lm-eval", "--model-args", "backbone=smollm2-135m,device=cpu", "--device", "cpu",
        says="Error: --device and device= in --model-args both say where to run"),
    # issue 25: --device and --dtype on every command that loads a model
    "bridge train: unknown device": refused(
        "bridge", "train", "--layer", "3", "--device", "nosuch", "--out", "out/bridge",
        says="Error: --device 'nosuch' is not a torch device"),
    "sweep: unknown dtype": refused("sweep", "--dtype", "float8", "--out", "out/sweep",
                                    says="Error: Invalid value for '--dtype'"),
    "baseline train: device without CUDA": refused(
        "baseline", "train", "sed", "--device", "cuda:7", "--out", "out/baseline",
        says="Error: --device 'cuda:7': "),
    "generate: unknown device": refused("generate", "--checkpoint", "layer_999", "--device", "nosuch",
                                        says="Error: --device 'nosuch' is not a torch device"),
    "check: unknown device": refused("check", "backbone", "smollm2-135m", "--device", "nosuch",
                                     says="Error: --device 'nosuch' is not a torch device"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_with_one_line_before_any_work(workspace, busy_store, name):
    before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
    case = CASES[name]
    result = CliRunner().invoke(cli, list(case.args))
    assert result.exit_code == case.exit_code, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(case.says), result.stderr
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


def test_shape_and_tokenizer_come_from_the_hooks_without_building_the_backbone(boom_plugin, char_tokenizer):
    from dihal_bench.registry.resolve import (
        backbone_tokenizer,
        describe_backbone,
        load_backbone,
    )

    shape = describe_backbone("shaped-bb")
    assert (shape.name, shape.num_layers, shape.width) == ("shaped-bb", SHAPED["layers"], SHAPED["width"])
    assert backbone_tokenizer("shaped-bb") is char_tokenizer
    assert describe_backbone("boom-bb") is None and backbone_tokenizer("boom-bb") is None  # checked after load
    with pytest.raises(DihalError, match="boom: the plugin's own bug"):  # the factory was never the source
        load_backbone("shaped-bb")


@pytest.mark.parametrize("described", [{"layers": 0, "width": 8}, {"layers": True, "width": 8}, {"layers": 3},
                                       [3, 8]])
def test_a_describe_hook_that_returns_nonsense_is_named(described):
    class Bad:
        @hookimpl
        def register_backbones(self, register):
            register("bad-shape", _boom, describe=lambda: described)

    from dihal_bench.registry.resolve import describe_backbone

    register_plugin(Bad(), "bad-shape-plugin")
    try:
        with pytest.raises(DihalError, match=r"^backbone 'bad-shape' from bad-shape-plugin \(not installed\): "
                                             r"describe returned"):
            describe_backbone("bad-shape")
    finally:
        unregister_plugin("bad-shape-plugin")
