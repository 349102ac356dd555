"""``dihal-bench run --dry-run``: a run's plan with a rough cost estimate, and its schedule over N
devices.

Nothing is loaded: the backbone's size is the parameter count its plugin declares when it
registers (meta ``parameters``), else read from its name ("8B", "135m"), and time is FLOPs
over an assumed sustained throughput, so the estimate says which jobs dominate and roughly
how long and how much memory they need, not the exact figure.
"""

from __future__ import annotations

import json
import re

from tabulate import tabulate

from dihal_bench.config.settings import SuiteConfig, SweepSettings
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.plan import Unit, method_names, seed_units, target_budgets
from dihal_bench.training.budget import Budget

#: sustained FLOP/s assumed per device kind: a bf16 datacentre GPU at ~35% utilisation, and
#: the 2-core CPU this project is developed on (SmolLM2-135M forward: ~550 tokens/s measured)
THROUGHPUT = {"cuda": 300e12, "cpu": 1.5e11}

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

def backbone_parameters(name: str) -> float | None:
    """The parameter count of backbone ``name`` without loading it: what its registration
    declares, else a size in the name of a hub model ("Llama-3.1-8B", "SmolLM2-135M"), else None."""
    registration = get_registry().items["backbone"].get(name)
    declared = None if registration is None else registration.meta.get("parameters")
    if declared is not None:
        return float(declared)
    match = re.search(r"(\d+(?:\.\d+)?)\s*([bBmM])\b", name.replace("-", " ").replace("_", " "))
    if not match:
        return None
    return float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6)

#: validation windows assumed for ``sweep.eval_sequences = "all"``, which the plan cannot count
#: without the corpus (the embedded stdlib-docs validation split has 162 windows of 64 tokens)
ALL_WINDOWS_ESTIMATE = 160

def eval_windows(sweep: SweepSettings) -> int:
    return ALL_WINDOWS_ESTIMATE if sweep.eval_sequences == "all" else sweep.eval_sequences

def unit_cost(unit: Unit, config: SuiteConfig) -> tuple[str, int, int]:
    """(what it does, tokens through the frozen backbone, tokens trained) for the estimate."""
    locate, sweep, sampling = config.locate, config.sweep, config.sampling
    budget = Budget.from_dict(config.budget)
    sweep_budget = Budget.from_dict(sweep.budget)
    samples = sampling.samples * sampling.seq_len
    if unit.stage == "locate":
        return f"N={locate.tokens} tokens x all layers, {len(locate.proxies)} proxies", locate.tokens * 2, 0
    if unit.stage == "targets":
        length = unit.seq_len
        needed = max(b.distinct_sequences for b in target_budgets(config) if b.seq_len == length)
        return "one forward pass over the training subset, stored", needed * length, 0
    if unit.stage == "sweep":
        return (f"{sweep_budget.steps} steps{streamed(config)}",
                eval_windows(sweep) * sweep_budget.seq_len * 3 + streamed_tokens(config, sweep_budget),
                sweep_budget.steps * sweep_budget.tokens_per_step)
    if unit.stage == "dihal" or unit.label == "control-regressor":
        return (f"{budget.steps} steps{streamed(config)} + {sampling.samples} samples",
                samples + streamed_tokens(config, budget), budget.steps * budget.tokens_per_step)
    if unit.label == "control-skip":
        return f"{sampling.samples} samples, nothing trained", samples, 0
    if unit.stage == "references":
        return f"{sampling.samples} texts drawn, no model", 0, 0
    if unit.stage == "steps":
        return (f"bridgeability + {sampling.samples} samples + Gen.PPL",
                eval_windows(sweep) * budget.seq_len * 3 + samples * 3, 0)
    if unit.stage == "baselines":
        registration = get_registry().items["baseline"].get(unit.label)
        method = None if registration is None else registration.obj
        if method is not None and not method.in_budget:
            return f"{sampling.samples} samples, nothing trained", samples, 0
        trained = budget.steps * budget.tokens_per_step
        if method is not None and method.trains_through_backbone:
            # a forward and a backward pass of the whole backbone per step: about three forward passes
            return f"{budget.steps} steps through the backbone + {sampling.samples} samples", samples + 3 * trained, 0
        return f"up to {budget.steps} steps + {sampling.samples} samples", samples, trained
    if unit.stage == "metrics":
        return f"{sampling.samples} samples under the evaluator", samples * 2, 0
    repeats = config.metrics.latency_repeats
    return f"{repeats} timed decodes per method", (repeats + 1) * len(method_names(config)) * samples, 0

def streamed(config: SuiteConfig) -> str:
    return ", targets streamed" if config.bridge.streams_targets else ""

def streamed_tokens(config: SuiteConfig, budget: Budget) -> int:
    """Backbone tokens a bridge job adds when its targets are streamed: every step runs its batch
    through layers 1..ℓ, counted as half a full pass (ℓ is unknown before locate)."""
    return budget.steps * budget.tokens_per_step // 2 if config.bridge.streams_targets else 0

def targets_memory(config: SuiteConfig) -> str:
    if config.bridge.streams_targets:
        return ("bridge targets are streamed: a training step holds its own batch's states, the validation "
                "windows' states one layer at a time")
    return ("stored bridge targets add n_train x T x d x 4 bytes per layer on the host to the job that extracts "
            "them (training jobs read them memory-mapped)")

def worker_memory(config: SuiteConfig) -> int | None:
    """Bytes a worker holding the suite's models needs: the backbone's weights and, if it is
    another model, the evaluator's, in the suite's dtype (None when a size is unknown). What one
    metrics job needs, the most any job holds besides stored bridge targets."""
    sizes = [backbone_parameters(name) for name in dict.fromkeys((config.backbone, config.evaluator))]
    if not all(sizes):
        return None
    return int(sum(sizes) * BYTES.get(config.dtype, 4))

def _device_kind(config: SuiteConfig) -> str:
    return "cuda" if str(config.device).startswith("cuda") else "cpu"

def unit_seconds(unit: Unit, config: SuiteConfig, params: float | None) -> float | None:
    """A unit's estimated wall time from its FLOPs, None when the backbone's size is unknown."""
    if not params:
        return None
    _, backbone_tokens, trained_tokens = unit_cost(unit, config)
    # forward 2·P·tokens through the frozen backbone; training a ~P/100 trainable part
    # on cached targets costs far less, so it is counted as 6·(P/100)·tokens
    flops = 2 * params * backbone_tokens + 6 * (params / 100) * trained_tokens
    return flops / THROUGHPUT[_device_kind(config)]

def format_plan(name: str, config: SuiteConfig) -> str:
    params = backbone_parameters(config.backbone)
    device = _device_kind(config)
    bytes_per = BYTES.get(config.dtype, 4)
    rows, total = [], 0.0
    for unit in seed_units(config):
        detail, backbone_tokens, trained_tokens = unit_cost(unit, config)
        seconds = unit_seconds(unit, config, params)
        total += seconds or 0.0
        rows.append([unit.label, detail, f"{backbone_tokens:,}", f"{trained_tokens:,}", _duration(seconds)])
    seeds = len(config.seeds)
    lines = [f"suite {name}: {config.description}", "", "resolved config:",
             json.dumps(config.to_dict(), indent=2), "",
             f"jobs per seed ({seeds} seed{'s' if seeds > 1 else ''}: {list(config.seeds)}):",
             tabulate(rows, headers=["unit", "what", "backbone tokens", "trained tokens", "est. time"])]
    if params:
        lines.append(f"total: {_duration(total)} per seed, {_duration(total * seeds)} for {seeds} seed(s)")
    if params:
        weights = params * bytes_per
        lines.append(f"\nmemory: backbone weights {weights / 2**30:.1f} GiB ({params / 1e9:.2f}B parameters, "
                     f"{config.dtype}); {targets_memory(config)}")
        lines.append(f"time: FLOPs / {THROUGHPUT[device]:.1e} FLOP/s assumed sustained on {device}; "
                     "order-of-magnitude only")
    else:
        lines.append("\nmemory and time: unknown (the backbone's size is not in its name)")
    return "\n".join(lines)

#: the stages whose jobs are independent of each other, in the order they run (an executor
#: runs a stage's jobs in parallel and waits for all of them before the next stage)
PARALLEL_STAGES = (("locate",), ("targets",), ("sweep",), ("dihal", "controls", "references", "baselines"),
                   ("steps",), ("metrics",), ("latency",))

def format_schedule(name: str, config: SuiteConfig, devices: int) -> str:
    """The plan as a schedule over ``devices`` devices (GPUs, or CPU workers), one job per device
    at a time, every seed's jobs of a stage sharing the devices (as the runner hands them to the
    executor): per stage its jobs, its longest job, its time (the longest job, or the stage's total
    over the devices if that is longer: a lower bound that list scheduling nears when jobs are many
    and alike), device-hours and the memory one job needs; then the critical path (the longest job
    of every stage: the time with unlimited devices; latency's jobs one after another, since each
    times decodes alone), the whole schedule, and how close it comes to
    perfect packing (all device-hours over the devices)."""
    if devices < 1:
        raise DihalError(f"--gpus must be at least 1, got {devices}")
    params = backbone_parameters(config.backbone)
    if not params:
        return (f"suite {name}: cannot schedule: the size of backbone {config.backbone!r} is unknown "
                "(not declared by its plugin, not in its name)")
    units, seeds = seed_units(config), len(config.seeds)
    weights = params * BYTES.get(config.dtype, 4)
    scored = worker_memory(config) or weights
    rows, critical, makespan, device_seconds = [], 0.0, 0.0, 0.0
    for stages in PARALLEL_STAGES:
        jobs = [unit_seconds(unit, config, params) for unit in units if unit.stage in stages] * seeds
        if not jobs:
            continue
        longest, total = max(jobs), sum(jobs)
        # latency jobs time decodes: one at a time, alone on the cluster
        stage_time = total if stages == ("latency",) else max(longest, total / devices)
        serial = total if stages == ("latency",) else longest  # what no number of devices shortens
        critical, makespan, device_seconds = critical + serial, makespan + stage_time, device_seconds + total
        memory = scored if stages == ("metrics",) else weights
        rows.append(["/".join(stages), len(jobs), _duration(longest), _duration(stage_time),
                     f"{total / 3600:.2f}", f"{memory / 2**30:.1f} GiB"])
    kind = "GPU" if _device_kind(config) == "cuda" else "worker"
    plural = "s" if devices > 1 else ""
    return "\n".join([
        f"suite {name} on {devices} {kind}{plural}, one job per {kind} at a time, the jobs of a stage of all "
        f"{seeds} seed{'s' if seeds > 1 else ''} together:",
        tabulate(rows, headers=["stage", "jobs", "longest job", f"stage time on {devices}",
                                f"{kind}-hours", "memory per job"]),
        f"critical path (unlimited {kind}s): {_duration(critical)}",
        f"on {devices} {kind}{plural}: {_duration(makespan)} for {seeds} seed(s); "
        f"{device_seconds / 3600:.1f} {kind}-hours in all, {_duration(device_seconds / devices)} if perfectly "
        f"packed ({makespan / (device_seconds / devices):.2f}x that)",
        "memory per job: the backbone's weights (and the evaluator's for metrics) in the suite's dtype; "
        f"{targets_memory(config)}",
        f"time: FLOPs / {THROUGHPUT[_device_kind(config)]:.1e} FLOP/s assumed sustained; order-of-magnitude only",
    ])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
