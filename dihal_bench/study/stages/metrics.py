"""Stage 6: every method's samples scored by the suite's metrics (one job per method)."""

from __future__ import annotations

from dihal_bench.api.metrics import MetricContext, SampleSet, metric_value_problem
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.identities import METRIC_CONTEXT_KEYS, metric_names
from dihal_bench.study.run import Run
from dihal_bench.study.samples import read_samples


def metrics_unit(run: Run, name: str, method: dict, references: list[str], seed: int) -> dict:
    """The metrics job of one method's samples."""
    config = run.config
    spec = {"samples": method["samples_job"], "evaluator": config.evaluator, "metrics": metric_names(config),
            "seed": seed, "references": "seeded test windows",
            **{k: getattr(config.metrics, k) for k in METRIC_CONTEXT_KEYS}}
    return run.store.run("metrics", spec, lambda _: compute_metrics(run, name, method, references, seed))

def compute_metrics(run: Run, name: str, method: dict, references: list[str], seed: int) -> dict:
    texts, ids = read_samples(run.store.resolve(method["samples"]["path"]))
    samples = SampleSet(method=name, texts=texts, token_ids=ids)
    return compute_named_metrics(run, name, samples, references, seed, metric_names(run.config))

def compute_named_metrics(run: Run, name: str, samples: SampleSet, references: list[str], seed: int,
                          metrics: list[str]) -> dict:
    """``metrics`` of one method's samples, each value under the metric's name and its side
    values prefixed with it."""
    context = MetricContext(evaluator=run.evaluator, references=references, seed=seed, corpus=run.corpus,
                            **{key: getattr(run.config.metrics, key) for key in METRIC_CONTEXT_KEYS})
    values = {}
    registry = get_registry()
    for metric in metrics:
        registration = registry.get("metric", metric)
        try:
            computed = registration.obj(samples, context)
        except DihalError:
            raise
        except Exception as exc:  # a plugin's bug: name it; the metrics jobs done so far stay stored
            raise DihalError(f"metric {metric!r} ({registration.source}) failed on {name}: "
                             f"{type(exc).__name__}: {exc}") from exc
        # checked before anything is stored: a NaN, a text or a short list never reaches a record
        problem = metric_value_problem(metric, computed, len(samples.texts))
        if problem:
            raise DihalError(f"metric {metric!r} ({registration.source}) {problem} on {name}'s samples; nothing "
                             f"was recorded: fix the metric plugin, or leave {metric!r} out of metrics.names")
        # a metric's own value keeps its name; its side values (counts, warnings) are prefixed
        # with it, so that e.g. entropy's and MAUVE's sample counts cannot overwrite each other
        for key, value in computed.items():
            values[key if key == metric or key.startswith(f"{metric}_") else f"{metric}_{key}"] = value
    return values
