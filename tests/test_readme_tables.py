"""The generated tables of the README and docs/results.md come from the committed records (``leaderboard
--readme``, once per file): stale ones fail here, every text that holds a block is one the publish step
names, a block naming no leaderboard group is refused before anything is written, and a new seed in the
records changes the table."""

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
from dihal_bench.leaderboard.readme import (
    BLOCK,
    PUBLISH_COMMAND,
    PUBLISHED_TEXTS,
    embed_results,
    embed_texts,
    has_blocks,
)

ROOT = Path(__file__).resolve().parent.parent
RIVALS = "rivals-smollm2-135m-gemma3-270m"


def quiet(_message: str) -> None:
    pass


def nothing_in(folder: Path) -> bool:
    """No file written under ``folder`` (the publish lock may leave the folder itself)."""
    return not folder.exists() or not any(path.is_file() for path in folder.rglob("*"))


def texts_with_blocks() -> list[str]:
    """Every Markdown text of the project that holds a generated block, relative to the root."""
    found = [path for pattern in ("*.md", "docs/**/*.md") for path in ROOT.glob(pattern)]
    return sorted(path.relative_to(ROOT).as_posix() for path in found if has_blocks(path.read_text(encoding="utf-8")))


def test_every_text_with_generated_blocks_is_published():
    assert texts_with_blocks() == sorted(PUBLISHED_TEXTS)
    for name in ("README.md", "docs/results.md"):  # where a reader is told how to refresh them
        assert PUBLISH_COMMAND in (ROOT / name).read_text(encoding="utf-8"), name


def test_the_generated_tables_are_the_ones_the_committed_records_give():
    texts = {name: (ROOT / name).read_text(encoding="utf-8") for name in PUBLISHED_TEXTS}
    folders = {block["folder"] for text in texts.values() for block in BLOCK.finditer(text)}
    assert {"diagnostic-smollm2-135m-gemma3-270m", RIVALS} <= folders
    assert "ladder-smollm2-135m-gemma3-270m" in {block["folder"] for block in BLOCK.finditer(texts["README.md"])}
    refreshed = embed_texts(texts, read_groups(ROOT / "results", quiet))
    for name, text in texts.items():
        assert refreshed[name] == text, f"{name}: generated tables are stale: run `{PUBLISH_COMMAND}`"


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
    assert readme.read_text(encoding="utf-8") == stale and nothing_in(tmp_path / "other")
    with pytest.raises(DihalError, match="no run record makes that leaderboard group"):
        embed_results(stale, read_groups(results, quiet))
    # a block naming a table its group lacks (the rivals suite has no sampling-steps axis)
    lacking = before + f"<!-- results:{RIVALS}/steps:start -->\n<!-- results:{RIVALS}/steps:end -->\n"
    with pytest.raises(DihalError, match=f"results:{RIVALS}/steps: that group has no 'steps' table"):
        embed_results(lacking, read_groups(results, quiet))


def test_a_block_can_hold_a_groups_whole_steps_table():
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    steps = [block for block in BLOCK.finditer(results) if block["table"] == "steps"]
    assert steps and "| 4 (the suite’s)" in steps[0][0]


def test_one_publish_refreshes_the_blocks_of_several_texts_and_refuses_a_text_without_any(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    record = next((ROOT / "results").glob("rivals-*.json"))
    shutil.copy(record, results / record.name)
    front, longer, plain = tmp_path / "README.md", tmp_path / "results.md", tmp_path / "notes.md"
    front.write_text(f"{START_MARKER}\nstale claims\n{END_MARKER}\n", encoding="utf-8")
    longer.write_text(f"<!-- results:{RIVALS}:start -->\nstale rows\n<!-- results:{RIVALS}:end -->\n"
                      f"{START_MARKER}\nstale claims\n{END_MARKER}\n", encoding="utf-8")
    plain.write_text("no generated block here\n", encoding="utf-8")
    runner = CliRunner()
    command = ["leaderboard", "--results", str(results), "--out", str(tmp_path / "boards"), "--format", "md"]
    done = runner.invoke(cli, [*command, "--readme", str(front), "--readme", str(longer)])
    assert done.exit_code == 0, done.output
    first, second = front.read_text(encoding="utf-8"), longer.read_text(encoding="utf-8")
    assert "stale" not in first + second and "| ar-lora " in second
    claims = first[first.index(START_MARKER):]
    assert claims in second and "fine-tuned autoregressively with LoRA" in claims  # one claims table, in both

    refused = runner.invoke(cli, [*command[:3], "--out", str(tmp_path / "other"), "--format", "md",
                                  "--readme", str(front), "--readme", str(plain)])
    assert refused.exit_code == 2 and "notes.md: it holds no generated block" in refused.output
    assert nothing_in(tmp_path / "other") and front.read_text(encoding="utf-8") == first
