"""lm-evaluation-harness on the intact backbone or a DiHAL hybrid (``dihal-bench lm-eval``).

``scorer``: which model is scored and in windows of what length; ``model``: `DihalLM`, the
lm-eval model registered as ``dihal``; ``task``: the offline ``dihal-local`` perplexity task;
``record``: a run record's method as model args, and results attached to the record. Here:
:func:`run_lm_eval`, one evaluation from model args to a summary.

lm-eval is an optional extra: without it this package still imports, and everything that
needs it raises a `DihalError` with the install command.
"""

from __future__ import annotations

from pathlib import Path

from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.lm_eval.model import INSTALL_HINT, DihalLM, require_lm_eval
from dihal_bench.lm_eval.record import attach_to_record, model_args_from_record
from dihal_bench.lm_eval.scorer import load_scorer
from dihal_bench.lm_eval.task import LOCAL_TASK, local_task_config

__all__ = ["INSTALL_HINT", "LOCAL_TASK", "DihalLM", "attach_to_record", "load_scorer", "local_task_config",
           "model_args_from_record", "run_lm_eval"]


def run_lm_eval(
    model_args: str | dict,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    corpus: str = "stdlib-docs",
    batch_size: int = 8,
    out_dir: str | Path | None = None,
    trust_unverified: bool = False,
) -> dict:
    """Evaluate the model ``model_args`` describes (`DihalLM.from_model_args`) on lm-eval tasks.

    ``tasks`` are lm-eval task names (their data must be available locally when offline) and
    `LOCAL_TASK`, the held-out split of ``corpus`` (`local_task_config`). ``limit`` caps the
    documents per task (a fraction when below 1). Returns ``{"results": {task: {metric:
    value}}, "config": {...}}``; metrics under a filter other than lm-eval's "none" keep it as
    ``metric,filter``. Also written to ``out_dir/lm_eval.json`` when ``out_dir`` is given.

    Offline, set ``HF_DATASETS_OFFLINE=1`` before Python starts (``datasets`` reads it at
    import) so that tasks with cached data do not first try the Hub. ``trust_unverified`` loads a
    bridge checkpoint that records no sha256 of its weights (refused otherwise).
    """
    lm_eval = require_lm_eval()
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    if not tasks:
        raise DihalError("no lm-eval tasks given")
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
    try:
        evaluated = lm_eval.simple_evaluate(model=model, tasks=specs, limit=limit, log_samples=False,
                                            bootstrap_iters=0, task_manager=manager)
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
            "lm_eval_version": lm_eval.__version__,
        },
    }
    if out_dir is not None:
        write_json_atomic(Path(out_dir) / "lm_eval.json", summary)
    return summary


def _metrics(values: dict) -> dict[str, float]:
    """``{"word_perplexity,none": 3.2, "alias": ...}`` -> ``{"word_perplexity": 3.2}``: numeric
    metrics only (no stderr left as "N/A", no alias)."""
    metrics = {}
    for key, value in values.items():
        metric, comma, filter_name = key.partition(",")
        if comma and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[metric if filter_name == "none" else key] = float(value)
    return metrics


def _describe(value):
    """A model argument as JSON: objects (a backbone, a bridge) by their name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "name", type(value).__name__)
