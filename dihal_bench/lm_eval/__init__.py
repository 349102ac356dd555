"""lm-evaluation-harness on the intact backbone or a DiHAL hybrid (``dihal-bench lm-eval``).

``scorer``: which model is scored and in windows of what length; ``model``: `DihalLM`, the
lm-eval model registered as ``dihal``; ``task``: the offline ``dihal-local`` perplexity task;
``record``: a run record's method as model args, and results attached to the record; ``samples``:
lm-eval's per-document records as JSON lines. Here: :func:`run_lm_eval`, one evaluation from
model args to a summary.

lm-eval is an optional extra: without it this package still imports, and everything that
needs it raises a `DihalError` with the install command.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.lm_eval.model import INSTALL_HINT, DihalLM, require_lm_eval
from dihal_bench.lm_eval.record import attach_to_record, model_args_from_record
from dihal_bench.lm_eval.samples import sample_log_name, write_sample_logs
from dihal_bench.lm_eval.scorer import load_scorer
from dihal_bench.lm_eval.task import LOCAL_TASK, local_task_config

__all__ = ["BOOTSTRAP_ITERS", "INSTALL_HINT", "LOCAL_TASK", "SUMMARY_FILE", "DihalLM", "attach_to_record",
           "load_scorer", "local_task_config", "model_args_from_record", "run_lm_eval", "sample_log_name"]

#: lm-eval's bootstrap resamples for standard errors (its own default, 100000, takes minutes per
#: metric); the ``--bootstrap-iters`` default of ``dihal-bench lm-eval``
BOOTSTRAP_ITERS = 1000
#: the summary's file name in the output folder
SUMMARY_FILE = "lm_eval.json"
#: how lm-eval names a metric's standard error: ``<metric>_stderr,<filter>``
STDERR = "_stderr"


def run_lm_eval(
    model_args: str | dict,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    corpus: str = "stdlib-docs",
    batch_size: int = 8,
    out_dir: str | Path | None = None,
    trust_unverified: bool = False,
    bootstrap_iters: int = BOOTSTRAP_ITERS,
    log_samples: bool = True,
) -> dict:
    """Evaluate the model ``model_args`` describes (`DihalLM.from_model_args`) on lm-eval tasks.

    ``tasks`` are lm-eval task names (their data must be available locally when offline) and
    `LOCAL_TASK`, the held-out split of ``corpus`` (`local_task_config`). ``limit`` caps the
    documents per task (a fraction when below 1). Returns ``{"results": {task: {metric:
    value}}, "config": {...}}``; metrics under a filter other than lm-eval's "none" keep it as
    ``metric,filter``. Also written to ``out_dir/lm_eval.json`` when ``out_dir`` is given.

    Each metric lm-eval gives a standard error follows it as ``<metric>_stderr``: closed-form
    for mean-aggregated metrics (``acc``), from ``bootstrap_iters`` resamples for those lm-eval
    bootstraps (``perplexity``, median, F1, BLEU…; it caps BLEU, chrF and TER at 100); none
    for the others (the weighted perplexities and bits per byte of ``dihal-local`` and
    ``wikitext``), for a task of one document, or with ``bootstrap_iters=0``.

    With ``log_samples`` and ``out_dir``, lm-eval's per-document records are written to
    ``out_dir/samples_<task>.jsonl`` (`dihal_bench.lm_eval.samples`), before the summary, whose
    ``config.sample_logs`` names them.

    Offline, set ``HF_DATASETS_OFFLINE=1`` before Python starts (``datasets`` reads it at
    import) so that tasks with cached data do not first try the Hub. ``trust_unverified`` loads a
    bridge checkpoint that records no sha256 of its weights (refused otherwise).
    """
    lm_eval = require_lm_eval()
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    if not tasks:
        raise DihalError("no lm-eval tasks given")
    if isinstance(bootstrap_iters, bool) or not isinstance(bootstrap_iters, int) or bootstrap_iters < 0:
        raise DihalError(f"bootstrap_iters must be a whole number >= 0 (0: no standard errors), "
                         f"not {bootstrap_iters!r}")
    log_samples = bool(log_samples and out_dir is not None)  # the samples go next to the summary
    named = [task for task in tasks if task != LOCAL_TASK]
    manager = TaskManager(include_defaults=bool(named))  # indexing lm-eval's own tasks takes seconds
    unknown = [task for task in named if task not in manager.all_tasks]
    if unknown:
        raise DihalError(f"unknown lm-eval task(s) {', '.join(unknown)}; list them with `lm-eval ls tasks`")
    specs = [local_task_config(corpus) if task == LOCAL_TASK else task for task in tasks]
    if isinstance(model_args, str):
        model_args = simple_parse_args_string(model_args)
    if trust_unverified:
        model_args = {**model_args, "trust_unverified": True}
    model = DihalLM.create_from_arg_obj({"batch_size": batch_size, **model_args})
    try:  # on stderr what lm-eval prints ("bootstrapping for stddev: ..."): stdout is the command's JSON
        with contextlib.redirect_stdout(sys.stderr):
            evaluated = lm_eval.simple_evaluate(model=model, tasks=specs, limit=limit, log_samples=log_samples,
                                                bootstrap_iters=bootstrap_iters, task_manager=manager)
    except ConnectionError as exc:  # what `datasets` raises for a task whose data is not cached
        raise DihalError(f"lm-eval could not load a task's data ({str(exc).splitlines()[0]}); "
                         "offline, only tasks whose data is already cached can run") from None
    summary = {
        "results": {task: _metrics(values) for task, values in evaluated["results"].items()},
        "config": {
            "model_args": {key: _describe(value) for key, value in model_args.items()},
            "model": model.get_model_info(),
            "tasks": list(tasks),
            "corpus": corpus if LOCAL_TASK in tasks else None,
            "limit": limit,
            "batch_size": model.batch_size,
            "samples": evaluated.get("n-samples", {}),
            "bootstrap_iters": bootstrap_iters,
            "sample_logs": {},
            "lm_eval_version": lm_eval.__version__,
        },
    }
    if out_dir is not None:
        if log_samples:  # first: a summary on disk means its sample logs are complete
            summary["config"]["sample_logs"] = write_sample_logs(evaluated.get("samples") or {}, Path(out_dir))
        write_json_atomic(Path(out_dir) / SUMMARY_FILE, summary)
    return summary


def _metrics(values: dict) -> dict[str, float]:
    """``{"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": ...}`` -> ``{"acc": 0.5, "acc_stderr":
    0.1}``: numeric metrics only (no alias), each followed by its standard error where lm-eval
    computed a finite one (not "N/A"). A filter other than "none" stays in the name:
    ``exact_match,strict-match`` and ``exact_match_stderr,strict-match``."""
    metrics, stderrs = {}, {}
    for key, value in values.items():
        metric, comma, filter_name = key.partition(",")
        if not comma or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        name = metric if filter_name == "none" else key
        if metric.endswith(STDERR) and metric[: -len(STDERR)] + comma + filter_name in values:
            if math.isfinite(value):
                stderrs[name] = float(value)
        else:
            metrics[name] = float(value)
    ordered = {}
    for name, value in metrics.items():  # each standard error beside its metric
        ordered[name] = value
        metric, comma, filter_name = name.partition(",")
        stderr = metric + STDERR + comma + filter_name
        if stderr in stderrs:
            ordered[stderr] = stderrs.pop(stderr)
    return ordered


def _describe(value):
    """A model argument as JSON: objects (a backbone, a bridge) by their name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "name", type(value).__name__)
