"""``dihal-bench run``: a whole suite, or its plan with ``--dry-run``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dihal_bench.cli.app import cli, parse_assignments, quiet_option
from dihal_bench.errors import DihalError


def resolved_suite(suite, backbone, corpus, evaluator, seeds, sets):
    """``--suite`` with the command line's overrides applied: (name, SuiteConfig)."""
    from dihal_bench.suite import apply_overrides, resolve_suite

    name, config = resolve_suite(suite)
    overrides = parse_assignments(sets, "--set")
    for key, value in (("backbone", backbone), ("corpus", corpus), ("evaluator", evaluator)):
        if value:
            overrides[key] = json.dumps(value)
    if seeds is not None:
        try:
            overrides["seeds"] = json.dumps([int(s) for s in seeds.split(",") if s.strip()])
        except ValueError:
            raise DihalError(f"--seeds {seeds!r} is not a comma-separated list of integers") from None
    return name, apply_overrides(config, overrides)


@cli.command()
@click.option("--suite", default="diagnostic", show_default=True, help="A suite name (see `dihal-bench suites`) or a TOML file.")
@click.option("--backbone", help="Override the suite's backbone.")
@click.option("--corpus", help="Override the suite's corpus.")
@click.option("--evaluator", help="Override the suite's evaluator LM (Gen.PPL, MAUVE features).")
@click.option("--seeds", help="Comma-separated seeds, e.g. 0,1,2.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any suite key, e.g. budget.steps=100.")
@click.option("--out", "out_root", type=click.Path(file_okay=False), default="runs", show_default=True,
              help="Where jobs (checkpoints, samples, partial results) are kept; reused on restart.")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="runs/results", show_default=True,
              help="Where the run record is written (the committed records in results/ are written only when "
                   "you name that folder).")
@click.option("--dry-run", is_flag=True, help="Print the resolved plan, the jobs and their estimated cost; run nothing.")
@quiet_option
def run(suite, backbone, corpus, evaluator, seeds, sets, out_root, results_dir, dry_run, quiet):
    """Run a whole suite: locate, sweep, DiHAL and every baseline, metrics, run record."""
    from dihal_bench.preflight import check_suite
    from dihal_bench.runner import run_suite

    name, config = resolved_suite(suite, backbone, corpus, evaluator, seeds, sets)
    if dry_run:
        check_suite(config, here=False)
        from dihal_bench.plan import format_plan

        click.echo(format_plan(name, config))
        return
    path = run_suite(name, config, out_root=Path(out_root), results_dir=Path(results_dir), progress=not quiet)
    click.echo(f"wrote run record {path}")
