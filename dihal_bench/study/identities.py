"""What a study's job keys depend on beyond each job's own inputs: which validation windows a
bridge is measured on, how its targets came, what the samples depend on, and which metrics run.
Change one of these and every job that names it is another job."""

from __future__ import annotations

from dihal_bench.config.settings import SuiteConfig

#: the suite's metrics settings that change metric values, handed to every metric (MetricContext)
METRIC_CONTEXT_KEYS = ("max_length", "min_valid", "mauve_bootstrap")

def eval_identity(config: SuiteConfig) -> dict:
    """What the validation measurements of a bridge job depend on: which windows each measure reads."""
    return {"eval_sequences": config.sweep.eval_sequences, "eval_subset": "seeded",
            "bridgeability_windows": config.sweep.bridgeability_windows}

def targets_identity(config: SuiteConfig) -> dict:
    """What a bridge-training job adds to its key for how its targets came: streamed states equal
    the stored ones only up to float rounding (another batch composition through the backbone), so
    a streamed bridge is another job; the stored path keeps the keys it always had."""
    return {"targets": "streamed"} if config.bridge.streams_targets else {}

def sampling_identity(config: SuiteConfig) -> dict:
    """What the samples an autoregressive hybrid draws depend on, for job hashes."""
    return {key: getattr(config.sampling, key) for key in ("samples", "seq_len", "temperature", "top_p")}

def metric_names(config: SuiteConfig) -> list[str]:
    return [m for m in config.metrics.names if m != "mauve" or config.metrics.mauve]
