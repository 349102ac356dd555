"""The ``dihal-bench`` command line: the group and its one-line errors in ``app``, one module per
command group (``catalog``: plugins, suites, check; ``locating``: locate; ``study``: run;
``training``: sweep, bridge, generate, baseline; ``tables``: leaderboard, lm-eval; ``sample_files``:
samples export)."""

# importing each command module registers its commands
from dihal_bench.cli import catalog, locating, sample_files, store, study, tables, training  # noqa: F401
from dihal_bench.cli.app import cli
from dihal_bench.cli.catalog import plugins, suites
from dihal_bench.cli.locating import locate
from dihal_bench.cli.study import run
from dihal_bench.cli.tables import leaderboard, lm_eval_cmd

__all__ = ["cli", "leaderboard", "lm_eval_cmd", "locate", "main", "plugins", "run", "suites"]


def main():
    cli(prog_name="dihal-bench")
