"""The dry-run schedule: stages of independent jobs over N devices, the critical path, device-hours."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from dihal_bench.config.suite import apply_overrides, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.study import costs, estimate, plan
from dihal_bench.study.store_probe import done_units


def stage_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        if fields and fields[0] in {"/".join(group) for group in estimate.PARALLEL_STAGES}:
            rows[fields[0]] = fields[1:]
    return rows


def test_the_schedule_adds_the_longest_job_of_each_stage_and_spreads_the_rest(monkeypatch):
    # the counts below are pinned here, not read from the diagnostic suite, which may change
    nine = '["diffusion-lm", "sed", "ld4lg", "ld4lg-noise-input", "codar", "codar-noise-input", "mdlm", "ar-scratch", ' \
           '"ar-backbone"]'
    config = apply_overrides(resolve_suite("diagnostic")[1],
                             {"sweep.count": "12", "seeds": "[0, 1]", "methods.baselines": nine})
    # every unit costs one hour, except the sweep's, which cost two: easy arithmetic
    monkeypatch.setattr(estimate, "unit_seconds", lambda unit, config, params, throughput=None: 7200.0 if unit.stage == "sweep" else 3600.0)
    units = plan.seed_units(config)
    per_stage = {group: sum(unit.stage in group for unit in units) for group in estimate.PARALLEL_STAGES}
    assert per_stage[("sweep",)] == 12 and per_stage[("metrics",)] == 16  # 3 DiHAL, 2 controls, 2 references, 9 baselines

    seeds = len(config.seeds)
    assert seeds == 2
    text = estimate.format_schedule("diagnostic", config, 4)
    rows = stage_rows(text)
    # both seeds' sweeps share the devices: 24 jobs of 2 h over 4 devices
    assert rows["sweep"][:2] == ["24", "2.0 h"] and rows["sweep"][2] == "12.0 h"
    assert rows["latency"][:3] == ["2", "60 min", "2.0 h"]  # one job per seed, one after the other
    stages = [group for group in estimate.PARALLEL_STAGES if per_stage[group]]
    critical = sum(2 if group == ("sweep",) else 1 for group in stages) + 1  # + the second seed's latency
    assert f"critical path (unlimited workers): {critical:.1f} h" in text
    hours = sum(per_stage[group] * (2 if group == ("sweep",) else 1) for group in stages) * seeds
    assert f"{hours:.1f} worker-hours in all" in text


def test_more_devices_never_lengthen_the_schedule():
    _, config = resolve_suite("paper")

    def makespan(devices: int) -> float:
        text = estimate.format_schedule("paper", config, devices)
        return float(re.search(r"on \d+ GPUs?: (.+?) h for", text).group(1))

    assert "GPU-hours" in estimate.format_schedule("paper", config, 8)
    hours = [makespan(n) for n in (1, 8, 64)]
    assert hours[0] >= hours[1] >= hours[2]


def test_three_seeds_on_eight_gpus_pack_within_a_tenth_of_perfect():
    """Every seed's jobs of a stage share the GPUs, so the paper suite's three seeds come within 10%
    of their GPU-hours over 8 (the seeds one after another would leave GPUs idle in every
    stage with fewer than 8 jobs)."""
    _, config = resolve_suite("paper")
    assert len(config.seeds) == 3
    text = estimate.format_schedule("paper", config, 8)
    ratio = float(re.search(r"perfectly packed \((\d+\.\d+)x that\)", text).group(1))
    assert 1.0 <= ratio <= 1.10, text


def test_the_schedule_refuses_no_devices_and_says_when_the_size_is_unknown():
    _, config = resolve_suite("smoke")
    with pytest.raises(DihalError, match="at least 1"):
        estimate.format_schedule("smoke", config, 0)
    unknown = dataclasses.replace(config, backbone="some/model-without-a-size")
    assert "cannot schedule" in estimate.format_schedule("smoke", unknown, 2)


def test_the_dry_run_prints_the_schedule_only_when_asked_and_only_as_a_plan():
    from click.testing import CliRunner

    from dihal_bench.cli import cli

    runner = CliRunner()
    planned = runner.invoke(cli, ["run", "--suite", "paper", "--dry-run", "--executor", "ray", "--gpus", "8"])
    assert planned.exit_code == 0, planned.output
    assert "suite paper on 8 GPUs" in planned.output and "critical path (unlimited GPUs)" in planned.output
    plain = runner.invoke(cli, ["run", "--suite", "paper", "--dry-run"])
    assert plain.exit_code == 0 and "critical path" not in plain.output
    refused = runner.invoke(cli, ["run", "--suite", "smoke", "--gpus", "2"])
    assert refused.exit_code == 2 and "--gpus plans a schedule" in refused.output


def test_a_worker_holds_the_backbone_and_a_distinct_evaluator_in_the_suites_dtype():
    smol, gemma = estimate.backbone_parameters("smollm2-135m"), estimate.backbone_parameters("gemma3-270m")
    assert smol and gemma
    _, smoke = resolve_suite("smoke")  # the evaluator is the backbone: held once
    _, diagnostic = resolve_suite("diagnostic")
    _, paper = resolve_suite("paper")  # bfloat16, scored by gpt2-large (its size is known, not in its name)
    assert estimate.worker_memory(smoke) == int(smol * 4)
    assert estimate.worker_memory(diagnostic) == int((smol + gemma) * 4)
    assert estimate.worker_memory(paper) == int((8e9 + 774e6) * 2)
    assert estimate.worker_memory(dataclasses.replace(smoke, evaluator="some/model-without-a-size")) is None


def test_a_streamed_suite_plans_no_extraction_and_counts_the_streaming_in_its_bridge_jobs():
    _, diagnostic = resolve_suite("diagnostic")
    streamed = dataclasses.replace(diagnostic, bridge=dataclasses.replace(diagnostic.bridge, targets="streamed"))
    assert any(unit.stage == "targets" for unit in plan.seed_units(diagnostic))
    assert not any(unit.stage == "targets" for unit in plan.seed_units(streamed))
    sweep = next(unit for unit in plan.seed_units(streamed) if unit.stage == "sweep")
    budget = costs.Budget.from_dict(diagnostic.sweep.budget)
    # half a pass over every trained token, on top of the stored path's evaluation passes
    assert costs.unit_cost(sweep, streamed)[1] - costs.unit_cost(sweep, diagnostic)[1] == \
        budget.steps * budget.tokens_per_step // 2
    assert "streamed" in estimate.format_plan("diagnostic", streamed)
    assert "stored bridge targets" in estimate.format_plan("diagnostic", diagnostic)


def test_the_plan_counts_what_each_baseline_trains():
    _, config = resolve_suite("rivals")
    budget = config.budget
    tokens = budget["steps"] * budget["batch_size"] * budget["seq_len"]
    priced = {unit.label: costs.unit_cost(unit, config) for unit in plan.seed_units(config) if unit.stage == "baselines"}
    assert priced["ar-backbone"][0].endswith("nothing trained") and priced["ar-backbone"][2] == 0
    for lora in ("ar-lora", "ar2diff-lora"):  # every step runs the backbone forward and backward
        what, backbone_tokens, trained_tokens = priced[lora]
        assert "through the backbone" in what and backbone_tokens >= 3 * tokens and trained_tokens == 0



# --- the estimate's rates: assumed, or measured on this machine ---------------------------------


def test_the_assumed_rates_are_the_flops_over_the_assumed_throughput():
    _, config = resolve_suite("diagnostic")
    params = estimate.backbone_parameters(config.backbone)
    scorer = estimate.backbone_parameters(config.evaluator)  # Gemma-3-270M: twice the backbone
    assert scorer > 1.9 * params
    for unit in plan.seed_units(config):
        work = costs.unit_work(unit, config)
        # a bridge's evaluation: three backbone passes per token; a baseline's decodes: decoded tokens
        decoded = work.decode + work.single_tokens + sum(decodes.tokens for decodes in work.baseline_decodes)
        flops = (2 * params * (work.forward + work.extracted + 3 * work.evaluated + decoded) + 2 * scorer * work.evaluator
                 + 6 * (params / 100) * work.trained)
        assert estimate.unit_seconds(unit, config, params) == pytest.approx(flops / estimate.THROUGHPUT["cpu"],
                                                                            rel=1e-12), unit.label


def test_measured_rates_price_each_kind_of_token_at_its_own_rate():
    _, config = resolve_suite("diagnostic")
    rates = estimate.Throughput(forward=1000.0, decode=10.0, evaluator=500.0, trained=2000.0, source="measured here")
    units = {unit.label: unit for unit in plan.seed_units(config)}
    samples = config.sampling.samples * config.sampling.seq_len
    # metrics: the samples under the evaluator alone, and a share of the reference texts' pass, which
    # a seed's 17 metrics jobs do once
    rows = sum(1 for unit in units.values() if unit.stage == "metrics")
    assert rows == 17
    assert estimate.unit_seconds(units["metrics dihal-chosen"], config, None, rates) == \
        pytest.approx((samples + math.ceil(samples / rows)) / 500)
    # DiHAL: its training at the training rate, its validation measures (three backbone passes over the
    # sweep's evaluation windows, as a sweep layer's), its samples decoded
    budget = costs.Budget.from_dict(config.budget)
    evaluated = config.sweep.eval_sequences * budget.seq_len
    for label in ("dihal-chosen", "control-regressor"):
        assert estimate.unit_seconds(units[label], config, None, rates) == \
            pytest.approx(budget.steps * budget.tokens_per_step / 2000 + 3 * evaluated / 1000 + samples / 10)
    assert estimate.unit_seconds(units["control-skip"], config, None, rates) == pytest.approx(samples / 10)
    # a baseline timed by the step and the decode: its steps and its sampling batches at those times;
    # untimed ones by tokens
    timed = dataclasses.replace(rates, baselines={"sed": estimate.BaselineTiming(0.25, 0.01, 3.0, 0.5)})
    batches = -(-config.sampling.samples // config.sampling.batch_size)
    assert estimate.unit_seconds(units["sed"], config, None, timed) == pytest.approx(
        budget.steps * 0.25 + budget.distinct_sequences * 0.01 + batches * 3.0)
    assert estimate.unit_seconds(units["diffusion-lm"], config, None, timed) == \
        estimate.unit_seconds(units["diffusion-lm"], config, None, rates)
    # the latency job: sed's rounds at its timed decodes (one batch and one sequence each), the rest by tokens
    repeats = config.metrics.latency_repeats
    assert estimate.unit_seconds(units["latency"], config, None, timed) == pytest.approx(
        estimate.unit_seconds(units["latency"], config, None, rates)
        - repeats * 2 * config.sampling.seq_len * config.sampling.batch_size / 10 + repeats * (3.0 + 0.5))
    # a hybrid's batch-1 rounds at its timed one-sequence decode: five hybrid rows, two rounds each
    hybrids = len(config.methods.dihal) + len(config.methods.controls)
    single = dataclasses.replace(rates, single_decode=0.5)
    assert estimate.unit_seconds(units["latency"], config, None, single) == pytest.approx(
        estimate.unit_seconds(units["latency"], config, None, rates)
        - hybrids * repeats * config.sampling.seq_len * config.sampling.batch_size / 10 + hybrids * repeats * 0.5)
    # a timed evaluation, targets job and proxies replace the forward passes they were priced as, and
    # price what the assumed rates leave out
    sweep, targets, locate = units["sweep layer 1/29"], units["bridge targets T=64"], units["locate"]
    evaluated = costs.unit_work(sweep, config).evaluated
    measured = dataclasses.replace(rates, evaluated=100.0, extracted=250.0, proxy_seconds=42.0)
    assert estimate.unit_seconds(sweep, config, None, measured) == pytest.approx(
        estimate.unit_seconds(sweep, config, None, rates) - 3 * evaluated / 1000 + evaluated / 100)
    extracted = costs.unit_work(targets, config).extracted
    assert extracted > 0 and estimate.unit_seconds(targets, config, None, rates) == pytest.approx(extracted / 1000)
    assert estimate.unit_seconds(targets, config, None, measured) == pytest.approx(extracted / 250)
    assert estimate.unit_seconds(locate, config, None, measured) == pytest.approx(
        estimate.unit_seconds(locate, config, None, rates) + 42.0)
    text = estimate.format_plan("diagnostic", config, rates)
    assert "time: measured here" in text
    total = sum(estimate.unit_seconds(unit, config, None, rates) for unit in units.values())
    assert f"total: {estimate._duration(total)} per seed" in text


def test_the_dry_run_marks_the_locate_jobs_the_store_holds(tmp_path):
    from dihal_bench.study.run import Run
    from dihal_bench.study.stages.locate import locate_unit

    config = apply_overrides(resolve_suite("diagnostic")[1], {"seeds": "[0, 1]"})
    assert done_units("diagnostic", config, tmp_path) == {"locate": "no"}
    run = Run("diagnostic", config, tmp_path, progress=False)
    store = run.store

    class Finishing:  # runs the seed's real locate job key with a stand-in result
        def run(self, kind, spec, work):
            return store.run(kind, spec, lambda folder: {"stand-in": True})

    run.store = Finishing()
    locate_unit(run, config.seeds[0])
    assert done_units("diagnostic", config, tmp_path) == {"locate": "1 of 2 seeds"}
    locate_unit(run, config.seeds[1])
    assert done_units("diagnostic", config, tmp_path) == {"locate": "yes"}
    text = estimate.format_plan("diagnostic", config, done={"locate": "yes"})
    assert re.search(r"^locate .* yes$", text, re.MULTILINE) and re.search(r"^sweep layer 1/\d+ .* \?$", text, re.MULTILINE)


def test_a_local_checkpoints_size_is_read_from_its_safetensors_headers(tiny_models, tiny_model_dir, tmp_path):
    # tied input/output embeddings are stored, and counted, once: the count the loaded model reports
    assert estimate.backbone_parameters(tiny_model_dir) == tiny_models["gemma3"].num_parameters()
    assert estimate.backbone_parameters(str(tmp_path)) is None  # a directory without weights: unknown
    assert estimate.backbone_parameters("org/Model-7B") == 7e9  # a hub id: the size in its name


def test_a_parameters_hook_that_returns_no_count_is_refused_in_one_line(inline_plugin):
    from dihal_bench import hookimpl

    class Plugin:
        @hookimpl
        def register_backbones(self, register):
            register("odd-size", lambda: None, parameters=lambda: 1.5)

    inline_plugin(Plugin(), "odd-size-backbone")
    with pytest.raises(DihalError, match=r"backbone 'odd-size' .*parameters returned 1.5, not a positive int"):
        estimate.backbone_parameters("odd-size")


def test_metrics_that_read_no_model_are_priced_no_evaluator_pass():
    """The chain's metrics count transitions and n-grams: the sanity suite's metrics jobs cost no
    evaluator tokens; the same suite scored with Gen.PPL does."""
    _, config = resolve_suite("sanity")
    metrics = [unit for unit in plan.seed_units(config) if unit.stage == "metrics"]
    assert metrics and all(costs.unit_work(unit, config).evaluator == 0 for unit in metrics)
    scored = apply_overrides(config, {"metrics.names": '["markov_nll", "gen_ppl"]'})
    assert all(costs.unit_work(unit, scored).evaluator > 0 for unit in metrics)
    # a frontier point is scored as the metrics stage scores a row
    tempered = apply_overrides(config, {"frontier.temperatures": "[0.7]"})
    points = [unit for unit in plan.seed_units(tempered) if unit.stage == "frontier"]
    assert points and all(costs.unit_work(unit, tempered).evaluator == 0 for unit in points)
    tempered = apply_overrides(scored, {"frontier.temperatures": "[0.7]"})
    assert all(costs.unit_work(unit, tempered).evaluator > 0 for unit in points)


def test_a_metric_that_does_not_say_whether_it_reads_the_evaluator_counts_as_reading_it():
    from dihal_bench.registry.plugins import get_registry

    registry = get_registry()
    assert not registry.reads_evaluator(["entropy", "diversity_pooled", "markov_nll"])
    assert registry.reads_evaluator(["entropy", "gen_ppl"])
    assert registry.reads_evaluator(["entropy", "a-metric-no-plugin-registers"])
