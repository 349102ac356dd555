"""``dihal-bench run --dry-run``: a run's plan with a rough cost estimate, and its schedule over N
devices.

Nothing is loaded: the backbone's size is the parameter count its plugin declares when it
registers (meta ``parameters``), else read from its name ("8B", "135m"), and time is FLOPs
over an assumed sustained throughput, so the estimate says which jobs dominate and roughly
how long and how much memory they need, not the exact figure.
``dihal_bench.study.calibration.calibrate`` replaces the assumption with rates measured on this
machine in a few seconds (``--calibrate``, on a run or a dry run).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from tabulate import tabulate

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import backbone_parameters_declared
from dihal_bench.study.costs import (
    BaselineDecodes,
    Work,
    unit_cost,
    unit_work,
)
from dihal_bench.study.plan import METHOD_STAGES, Unit, seed_units

#: sustained FLOP/s assumed per device kind: a bf16 datacentre GPU at ~35% utilisation, and
#: the 2-core CPU this project is developed on (SmolLM2-135M forward: ~550 tokens/s measured)
THROUGHPUT = {"cuda": 300e12, "cpu": 1.5e11}

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: hub models whose names carry no size: the GPT-2 family, the field's Gen.PPL scorers (parameter
#: counts from their configs: 12/24/36/48 layers of width 768/1024/1280/1600, tied embeddings)
UNSIZED_MODELS = {"gpt2": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1.56e9}

def backbone_parameters(name: str) -> float | None:
    """The parameter count of backbone ``name`` without loading it: what its registration
    declares, else a size in the name of a hub model ("Llama-3.1-8B", "SmolLM2-135M") or a known
    unsized one (`UNSIZED_MODELS`), else None."""
    declared = backbone_parameters_declared(name)
    if declared is not None:
        return float(declared)
    if name.rsplit("/", 1)[-1].lower() in UNSIZED_MODELS:
        return UNSIZED_MODELS[name.rsplit("/", 1)[-1].lower()]
    match = re.search(r"(\d+(?:\.\d+)?)\s*([bBmM])\b", name.replace("-", " ").replace("_", " "))
    if not match:
        return None
    return float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6)


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

@dataclass(frozen=True)
class BaselineTiming:
    """A baseline timed by a calibration: seconds per training step (None: it trains nothing),
    seconds its ``fit`` spends per training window before the first step (a vocabulary, LD4LG's
    backbone features), and seconds of its decode of one sampling batch and of one sequence."""

    step: float | None
    per_window: float
    batch_decode: float
    single_decode: float


@dataclass(frozen=True)
class Throughput:
    """Tokens per second of each kind of :class:`Work`, and where the figures come from (a
    calibrated ``evaluator`` rate is its scoring of sample texts, in backbone tokens). A
    calibration adds what it timed as a whole: ``baselines``, each baseline's :class:`BaselineTiming`
    (its training and sampling are then priced by its own step, setup and decodes, not by the
    bridge's and the hybrid's rates); ``evaluated``, tokens per second of a bridge's validation
    measures; ``single_decode``, seconds of a hybrid's decode of one sequence; ``extracted``, tokens per second of a bridge-targets job (states kept at every layer
    it keeps, and written); ``proxy_seconds``, locate's proxies over every candidate layer. What was
    not timed is priced as backbone forwards, or not at all (locate's proxies)."""

    forward: float
    decode: float
    evaluator: float
    trained: float
    source: str
    baselines: dict[str, BaselineTiming] = field(default_factory=dict)
    evaluated: float | None = None
    extracted: float | None = None
    proxy_seconds: float = 0.0
    single_decode: float | None = None

    def seconds(self, work: Work) -> float:
        singles = (work.single_decodes * self.single_decode if self.single_decode is not None
                   else work.single_tokens / self.decode)
        decoded = (work.decode / self.decode + singles + work.evaluator / self.evaluator
                   + sum(map(self._baseline_decode, work.baseline_decodes)))
        evaluated = work.evaluated / self.evaluated if self.evaluated else 3 * work.evaluated / self.forward
        extra = (decoded + evaluated + work.extracted / (self.extracted or self.forward)
                 + (self.proxy_seconds if work.proxies else 0.0))
        timed = self.baselines.get(work.baseline) if work.baseline else None
        if timed is not None and timed.step is not None:
            return work.steps * timed.step + work.windows * timed.per_window + extra
        return work.forward / self.forward + work.trained / self.trained + extra

    def _baseline_decode(self, decodes: BaselineDecodes) -> float:
        timed = self.baselines.get(decodes.name)
        if timed is None:
            return decodes.tokens / self.decode
        return decodes.batches * timed.batch_decode + decodes.singles * timed.single_decode

    def describe(self, params: float) -> str:
        flops = {kind: getattr(self, kind) * 2 * params for kind in ("forward", "decode", "evaluator")}
        steps = "".join(f", {name} {timed.step:.3g} s/step" for name, timed in self.baselines.items() if timed.step)
        decodes = "".join(f", {name} {timed.batch_decode:.3g} s/sampling batch" for name, timed in self.baselines.items())
        timed = "".join(text for value, text in (
            (self.evaluated, f", bridge evaluation {self.evaluated or 0:,.0f} tokens/s"),
            (self.extracted, f", bridge targets {self.extracted or 0:,.0f} tokens/s"),
            (self.proxy_seconds, f", locate's proxies {self.proxy_seconds:.0f} s")) if value)
        return (f"time: {self.source}: backbone forward {flops['forward']:.2e}, decode {flops['decode']:.2e}, "
                f"evaluator {flops['evaluator']:.2e} FLOP/s (2 x backbone parameters per token), "
                f"bridge training {self.trained:,.0f} tokens/s{steps}{decodes}{timed}")


def assumed_throughput(config: SuiteConfig, params: float) -> Throughput:
    """The rates the assumed sustained FLOP/s give: a forward costs 2·P FLOPs per token (P the
    backbone's parameters, or the evaluator's for its passes, when its size is known), and
    training a ~P/100 trainable part on cached targets 6·(P/100)."""
    device = _device_kind(config)
    rate = THROUGHPUT[device]
    forward = rate / (2 * params)
    evaluator = rate / (2 * (backbone_parameters(config.evaluator) or params))
    return Throughput(forward, forward, evaluator, rate / (6 * params / 100),
                      f"FLOPs / {rate:.1e} FLOP/s assumed sustained on {device}; order-of-magnitude only")


def unit_seconds(unit: Unit, config: SuiteConfig, params: float | None,
                 throughput: Throughput | None = None) -> float | None:
    """A unit's estimated wall time, None when the backbone's size is unknown (and nothing was
    measured): its work at the measured ``throughput``, else at the assumed FLOP/s."""
    if throughput is None:
        if not params:
            return None
        throughput = assumed_throughput(config, params)
    return throughput.seconds(unit_work(unit, config))

def format_plan(name: str, config: SuiteConfig, throughput: Throughput | None = None,
                done: dict[str, str] | None = None) -> str:
    """The dry run's text: the resolved config, every unit of a seed with its work and estimated
    time (at ``throughput`` when measured), totals and memory. ``done`` adds a column that says, per
    unit label, whether the job store already holds its result (a label it lacks: cannot tell
    before the stages before it have run)."""
    params = backbone_parameters(config.backbone)
    if throughput is None and params:
        throughput = assumed_throughput(config, params)
    bytes_per = BYTES.get(config.dtype, 4)
    rows, total, by_scale = [], 0.0, {}
    for unit in seed_units(config):
        detail, backbone_tokens, trained_tokens = unit_cost(unit, config)
        seconds = unit_seconds(unit, config, params, throughput)
        total += seconds or 0.0
        if unit.stage in ("dihal", "controls", "baselines"):
            by_scale[unit.scale] = by_scale.get(unit.scale, 0.0) + (seconds or 0.0)
        row = [unit.label, detail, f"{backbone_tokens:,}", f"{trained_tokens:,}", _duration(seconds)]
        if done is not None:
            row.append(done.get(unit.label, "?"))
        rows.append(row)
    seeds = len(config.seeds)
    headers = ["unit", "what", "backbone tokens", "trained tokens", "est. time"] + (["done"] if done is not None else [])
    lines = [f"suite {name}: {config.description}", "", "resolved config:",
             json.dumps(config.to_dict(), indent=2), "",
             f"device: {config.device}, dtype: {config.dtype}", "",
             f"jobs per seed ({seeds} seed{'s' if seeds > 1 else ''}: {list(config.seeds)}):",
             tabulate(rows, headers=headers)]
    if throughput is not None:
        lines.append(f"total: {_duration(total)} per seed, {_duration(total * seeds)} for {seeds} seed(s)")
        if len(by_scale) > 1:  # what each budget scale's rows cost to train and sample (docs/method.md#budget-scales)
            lines.append("rows by budget scale, per seed: " + ", ".join(
                f"{scale}x {_duration(seconds)}" for scale, seconds in sorted(by_scale.items())))
    if done is not None:
        lines.append("done: whether --out holds the unit's finished job for every seed; ?: its job key depends "
                     "on earlier stages' results, so the dry run cannot tell")
    if params:
        weights = params * bytes_per
        lines.append(f"\nmemory: backbone weights {weights / 2**30:.1f} GiB ({params / 1e9:.2f}B parameters, "
                     f"{config.dtype}); {targets_memory(config)}")
    else:
        lines.append("\nmemory: unknown (the backbone's size is not in its name)")
    lines.append(throughput.describe(params or 0.0) if throughput is not None and params
                 else "time: unknown (the backbone's size is not in its name; --calibrate measures it)")
    if throughput is None or not throughput.proxy_seconds:
        lines.append(UNPRICED)
    return "\n".join(lines)

#: what the assumed rates leave out, said next to them (benchmarks/eta_bench.py)
UNPRICED = ("not priced: locate's geometry proxies, so locate takes several times its estimate; "
            "--calibrate times them")

#: the stages whose jobs are independent of each other, in the order they run (an executor
#: runs a stage's jobs in parallel and waits for all of them before the next stage)
PARALLEL_STAGES = (("locate",), ("targets",), ("sweep",), METHOD_STAGES,
                   ("steps",), ("metrics",), ("frontier",), ("latency",))

def format_schedule(name: str, config: SuiteConfig, devices: int, throughput: Throughput | None = None) -> str:
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
        jobs = [unit_seconds(unit, config, params, throughput) for unit in units if unit.stage in stages] * seeds
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
        (throughput or assumed_throughput(config, params)).describe(params),
    ])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_line(config: SuiteConfig, costs: dict[int, list[float]], throughput: Throughput) -> str:
    """What a run says before it starts: where it runs and roughly how long it takes."""
    total = sum(map(sum, costs.values()))
    seeds = len(costs)
    return (f"running on {config.device} ({config.dtype}); estimated {total / 60:.0f} min for {seeds} "
            f"seed{'s' if seeds > 1 else ''} ({throughput.source}), less for jobs the store already holds")


def stage_estimate(plans: dict[int, list], costs: dict[int, list[float]], throughput: Throughput) -> dict:
    """What a run estimated before it started, as its record keeps it beside its ``timings``:
    each stage's estimated seconds over all seeds, their total, where the rates came from and the
    rates themselves (so that a stage's estimate that missed can be traced to the rate that did)."""
    stages: dict[str, float] = {}
    for seed, plan in plans.items():
        for unit, seconds in zip(plan, costs[seed], strict=True):
            stages[unit.stage] = stages.get(unit.stage, 0.0) + seconds
    rates = {key: value for key, value in asdict(throughput).items() if key != "source"}
    return {"source": throughput.source, "stages": stages, "total_seconds": sum(stages.values()), "rates": rates}
