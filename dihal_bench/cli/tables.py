"""Publishing: ``dihal-bench leaderboard``, ``dihal-bench claims`` and ``dihal-bench lm-eval``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dihal_bench.cli.app import (
    SEED,
    chosen_device,
    cli,
    model_options,
    parse_assignments,
)
from dihal_bench.errors import DihalError

#: ``--bootstrap-iters``' default: `dihal_bench.lm_eval.BOOTSTRAP_ITERS` (not imported here: that
#: imports lm-eval, seconds the other commands should not wait)
LM_EVAL_BOOTSTRAP_ITERS = 1000


@cli.command()
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="runs/results", show_default=True,
              help="Run records to read (the committed ones: results).")
@click.option("--format", "formats", default="md,csv,html,latex", show_default=True,
              help="Any of md, csv, html, latex; html also writes leaderboard.png, drawn from the same tables.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/leaderboards", show_default=True,
              help="Where the tables go (the committed ones: leaderboards).")
@click.option("--readme", "readmes", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="Also rewrite this file's generated blocks from the same records (give it once per file): "
                   "each <!-- results:GROUP:start --> … <!-- results:GROUP:end --> with that group's compact "
                   "methods table, and the claims table between <!-- claims:start --> and <!-- claims:end -->.")
def leaderboard(results_dir, formats, out_dir, readmes):
    """Aggregate run records (mean ± std over seeds; pooled permutation and Holm p-values for the
    rank statistics) into method, sampling-steps, layer and proxy tables, the page and its picture.

    Publishing the committed tables is `dihal-bench leaderboard --results results --out leaderboards
    --readme README.md --readme docs/results.md`."""
    from dihal_bench.leaderboard import publish
    from dihal_bench.study.preflight import check_writable

    if not Path(results_dir).is_dir():
        raise DihalError(f"no run records: {results_dir!r} is not a folder (run `dihal-bench run` first)")
    unknown = {f.strip() for f in formats.split(",")} - {"md", "csv", "html", "latex"}
    if unknown:
        raise DihalError(f"--format {', '.join(sorted(unknown))}: not one of md, csv, html, latex")
    check_writable(Path(out_dir), "output folder --out")

    def warn(message: str) -> None:
        click.echo(f"Warning: {message}", err=True)

    # atomic publish (docs/faults.md): the READMEs last, one publisher per --out folder
    paths, texts = publish(Path(results_dir), Path(out_dir), tuple(f.strip() for f in formats.split(",")),
                           [Path(readme) for readme in readmes], warn=warn)
    click.echo(f"wrote {len(paths)} files to {out_dir}")
    for readme in texts:
        click.echo(f"wrote the generated tables into {readme}")


@cli.command()
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="results", show_default=True,
              help="Run records to read (pooled as the leaderboard pools them).")
@click.option("--readme", type=click.Path(dir_okay=False, exists=True),
              help="Write the table into this file between its <!-- claims:start --> and <!-- claims:end --> markers "
                   "(and its summary, claims and verdicts, between <!-- claims:summary:start --> and "
                   "<!-- claims:summary:end -->) instead of printing it.")
def claims(results_dir, readme):
    """The paper's claims as a Markdown table: measurement, decision rule, interval and verdict from
    the run records (rules: docs/method.md#claims-and-decision-rules)."""
    from dihal_bench.base.files import write_bytes_atomic
    from dihal_bench.leaderboard.claims import claims_of, embed, render

    if not Path(results_dir).is_dir():
        raise DihalError(f"no run records: {results_dir!r} is not a folder")
    rows = claims_of(Path(results_dir), warn=lambda message: click.echo(f"Warning: {message}", err=True))
    if readme is None:
        click.echo(render(rows))
        return
    text = Path(readme).read_text(encoding="utf-8")
    write_bytes_atomic(Path(readme), embed(text, rows).encode("utf-8"))
    click.echo(f"wrote the claims table into {readme}")


def _check_model_args(model_args: str, trust_unverified: bool) -> dict[str, str]:
    """The backbone, layer and bridge checkpoint that ``--model-args`` name, checked before lm-eval
    (seconds to import and index its tasks) and any model load; lm-eval parses the string itself.
    Returns the pairs."""
    from dihal_bench.hybrid.checkpoint import read_bridge_meta
    from dihal_bench.registry.resolve import describe_backbone
    from dihal_bench.study.preflight import check_backbone_name

    pairs = parse_assignments([part for part in model_args.split(",") if part.strip()], "--model-args")
    if "backbone" in pairs:
        check_backbone_name(pairs["backbone"], "--model-args backbone")
    if "bridge" in pairs:
        read_bridge_meta(Path(pairs["bridge"]), trust_unverified=trust_unverified)
    if "backbone" in pairs and pairs.get("layer", "").isdigit():
        shape = describe_backbone(pairs["backbone"])
        if shape is not None:
            shape.check_layer(int(pairs["layer"]))
    return pairs


def _with_device(model_args: str, pairs: dict[str, str], device: str, dtype: str) -> str:
    """``--model-args`` with the command's device and dtype, unless it sets its own and the
    command line does not (lm-eval's ``device=``/``dtype=`` keep working); both at once is refused."""
    context = click.get_current_context()
    for key, value in (("device", device), ("dtype", dtype)):
        given = context.get_parameter_source(key) is not click.core.ParameterSource.DEFAULT
        if key in pairs and given:
            raise DihalError(f"--{key} and {key}= in --model-args both say where to run: give one")
        if key not in pairs:
            model_args = f"{model_args},{key}={value}"
    return model_args


def _quiet_loading(quiet: bool) -> bool:
    if quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    return quiet


@cli.command("lm-eval")
@click.option("--model-args", help="backbone=NAME[,layer=L,bridge=CHECKPOINT_DIR,steps=K,max_length=N]")
@click.option("--record", "record_path", type=click.Path(dir_okay=False, exists=True),
              help="Instead of --model-args: evaluate METHOD of this run record and add the results to it.")
@click.option("--method", help="With --record: the intact-backbone baseline's name or a dihal-* method.")
@click.option("--seed", type=SEED, help="With --record: which seed's model (default: the first).")
@click.option("--tasks", default="dihal-local", show_default=True,
              help="Comma-separated lm-eval tasks; dihal-local = rolling perplexity on the corpus's test split.")
@click.option("--corpus", help="Corpus of the dihal-local task (default: the record's, else stdlib-docs).")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many documents per task.")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write lm_eval.json here (metrics with their standard errors), and the sample logs.")
@click.option("--bootstrap-iters", type=click.IntRange(min=0), default=LM_EVAL_BOOTSTRAP_ITERS, show_default=True,
              help="Resamples for the standard errors lm-eval bootstraps (perplexity, median, F1, BLEU...; "
                   "acc-like means get theirs in closed form); 0: no standard errors at all.")
@click.option("--log-samples/--no-log-samples", default=True, show_default=True,
              help="With --out: also write lm-eval's per-document records (doc, arguments, resps, "
                   "filtered_resps, per-document metric values) to samples_<task>.jsonl, one file per task.")
@click.option("--trust-unverified", is_flag=True,
              help="Load a bridge checkpoint whose bridge.json records no weights_sha256 (its weights unverified).")
@model_options(from_suite=False)
@click.option("--quiet", is_flag=True, callback=lambda ctx, param, quiet: _quiet_loading(quiet),
              help="No progress bars while the models load (lm-eval's own bars stay).")
def lm_eval_cmd(model_args, record_path, method, seed, tasks, corpus, limit, batch_size, out_dir, bootstrap_iters,
                log_samples, trust_unverified, device, dtype, quiet):
    """Evaluate the backbone or a DiHAL hybrid with lm-evaluation-harness (needs dihal-bench[lm-eval]).

    Prints each task's metrics, each followed by its standard error (<metric>_stderr) where lm-eval
    gives one; --out writes them to lm_eval.json and, unless --no-log-samples, each task's
    per-document records to samples_<task>.jsonl beside it."""
    from dihal_bench import lm_eval as lm_eval_adapter
    from dihal_bench.study.preflight import check_writable

    if bool(model_args) == bool(record_path):
        raise DihalError("give either --model-args or --record with --method")
    explicit = click.get_current_context().get_parameter_source("log_samples") is not click.core.ParameterSource.DEFAULT
    if log_samples and explicit and not out_dir:
        raise DihalError("--log-samples writes the sample logs beside lm_eval.json: give --out DIR")
    if out_dir:  # before the evaluation, which may take hours
        check_writable(Path(out_dir), "output folder --out")
    device, dtype = chosen_device(device, dtype)
    if model_args:
        model_args = _with_device(model_args, _check_model_args(model_args, trust_unverified), device, dtype)
    if record_path:
        if not method:
            raise DihalError("--record needs --method: the record's intact-backbone baseline, or dihal-chosen, "
                             "dihal-worst or dihal-oracle")
        from dihal_bench.study.records import load_record

        record = load_record(Path(record_path))
        model_args, seed = lm_eval_adapter.model_args_from_record(record, method, seed)
        corpus = corpus or record["corpus"]
        model_args = {**model_args, "device": device, "dtype": dtype}
    summary = lm_eval_adapter.run_lm_eval(model_args, [t.strip() for t in tasks.split(",") if t.strip()],
                                          limit=limit, corpus=corpus or "stdlib-docs", batch_size=batch_size,
                                          out_dir=Path(out_dir) if out_dir else None,
                                          trust_unverified=trust_unverified, bootstrap_iters=bootstrap_iters,
                                          log_samples=log_samples)
    click.echo(json.dumps(summary["results"], indent=2))
    if out_dir:
        logs = summary["config"]["sample_logs"]
        logged = f" and {len(logs)} sample log(s) ({', '.join(logs.values())})" if logs else ""
        click.echo(f"wrote {lm_eval_adapter.SUMMARY_FILE}{logged} to {out_dir}", err=True)
    if record_path:
        lm_eval_adapter.attach_to_record(Path(record_path), method, seed, summary)
        click.echo(f"added to {record_path} ({method}, seed {seed}); rebuild tables with `dihal-bench leaderboard`")
