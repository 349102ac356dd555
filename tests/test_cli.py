"""The command line through click's CliRunner: help, the plugin listing, one-line errors, checks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench import __version__, hookimpl
from dihal_bench.api.corpus import SPLITS
from dihal_bench.cli import cli

BUILTINS = {("backbone", "smollm2-135m"), ("backbone", "gemma3-270m"), ("backbone", "hf"), ("corpus", "stdlib-docs")}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_one_line_error(result: Result, exit_code: int, start: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), result.stderr


# --- help and the plugin listing -----------------------------------------------------------


def commands_in_help(output: str) -> set[str]:
    return {line.split()[0] for line in output.split("Commands:")[1].strip().splitlines()}


def test_help_lists_the_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "where should diffusion enter a pretrained language model?" in result.output
    assert {"check", "plugins"} <= commands_in_help(result.output)
    check = invoke("check", "--help")
    assert check.exit_code == 0
    assert {"backbone", "corpus"} <= commands_in_help(check.output)


def test_version():
    result = invoke("--version")
    assert (result.exit_code, result.output) == (0, f"dihal-bench, version {__version__}\n")


def test_plugins_table_lists_the_builtins():
    result = invoke("plugins")
    assert result.exit_code == 0 and result.stderr == ""
    rows = {tuple(line.split()[:2]): line for line in result.stdout.splitlines()[2:]}
    assert BUILTINS <= set(rows)
    assert f"dihal-bench {__version__}" in rows["backbone", "smollm2-135m"]
    # a built-in proxy says what it measures and which way is better, not only the direction
    assert "stable rank" in rows["proxy", "effective_rank"] and rows["proxy", "effective_rank"].endswith(
        "lower is better")


def test_plugins_json_parses_and_holds_the_builtins():
    result = invoke("plugins", "--json")
    assert result.exit_code == 0
    listing = json.loads(result.stdout)
    assert listing["failures"] == []
    builtins = [row for row in listing["plugins"] if (row["kind"], row["name"]) in BUILTINS]
    assert len(builtins) == len(BUILTINS)
    assert {(row["distribution"], row["version"]) for row in builtins} == {("dihal-bench", __version__)}
    assert all(row["description"] for row in builtins)


class ExplodingPlugin:
    @hookimpl
    def register_proxies(self, register):
        raise RuntimeError("boom")


def test_plugins_warns_about_a_failing_plugin_and_still_succeeds(inline_plugin):
    inline_plugin(ExplodingPlugin(), "exploding")
    result = invoke("plugins", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["failures"] == [
        {"plugin": "exploding", "distribution": None, "reason": "register_proxies: RuntimeError: boom"}
    ]
    assert result.stderr == (
        "Warning: plugin 'exploding' (no distribution) failed to load: register_proxies: RuntimeError: boom\n"
    )


# --- user errors are one line, exit code 2 ---------------------------------------------------


def test_unknown_backbone_is_one_line_exit_2():
    result = invoke("check", "backbone", "no-such-backbone")
    assert_one_line_error(result, 2, "Error: unknown backbone 'no-such-backbone'; known: ")
    assert "smollm2-135m" in result.stderr


def test_unknown_corpus_is_one_line_exit_2():
    result = invoke("check", "corpus", "no-such-corpus")
    assert_one_line_error(result, 2, "Error: unknown corpus 'no-such-corpus'; known: ")
    assert "stdlib-docs" in result.stderr


def test_debug_shows_the_traceback():
    result = invoke("--debug", "check", "corpus", "no-such-corpus")
    assert result.exit_code == 2
    assert result.stderr.startswith("Traceback")
    assert result.stderr.splitlines()[-1].startswith("Error: unknown corpus 'no-such-corpus'")


def test_unknown_dtype_is_one_line_exit_2(tiny_model_dir):
    result = invoke("check", "backbone", tiny_model_dir, "--dtype", "float64")
    assert_one_line_error(result, 2, "Error: Invalid value for '--dtype': 'float64' is not one of 'auto', 'float32'")


# --- check backbone --------------------------------------------------------------------------


def test_check_backbone_passes_on_a_local_model_directory(tiny_model_dir, tmp_path):
    report_path = tmp_path / "report.json"
    result = invoke("check", "backbone", tiny_model_dir, "--json", str(report_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{tiny_model_dir}: 4 layers, width 32, vocabulary 128, ")
    assert result.stdout.splitlines()[-1].startswith("PASS: worst relative difference ")
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    assert (report["name"], report["layers"], len(report["max_abs_diff"])) == (tiny_model_dir, 4, 5)


class OffByOne(HFBackbone):
    """Resumes one layer too high: the off-by-one that the check exists to catch."""

    def resume(self, hidden, layer, attention_mask=None, cache=None, position_offset=0):
        return super().resume(hidden, min(layer + 1, self.num_layers), attention_mask, cache, position_offset)


def test_check_backbone_fails_with_exit_1_on_a_wrong_resume(inline_plugin, tiny_models, char_tokenizer):
    class Plugin:
        @hookimpl
        def register_backbones(self, register):
            register("off-by-one", lambda device, dtype: OffByOne(tiny_models["llama"], char_tokenizer, "off-by-one"))

    inline_plugin(Plugin(), "off-by-one-plugin")
    result = invoke("check", "backbone", "off-by-one")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1].startswith("FAIL: worst relative difference ")


# --- check corpus ----------------------------------------------------------------------------

DOCUMENT_CHARS = 40


@pytest.fixture
def corpus_dir(tmp_path):
    """31 documents of exactly 40 ASCII characters: 30 lines of a .jsonl and one .txt file."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    texts = [f"Document {i:02d} is plain ASCII text.".ljust(DOCUMENT_CHARS, "!") for i in range(30)]
    lines = [json.dumps({"text": text}) for text in texts]
    (directory / "lines.jsonl").write_text("\n".join(lines) + "\n")
    (directory / "whole.txt").write_text("One text file is one document, as well.".ljust(DOCUMENT_CHARS, "!"))
    return directory


def split_table(output: str) -> dict[str, dict[str, int]]:
    """The per-split rows of ``check corpus`` output, as numbers."""
    lines = output.splitlines()
    header = next(line.split() for line in lines if line.split()[:1] == ["split"])
    return {
        fields[0]: {name: int(value.replace(",", "")) for name, value in zip(header[1:], fields[1:])}
        for fields in (line.split() for line in lines)
        if fields and fields[0] in SPLITS
    }


def test_check_corpus_counts_with_a_character_tokenizer(corpus_dir, tiny_model_dir):
    result = invoke("check", "corpus", str(corpus_dir), "--backbone", tiny_model_dir, "--seq-len", "16")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].endswith(f"(tokenizer: {tiny_model_dir}, T=16)")
    table = split_table(result.stdout)
    assert set(table) == set(SPLITS)
    assert sum(row["documents"] for row in table.values()) == 31
    for row in table.values():
        # one token per character; each 40-token document packs into 2 windows of 16
        assert row["characters"] == row["tokens"] == DOCUMENT_CHARS * row["documents"]
        assert row["sequences"] == 2 * row["documents"]
        assert row["packed_tokens"] == 16 * row["sequences"]


@pytest.mark.integration
def test_check_corpus_with_the_default_smollm2_tokenizer(corpus_dir):
    result = invoke("check", "corpus", str(corpus_dir), "--seq-len", "4")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].endswith("(tokenizer: smollm2-135m, T=4)")
    table = split_table(result.stdout)
    assert sum(row["documents"] for row in table.values()) == 31
    for row in table.values():
        if row["documents"]:
            # a subword tokenizer: fewer tokens than characters, but more than one per document
            assert row["documents"] < row["tokens"] < row["characters"]
            assert row["sequences"] >= row["documents"]  # every document has at least 4 tokens


def test_a_users_run_and_tables_never_default_to_the_committed_folders():
    """`results/` and `leaderboards/` hold the committed diagnostic record and its tables: a user's
    run must not be averaged into them unless the user names those folders (the publish step)."""
    from dihal_bench.cli import leaderboard, run

    defaults = {(command.name, p.name): p.default for command in (run, leaderboard) for p in command.params}
    # --results unset means <--out>/results (tests/test_runner.py runs it end to end): runs/results by default
    assert defaults["run", "results_dir"] is None and defaults["run", "out_root"] == "runs"
    assert defaults["leaderboard", "results_dir"] == "runs/results"
    assert defaults["leaderboard", "out_dir"] == "runs/leaderboards"


def test_baseline_sample_loads_the_backbone_the_baseline_was_trained_with(tiny_model_dir, encode_sentences,
                                                                          tmp_path, one_torch_thread):
    from dihal_builtin.baselines.ar_scratch import ARScratch

    from dihal_bench.registry.resolve import load_backbone
    from dihal_bench.training.budget import Budget

    backbone = load_backbone(tiny_model_dir)
    model = ARScratch(backbone, Budget(steps=2, batch_size=4, seq_len=8, lr=1e-3, epochs=2, seed=0), seed=0,
                      d_model=16, layers=1, heads=2)
    model.fit(encode_sentences(["cats run"], copies=4), progress=False)
    model.save(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "baseline.json").read_text())["backbone"] == backbone.name

    result = invoke("baseline", "sample", "ar-scratch", "--from", str(tmp_path), "-n", "2", "--seq-len", "4",
                    "--quiet")  # no --backbone: the tiny model it was trained with, not smollm2-135m
    assert result.exit_code == 0, result.output
    assert "--- ar-scratch sample 1 ---" in result.output


def test_bridge_train_takes_its_evaluation_windows_from_the_suite_it_names(tiny_suite_file, tmp_path, one_torch_thread):
    out = tmp_path / "bridge"
    result = invoke("bridge", "train", "--suite", str(tiny_suite_file), "--layer", "1", "--out", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "train.json").read_text())["eval_sequences"] == 4  # the tiny suite's, not a CLI default
