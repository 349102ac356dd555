"""``dihal-bench run``: a whole suite, or its plan with ``--dry-run``."""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager
from pathlib import Path

import click

from dihal_bench.cli.app import cli, parse_assignments, quiet_option
from dihal_bench.config.suite import AUTO, DTYPES
from dihal_bench.errors import DihalError


def resolved_suite(suite, backbone, corpus, evaluator, seeds, sets, device=None, dtype=None):
    """``--suite`` with the command line's overrides applied: (name, SuiteConfig)."""
    from dihal_bench.config.suite import apply_overrides, resolve_suite

    name, config = resolve_suite(suite)
    overrides = parse_assignments(sets, "--set")
    for key, value in (("backbone", backbone), ("corpus", corpus), ("evaluator", evaluator),
                       ("device", device), ("dtype", dtype)):
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
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default=None,
              show_default="<--out>/results",
              help="Where the run record is written, beside its job store unless named (the committed records "
                   "in results/ are written only when you name that folder).")
@click.option("--dry-run", is_flag=True, help="Print the resolved plan, the jobs and their estimated cost; run nothing.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: every unit in order in this process. ray: the independent units of each stage in "
                   "parallel on Ray actors (extra [ray]); --out must then be a path every Ray worker sees.")
@click.option("--address", help="With --executor ray: the Ray cluster to join (`ray start --head` prints it); "
                                "without it a local Ray instance is started and stopped.")
@click.option("--workers", type=click.IntRange(min=1),
              help="With --executor ray: how many actors (1 CPU each, or 1 GPU each on cuda); default: as many "
                   "as the cluster holds, up to the widest stage.")
@click.option("--gpus", type=click.IntRange(min=1),
              help="With --dry-run --executor ray: also print the schedule over this many devices (GPUs on a "
                   "cuda suite, else CPU workers): jobs per stage, critical path, device-hours, memory per job.")
@click.option("--device", help="cpu, cuda, cuda:1, mps, or auto (the suite's default: CUDA, else MPS, else CPU).")
@click.option("--dtype", type=click.Choice((AUTO, *DTYPES)),
              help="auto (the suite's default): bfloat16 on a GPU that computes in it, else float32.")
@click.option("--calibrate", is_flag=True,
              help="Load the models and time a few steps on this machine (seconds) first, so the estimate "
                   "(and the progress bar's ETA) uses measured rates instead of assumed ones.")
@click.option("--report-to", "report_to", multiple=True, metavar="NAME",
              help="Hand the written record (params, metrics, artifacts) to this reporter; repeatable, none by "
                   "default. tensorboard (extra [tensorboard]) writes <--out>/reports/tensorboard/<record stem>/; "
                   "`dihal-bench plugins` lists the reporters.")
@click.option("--accept-inexact-remakes", "inexact_remakes", is_flag=True,
              help="A pruned store's artifact made again on another machine may differ in its last bits "
                   "(float rounding): put it back, listed in its job's remade.json, instead of stopping "
                   "(docs/method.md#pruned-job-stores).")
@quiet_option
def run(suite, backbone, corpus, evaluator, seeds, sets, out_root, results_dir, dry_run, executor, address,
        workers, gpus, device, dtype, calibrate, report_to, inexact_remakes, quiet):
    """Run a whole suite: locate, sweep, DiHAL and every baseline, metrics, run record.

    A run prints where it runs and its estimate first (--calibrate: timed on this machine); Ctrl-C
    stops it with the command that resumes it (finished jobs are kept in --out).

    With --executor ray the job store (--out) must be on a filesystem every Ray worker mounts at the
    same path (docs/executors.md)."""
    from dihal_bench.config.suite import check_scorer, resolved_config
    from dihal_bench.study.executors import make_executor
    from dihal_bench.study.preflight import check_store_free, check_suite
    from dihal_bench.study.runner import run_suite

    name, config = resolved_suite(suite, backbone, corpus, evaluator, seeds, sets, device, dtype)
    config = resolved_config(config)
    check_scorer(config, f"suite {name}")
    if gpus is not None and not (dry_run and executor == "ray"):
        raise DihalError("--gpus plans a schedule: use it with --dry-run --executor ray (a run uses the "
                         "cluster's devices; --workers caps the actors)")
    # a plan needs no Ray (the schedule of a cluster can be read on a laptop); a run needs its executor
    chosen = None
    if executor == "local" or not dry_run:
        chosen = make_executor(executor, address=address, workers=workers)
    if dry_run:
        check_suite(config, here=calibrate, reporters=report_to)
        from dihal_bench.study.estimate import format_plan, format_schedule
        from dihal_bench.study.store_probe import done_units

        throughput = measured_throughput(name, config, out_root) if calibrate else None
        click.echo(format_plan(name, config, throughput, done=done_units(name, config, out_root)))
        if gpus is not None:
            click.echo("\n" + format_schedule(name, config, gpus, throughput))
        return
    # beside the store by default: a run moved elsewhere with --out takes its record with it
    results_dir = Path(out_root) / "results" if results_dir is None else Path(results_dir)
    check_suite(config, folders={"job store": Path(out_root), "results folder": results_dir},
                here=chosen.computes_here, reporters=report_to)
    check_store_free(Path(out_root) / name / "jobs")  # the store run_suite locks, before its models load
    with sigterm_interrupts():
        path = run_suite(name, config, out_root=Path(out_root), results_dir=Path(results_dir), progress=not quiet,
                         executor=chosen, report=None if quiet else (lambda line: click.echo(line, err=True)),
                         calibrate=calibrate, report_to=report_to, inexact_remakes=inexact_remakes)
    click.echo(f"wrote run record {path}")


def measured_throughput(name, config, out_root):
    """``--dry-run --calibrate``: the rates measured on the suite's models, loaded as a run loads them."""
    from dihal_bench.study.calibration import calibrate_run
    from dihal_bench.study.run import Run

    return calibrate_run(Run(name, config, Path(out_root), progress=False))


@contextmanager
def sigterm_interrupts():
    """SIGTERM (a scheduler's or ``kill``'s stop) ends a run as Ctrl-C does: with what is done and how
    to resume, instead of Python's silent default exit."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: the signal stays the embedding program's
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
