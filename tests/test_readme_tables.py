"""The README's result tables are generated from the committed records (``leaderboard --readme``):
stale ones fail here, a block naming no leaderboard group is refused before anything is written, and
a new seed in the records changes the table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.claims import END_MARKER, START_MARKER
from dihal_bench.leaderboard.read import read_groups
from dihal_bench.leaderboard.readme import BLOCK, embed_results

ROOT = Path(__file__).resolve().parent.parent
RIVALS = "rivals-smollm2-135m-gemma3-270m"


def quiet(_message: str) -> None:
    pass


def test_the_readmes_result_tables_are_the_ones_the_committed_records_give():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    folders = [block["folder"] for block in BLOCK.finditer(readme)]
    assert {"diagnostic-smollm2-135m-gemma3-270m", RIVALS} <= set(folders)
    assert embed_results(readme, read_groups(ROOT / "results", quiet)) == readme, \
        "README result tables are stale: run `dihal-bench leaderboard --results results --out leaderboards --readme README.md`"


def test_leaderboard_readme_fills_each_block_and_refuses_one_without_records(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    record = next((ROOT / "results").glob("rivals-*.json"))
    shutil.copy(record, results / record.name)
    readme = tmp_path / "README.md"
    blank = (f"intro\n<!-- results:{RIVALS}:start -->\nstale rows\n<!-- results:{RIVALS}:end -->\n"
             f"{START_MARKER}\nstale claims\n{END_MARKER}\n")
    readme.write_text(blank, encoding="utf-8")
    runner = CliRunner()
    done = runner.invoke(cli, ["leaderboard", "--results", str(results), "--out", str(tmp_path / "boards"),
                               "--format", "md", "--readme", str(readme)])
    assert done.exit_code == 0, done.output
    text = readme.read_text(encoding="utf-8")
    assert "stale" not in text and "| ar-lora " in text and "(no std over seeds)" in text
    assert "fine-tuned autoregressively with LoRA" in text  # the claims table, from the same records

    # a second seed of the same configuration: the table pools it and says n = 2
    second = json.loads(record.read_text(encoding="utf-8"))
    second["seeds"] = [2]
    for entry in second["per_seed"]:
        entry["seed"] = 2
    second.pop("integrity", None)
    (results / "rivals-second-seed.json").write_text(json.dumps(second), encoding="utf-8")
    again = runner.invoke(cli, ["leaderboard", "--results", str(results), "--out", str(tmp_path / "boards"),
                                "--format", "md", "--readme", str(readme)])
    assert again.exit_code == 0, again.output
    assert "over n = 2 seeds" in readme.read_text(encoding="utf-8")

    # a block naming a group no record makes: one line, nothing written
    before = readme.read_text(encoding="utf-8")
    readme.write_text(before + "<!-- results:nowhere:start -->\n<!-- results:nowhere:end -->\n", encoding="utf-8")
    stale = readme.read_text(encoding="utf-8")
    refused = runner.invoke(cli, ["leaderboard", "--results", str(results), "--out", str(tmp_path / "other"),
                                  "--format", "md", "--readme", str(readme)])
    assert refused.exit_code == 2 and "results:nowhere" in refused.output
    assert readme.read_text(encoding="utf-8") == stale and not (tmp_path / "other").exists()
    with pytest.raises(DihalError, match="no run record makes that leaderboard group"):
        embed_results(stale, read_groups(results, quiet))
    # a block naming a table its group lacks (the rivals suite has no sampling-steps axis)
    lacking = before + f"<!-- results:{RIVALS}/steps:start -->\n<!-- results:{RIVALS}/steps:end -->\n"
    with pytest.raises(DihalError, match=f"results:{RIVALS}/steps: that group has no 'steps' table"):
        embed_results(lacking, read_groups(results, quiet))


def test_a_block_can_hold_a_groups_whole_steps_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    steps = [block for block in BLOCK.finditer(readme) if block["table"] == "steps"]
    assert steps and "| 4 (the suite’s)" in steps[0][0]
