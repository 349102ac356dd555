"""The units of work of a run, and ``dihal-bench run --dry-run``: the plan with a rough cost estimate.

:func:`seed_units` is the one list of a seed's units: the runner counts its progress by it and
checks that it does exactly these, and the dry-run prints it.

Nothing is loaded: the backbone's size is the parameter count its plugin declares when it
registers (meta ``parameters``), else read from its name ("8B", "135m"), and time is FLOPs
over an assumed sustained throughput, so the estimate says which jobs dominate and roughly
how long and how much memory they need, not the exact figure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tabulate import tabulate

from dihal_bench.budget import Budget
from dihal_bench.errors import DihalError
from dihal_bench.plugins import get_registry
from dihal_bench.suite_config import SuiteConfig, SweepSettings

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


@dataclass(frozen=True)
class Unit:
    """One unit of a seed's work: what the progress bar counts and the dry-run lists."""

    stage: str  # locate, targets, sweep, dihal, controls, references, baselines, steps, metrics, latency
    label: str
    seq_len: int | None = None  # a targets unit's training sequence length (its cost depends on it)


def auto_sweep_layers(num_layers: int, required: set[int], count: int) -> list[int]:
    """Exactly ``count`` candidate layers of 1..L-1 (all of them when there are fewer): every
    layer in ``required`` (ℓ*, the worst-scored layer), then, of the ``free`` picks left, the
    ⌈free/2⌉ shallowest remaining layers and the rest spread evenly over the deeper ones.

    Dense over the shallow layers because that is where bridgeability changes fastest and
    where a bridge is cheap (it replaces few layers), so ranks among them decide the
    correlations; the even tail keeps the whole depth in view. A plan knows the sweep's size
    before ℓ* is known."""
    candidates = list(range(1, num_layers))
    if len(candidates) <= count:
        return candidates
    chosen = set(required)
    rest = [layer for layer in candidates if layer not in chosen]
    free = count - len(chosen)
    if free > 0:
        shallow = (free + 1) // 2
        chosen |= set(rest[:shallow])
        deep, spread = rest[shallow:], free - shallow
        if spread:
            # the deepest layer is always among them; the others evenly below it
            chosen |= {deep[round((i + 1) * (len(deep) - 1) / spread)] for i in range(spread)}
    return sorted(chosen)


def sweep_size(config: SuiteConfig, num_layers: int | None) -> int:
    layers = config.sweep.layers
    if layers != "auto":
        return len(layers)
    count = config.sweep.count
    return count if num_layers is None else min(count, num_layers - 1)


def trains_matched_bridges(config: SuiteConfig) -> bool:
    """Whether a bridge trains under the matched budget (DiHAL or the regressor control): else
    only the sweep needs bridge targets (a geometry-only suite, say)."""
    return bool(config.methods.dihal) or "regressor" in config.methods.controls


def budget_sections(config: SuiteConfig, num_layers: int | None = None, *, bridge_targets: bool = False) -> list[str]:
    """The budget sections ("sweep.budget", then "budget") whose training sequences a run draws:
    the sweep's when it has a layer, the matched budget's when a bridge (DiHAL, the regressor
    control) or a baseline trains under it. ``bridge_targets``: only those whose sequences need
    bridge targets, which baselines do not (they read tokens), and none with streamed targets
    (``bridge.targets``: each training step computes its own). The one place that decides it, for
    the plan, the target extraction and the check that the training split can feed every budget."""
    if bridge_targets and config.bridge.streams_targets:
        return []
    sections = ["sweep.budget"] if sweep_size(config, num_layers) else []
    if trains_matched_bridges(config) or (config.methods.baselines and not bridge_targets):
        sections.append("budget")
    return sections


def target_budgets(config: SuiteConfig) -> list[Budget]:
    """The budgets whose training sequences need bridge targets: the sweep's, the matched one's."""
    return [Budget.from_dict(config.budget_table(section)) for section in budget_sections(config, bridge_targets=True)]


def target_lengths(config: SuiteConfig) -> list[int]:
    """Sequence lengths whose training split needs bridge targets (one extraction job each)."""
    return sorted({budget.seq_len for budget in target_budgets(config)})


def method_names(config: SuiteConfig) -> list[str]:
    """Every row of the methods table, in the order the runner makes them."""
    methods = config.methods
    return ([f"dihal-{role}" for role in methods.dihal] + [f"control-{name}" for name in methods.controls]
            + [f"reference-{name}" for name in methods.references] + list(methods.baselines))


def method_stage(name: str) -> str:
    for prefix, stage in (("dihal-", "dihal"), ("control-", "controls"), ("reference-", "references")):
        if name.startswith(prefix):
            return stage
    return "baselines"


def steps_label(steps: int, sampler: str | None = None) -> str:
    """A steps-axis point's label; ``sampler`` None is the suite's own bridge sampler."""
    return f"DiHAL at K={steps} steps" + (f", {sampler} sampler" if sampler is not None else "")


def steps_axis_samplers(config: SuiteConfig) -> tuple[str | None, ...]:
    """The bridge samplers the steps axis measures each K with (docs/method.md#bridge): the
    suite's ``bridge.steps_axis_samplers``, or (None,), the suite's own sampler alone."""
    return tuple(config.bridge.steps_axis_samplers) or (None,)


def steps_axis_points(config: SuiteConfig) -> list[tuple[str | None, int]]:
    """(sampler, K) of every steps-axis point, sampler by sampler, in the order the runner does them."""
    return [(sampler, k) for sampler in steps_axis_samplers(config) for k in config.bridge.steps_axis]


def seed_units(config: SuiteConfig, num_layers: int | None = None) -> list[Unit]:
    """Every unit of work of one seed, in the order the runner does them. ``num_layers`` (the
    backbone's depth, when known) caps an automatic sweep at the layers there are."""
    n_sweep = sweep_size(config, num_layers)
    return [
        Unit("locate", "locate"),
        *(Unit("targets", f"bridge targets T={length}", seq_len=length) for length in target_lengths(config)),
        *(Unit("sweep", f"sweep layer {i + 1}/{n_sweep}") for i in range(n_sweep)),
        *(Unit(method_stage(name), name) for name in method_names(config)),
        *(Unit("steps", steps_label(k, sampler)) for sampler, k in steps_axis_points(config)),
        *(Unit("metrics", f"metrics {name}") for name in method_names(config)),
        *([Unit("latency", "latency")] if method_names(config) else []),  # a geometry-only suite has no methods
    ]


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
    at a time: per stage its jobs, its longest job, its time (the longest job, or the stage's
    total over the devices if that is longer: a lower bound that list scheduling nears when jobs
    are many and alike), device-hours and the memory one job needs; then the critical path (the
    longest job of every stage: the time with unlimited devices) and the totals over the seeds."""
    if devices < 1:
        raise DihalError(f"--gpus must be at least 1, got {devices}")
    params = backbone_parameters(config.backbone)
    if not params:
        return (f"suite {name}: cannot schedule: the size of backbone {config.backbone!r} is unknown "
                "(not declared by its plugin, not in its name)")
    units = seed_units(config)
    weights = params * BYTES.get(config.dtype, 4)
    scored = worker_memory(config) or weights
    rows, critical, makespan, device_seconds = [], 0.0, 0.0, 0.0
    for stages in PARALLEL_STAGES:
        jobs = [unit_seconds(unit, config, params) for unit in units if unit.stage in stages]
        if not jobs:
            continue
        longest, total = max(jobs), sum(jobs)
        stage_time = max(longest, total / devices)
        critical, makespan, device_seconds = critical + longest, makespan + stage_time, device_seconds + total
        memory = scored if stages == ("metrics",) else weights
        rows.append(["/".join(stages), len(jobs), _duration(longest), _duration(stage_time),
                     f"{total / 3600:.2f}", f"{memory / 2**30:.1f} GiB"])
    seeds = len(config.seeds)
    kind = "GPU" if _device_kind(config) == "cuda" else "worker"
    return "\n".join([
        f"suite {name} on {devices} {kind}{'s' if devices > 1 else ''}, one job per {kind} at a time "
        f"(per seed; {seeds} seed{'s' if seeds > 1 else ''} run one after another):",
        tabulate(rows, headers=["stage", "jobs", "longest job", f"stage time on {devices}",
                                f"{kind}-hours", "memory per job"]),
        f"critical path (unlimited {kind}s): {_duration(critical)} per seed",
        f"on {devices} {kind}{'s' if devices > 1 else ''}: {_duration(makespan)} per seed, "
        f"{_duration(makespan * seeds)} for {seeds} seed(s); {device_seconds * seeds / 3600:.1f} {kind}-hours in all",
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
