"""What each unit of a plan costs, in tokens of each kind (batched backbone forwards, decoded
tokens, evaluator forwards, trained tokens), counted from the suite alone; ``estimate`` turns them
into seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dihal_bench.config.settings import SuiteConfig, SweepSettings
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.plan import FrontierPoint, Unit, method_names, scaled_budget, split_scale, target_budgets
from dihal_bench.training.budget import Budget

#: validation windows assumed for ``sweep.eval_sequences = "all"``, which the plan cannot count
#: without the corpus (the embedded stdlib-docs validation split has 162 windows of 64 tokens)
ALL_WINDOWS_ESTIMATE = 160

def eval_windows(sweep: SweepSettings) -> int:
    return ALL_WINDOWS_ESTIMATE if sweep.eval_sequences == "all" else sweep.eval_sequences

@dataclass(frozen=True)
class BaselineDecodes:
    """A baseline's sampling in a unit: ``batches`` decodes of the suite's sampling batch and
    ``singles`` of one sequence, each ``seq_len`` tokens; ``tokens`` is what the assumed rates
    price them as (a calibration times the baseline's own decode of each)."""

    name: str
    batches: int
    singles: int
    tokens: int


@dataclass(frozen=True)
class Work:
    """What a unit costs, by the kind of token, since each kind runs at its own rate: batched
    forwards of the frozen backbone, tokens decoded one position at a time by a hybrid, evaluator
    forwards, and tokens a trainable part is trained on; and the kinds of work a calibration times
    as a whole (a baseline's step and decodes, a bridge's evaluation, a bridge-targets job, locate's proxies)."""

    detail: str
    forward: int = 0
    decode: int = 0
    evaluator: int = 0
    trained: int = 0
    #: a baseline's training, which a calibration may have timed by the step: its name, steps and
    #: distinct training windows (what its fit prepares before the first step)
    baseline: str | None = None
    steps: int = 0
    windows: int = 0
    #: baselines' decodes, priced at each one's own timed decode when calibrated
    baseline_decodes: tuple[BaselineDecodes, ...] = ()
    #: a hybrid's decodes of one sequence (the latency job's batch-1 rounds): priced at the timed
    #: one-sequence decode when calibrated, else as ``single_tokens`` decoded tokens
    single_decodes: int = 0
    single_tokens: int = 0
    #: tokens of the validation windows a bridge is evaluated on (bridgeability, the hybrid's and the
    #: skip control's perplexity, KL): three backbone passes each unless an evaluation was timed
    evaluated: int = 0
    #: tokens of a bridge-targets job: a forward pass to the deepest kept layer, the states kept and
    #: written (at the forward rate unless the job's own work was timed)
    extracted: int = 0
    #: locate's geometry proxies over every candidate layer (not priced unless timed)
    proxies: bool = False

    @property
    def backbone_tokens(self) -> int:
        return (self.forward + self.extracted + self.decode + self.single_tokens + self.evaluator
                + 3 * self.evaluated + sum(d.tokens for d in self.baseline_decodes))

def unit_cost(unit: Unit, config: SuiteConfig) -> tuple[str, int, int]:
    """(what it does, tokens through the frozen backbone, tokens trained) for the estimate."""
    work = unit_work(unit, config)
    return work.detail, work.backbone_tokens, work.trained

def unit_work(unit: Unit, config: SuiteConfig) -> Work:
    """A unit's :class:`Work` (what :func:`unit_cost` sums)."""
    locate, sweep, sampling = config.locate, config.sweep, config.sampling
    budget = scaled_budget(Budget.from_dict(config.budget), unit.scale)
    sweep_budget = Budget.from_dict(sweep.budget)
    samples = sampling.samples * sampling.seq_len
    label = split_scale(unit.label)[0]
    if unit.stage == "locate":
        return Work(f"N={locate.tokens} tokens x all layers, {len(locate.proxies)} proxies", forward=locate.tokens * 2,
                    proxies=True)
    if unit.stage == "targets":
        length = unit.seq_len
        needed = max(b.distinct_sequences for b in target_budgets(config) if b.seq_len == length)
        return Work("one forward pass over the training subset, stored", extracted=needed * length)
    if unit.stage == "sweep":
        return Work(f"{sweep_budget.steps} steps{streamed(config)}",
                    evaluated=eval_windows(sweep) * sweep_budget.seq_len,
                    forward=streamed_tokens(config, sweep_budget),
                    trained=sweep_budget.steps * sweep_budget.tokens_per_step)
    if unit.stage == "dihal" or label == "control-regressor":
        # the trained bridge is evaluated as a sweep's is (bridgeability, perplexities, KL)
        return Work(f"{budget.steps} steps{streamed(config)} + {sampling.samples} samples",
                    forward=streamed_tokens(config, budget), decode=samples,
                    evaluated=eval_windows(sweep) * budget.seq_len, trained=budget.steps * budget.tokens_per_step)
    if label == "control-skip":
        return Work(f"{sampling.samples} samples, nothing trained", decode=samples)
    if unit.stage == "references":
        return Work(f"{sampling.samples} texts drawn, no model")
    if unit.stage == "steps":
        # Gen.PPL alone: one scoring pass over the point's samples, no reference texts
        return Work(f"bridgeability + {sampling.samples} samples + Gen.PPL",
                    evaluated=eval_windows(sweep) * budget.seq_len, decode=samples, evaluator=samples)
    if unit.stage == "baselines":
        registration = get_registry().items["baseline"].get(label)
        method = None if registration is None else registration.obj
        decodes = (BaselineDecodes(label, math.ceil(sampling.samples / sampling.batch_size), 0, samples),)
        if method is not None and not method.in_budget:
            return Work(f"{sampling.samples} samples, nothing trained", baseline_decodes=decodes)
        trained = budget.steps * budget.tokens_per_step
        if method is not None and method.trains_through_backbone:
            # a forward and a backward pass of the whole backbone per step: about three forward passes
            return Work(f"{budget.steps} steps through the backbone + {sampling.samples} samples",
                        forward=3 * trained, baseline_decodes=decodes, baseline=label, steps=budget.steps,
                        windows=budget.distinct_sequences)
        return Work(f"up to {budget.steps} steps + {sampling.samples} samples", trained=trained,
                    baseline_decodes=decodes, baseline=label, steps=budget.steps,
                    windows=budget.distinct_sequences)
    if unit.stage == "frontier":
        return frontier_work(unit.point, config)
    if unit.stage == "metrics":
        scored = scored_tokens(config)
        if not scored:
            return Work(f"{sampling.samples} samples, counted without a model")
        # the reference texts' pass is done once per seed (a worker keeps it), not once per job
        rows = len(method_names(config))  # one metrics job per row of the methods table
        return Work(f"{sampling.samples} samples under the evaluator", evaluator=scored + math.ceil(scored / rows))
    return latency_work(config)


def scored_tokens(config: SuiteConfig) -> int:
    """The evaluator tokens of scoring one row's samples with the suite's metrics: none where no metric
    of the suite runs the evaluator (each says so with ``reads_evaluator``)."""
    if not get_registry().reads_evaluator(config.metrics.names):
        return 0
    return config.sampling.samples * config.sampling.seq_len


def frontier_work(point: FrontierPoint, config: SuiteConfig) -> Work:
    """A frontier point: the row's samples drawn again at the point's setting (a baseline's decodes
    priced at its own, scaled by the point's steps over the suite's), then scored as in the metrics stage."""
    sampling = config.sampling
    samples = sampling.samples * sampling.seq_len
    key, value = point.setting
    scored = f"{sampling.samples} samples at {key.replace('_', ' ')} {value:g}, scored"
    if point.kind != "baseline":
        return Work(scored, decode=samples, evaluator=scored_tokens(config))
    share = value / sampling.diffusion_steps if key == "diffusion_steps" else 1.0
    batches = math.ceil(math.ceil(sampling.samples / sampling.batch_size) * share)
    return Work(scored, evaluator=scored_tokens(config),
                baseline_decodes=(BaselineDecodes(point.name, batches, 0, math.ceil(samples * share)),))


def latency_work(config: SuiteConfig) -> Work:
    """The latency job: every method that decodes (and the intact backbone, unless a baseline is
    it) decodes ``seq_len`` tokens at batch 1 and at the batch size, once per round. Calibrated, a
    baseline's decodes are priced at its own timed decodes and a hybrid's at the hybrid's timed
    decodes of a batch and of one sequence. The assumed rates take a decode step to cost about the
    same at batch 1 as at the batch size (on a CPU its cost is reading the weights), so each batch-1
    decode is priced as a batch decode. The short warm-up decode is left out."""
    sampling, repeats = config.sampling, config.metrics.latency_repeats
    registry = get_registry().items["baseline"]
    baselines = [name for name in config.methods.baselines if name in registry]
    # a row at another budget scale is the same network: latency times the scale-1 rows alone
    hybrids = [name for name in method_names(config)
               if not name.startswith("reference-") and name not in baselines and split_scale(name)[1] == 1]
    intact = any(getattr(registry[name].obj, "intact_backbone", False) for name in baselines)
    batch = repeats * sampling.seq_len * sampling.batch_size  # one round's batch decode, over the rounds
    singles = (len(hybrids) + (0 if intact else 1)) * repeats
    return Work(f"{repeats} timed decodes per method, at batch 1 and {sampling.batch_size}",
                decode=singles * sampling.seq_len * sampling.batch_size, single_decodes=singles,
                single_tokens=singles * sampling.seq_len * sampling.batch_size,
                baseline_decodes=tuple(BaselineDecodes(name, repeats, repeats, 2 * batch) for name in baselines))


def streamed(config: SuiteConfig) -> str:
    return ", targets streamed" if config.bridge.streams_targets else ""

def streamed_tokens(config: SuiteConfig, budget: Budget) -> int:
    """Backbone tokens a bridge job adds when its targets are streamed: every step runs its batch
    through layers 1..ℓ, counted as half a full pass (ℓ is unknown before locate)."""
    return budget.steps * budget.tokens_per_step // 2 if config.bridge.streams_targets else 0
