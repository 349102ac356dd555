"""The FLOP count (docs/method.md#counting-compute) against torch's own count of the matmuls run:
each built-in method's training and sampling on a tiny random-weight backbone, under
``torch.utils.flop_counter.FlopCounterMode``, lands within 10% of its account; and a sealed
record's rows are counted at read time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dihal_builtin.baselines.ar2diff_lora import AR2DiffLoRA
from dihal_builtin.baselines.ar_backbone import ARBackbone
from dihal_builtin.baselines.ar_lora import ARLoRA
from dihal_builtin.baselines.ar_scratch import ARScratch
from dihal_builtin.baselines.codar import CoDAR, CoDARNoiseInput
from dihal_builtin.baselines.diffusion_lm import DiffusionLM
from dihal_builtin.baselines.ld4lg import LD4LG, LD4LGNoiseInput
from dihal_builtin.baselines.mdlm import MDLM
from dihal_builtin.baselines.sed import SED, SEDDetachedReadout
from dihal_builtin.bridge import DihalBridge
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from dihal_bench.api.baseline import Baseline
from dihal_bench.api.flops import TRAINED, MethodWork
from dihal_bench.study.compute import bridge_token, loaded_flops, row_compute, stage_compute
from dihal_bench.training.budget import Budget

#: the counts leave out only what is O(d) per token (norms, activations, softmax), which torch's
#: counter leaves out too; 10% covers the expectations a count takes (the sampled softmax's
#: distinct targets, MDLM's denoiser calls) where one run draws its own
TOLERANCE = 0.10
T = 16
BATCH = 8
STEPS = 2
DIFFUSION = {"d_model": 32, "heads": 2, "steps": 4}
EMBEDDED = {**DIFFUSION, "embed_dim": 8, "layers": 2}
DECODERS = {**DIFFUSION, "embed_dim": 8, "denoiser_layers": 2, "decoder_layers": 1, "negatives": 16}
LATENT = {**DIFFUSION, "latents": 4, "latent_dim": 8, "compressor_layers": 1, "decoder_layers": 1,
          "denoiser_layers": 2, "negatives": 16}
LORA = {"rank": 4, "targets": "all-linear"}
METHODS = [
    (DiffusionLM, EMBEDDED),
    # self-conditioning drawn or not per step: fixed at 1 so that one run is its expectation
    (SED, {**EMBEDDED, "self_condition": 1.0}),
    (SEDDetachedReadout, {**EMBEDDED, "self_condition": 0.0}),
    (LD4LG, LATENT),
    (LD4LGNoiseInput, LATENT),
    (CoDAR, DECODERS),
    (CoDARNoiseInput, DECODERS),
    (MDLM, {**DIFFUSION, "layers": 2}),
    (ARScratch, {"d_model": 32, "layers": 2, "heads": 2}),
    (ARBackbone, {}),
    (ARLoRA, LORA),
    (AR2DiffLoRA, {**LORA, "steps": 8}),
]
RECORDS = Path(__file__).resolve().parents[1] / "results"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class WholeRun:
    """FlopCounterMode's module tracker, reduced to the total: torch's own fails on a module called
    under no_grad with a parameter among its inputs (LD4LG's compressor queries), and only the
    total is compared here."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None


def cpu_attention(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def cpu_attention_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


#: torch's counter has no entry for the CPU kernel of scaled_dot_product_attention (it is given shapes): the CUDA
#: kernels' count, given to it
CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_attention_backward}


def counted(run) -> int:
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
    counter.mod_tracker = WholeRun()
    with counter:
        run()
    return counter.get_total_flops()


def within(account: float, measured: float) -> bool:
    return abs(account - measured) <= TOLERANCE * measured


@pytest.fixture(scope="module")
def windows() -> torch.Tensor:
    # every ordinary id of the tiny vocabulary in play, as a corpus of many tokens would have
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, 128, (BATCH * STEPS, T), generator=generator)


@pytest.mark.parametrize(("cls", "options"), METHODS, ids=[cls.name for cls, _ in METHODS])
def test_each_baselines_count_is_the_profilers_within_ten_percent(cls, options, llama_backbone, windows):
    budget = Budget(steps=STEPS, batch_size=BATCH, seq_len=T, lr=1e-3, epochs=1, warmup_frac=0.0)
    model = cls(llama_backbone, budget, seed=0, **options)
    training = counted(lambda: model.fit(windows, progress=False))
    sampling = counted(lambda: model.sample(BATCH, T, seed=0, batch_size=BATCH))
    work = MethodWork(loaded_flops(llama_backbone), model.parameter_counts(), STEPS, BATCH, T, 1, T,
                      {"batch_size": BATCH, **model.sampling_options()}, options)
    account = cls.flop_account(work)
    per_token = sampling / (BATCH * T)
    # shown under -s: docs/method.md#counting-compute quotes these ratios
    print(f"{cls.name}: train {account.train_flops / max(training, 1):.3f}, "
          f"inference {account.inference_flops_per_token / per_token:.3f} of the profiler's count")
    assert within(account.train_flops, training), (account.train_flops, training)
    assert within(account.inference_flops_per_token, per_token), (account.inference_flops_per_token, per_token)


def test_the_bridge_count_is_the_profilers_within_ten_percent(llama_backbone):
    width, options = llama_backbone.width, {"d_model": 32, "layers": 2, "heads": 2}
    bridge = DihalBridge(width, **options)
    cond, target = torch.randn(BATCH, T, width), torch.randn(BATCH, T, width)
    mask = torch.ones(BATCH, T, dtype=torch.bool)
    step = counted(lambda: bridge.loss(cond, target, mask, torch.Generator().manual_seed(0)).backward())
    assert within(TRAINED * BATCH * T * bridge_token(width, options, T), step)
    # one cached position per sampling step: a whole sequence, position by position, at K steps
    steps = 3
    with torch.no_grad():
        cache = bridge.new_sample_cache(steps)
        drawn = counted(lambda: [bridge.sample_step(cond[:, k:k + 1], cache) for k in range(T)])
    per_token = drawn / (BATCH * T)
    print(f"dihal-bridge: train {TRAINED * BATCH * T * bridge_token(width, options, T) / step:.3f}, "
          f"inference {steps * bridge_token(width, options, (T + 1) / 2) / per_token:.3f} of the profiler's count")
    assert within(steps * bridge_token(width, options, (T + 1) / 2), per_token)


@pytest.mark.parametrize("layer", [1, 2])
def test_the_targets_pass_is_the_profilers_within_ten_percent(llama_backbone, windows, layer):
    # the bridge-targets job: layers 1..ℓ over the training windows, once
    with torch.no_grad():
        measured = counted(lambda: llama_backbone.hidden_states(windows, up_to=layer))
    account = windows.numel() * loaded_flops(llama_backbone).layers_forward(layer, T)
    assert within(account, measured), (account, measured)


class Silent(Baseline):
    """A third-party baseline that counts nothing."""

    name = "silent"


def test_a_baseline_that_does_not_count_reads_unknown():
    assert Silent.flop_account(None) is None


@pytest.mark.skipif(not (RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").exists(), reason="record absent")
def test_a_sealed_record_is_counted_at_read_time():
    record = json.loads((RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").read_text())
    seed = record["per_seed"][0]
    rows = {name: row_compute(record, seed, name) for name in seed["methods"]}
    assert rows["reference-human"]["train_flops"] == 0.0
    assert rows["ar-backbone"]["train_flops"] == 0.0
    # the LoRA rival trains through the whole backbone, DiHAL's bridge on stored states
    assert 10 < rows["ar-lora"]["train_flops"] / rows["dihal-chosen"]["train_flops"] < 100
    # cached, one backbone pass per token; uncached, whole-sequence passes
    assert rows["ar2diff-lora"]["inference_flops_per_token"] > 10 * rows["ar-lora"]["inference_flops_per_token"]
    stages = stage_compute(record)
    assert stages["baselines"]["flops_per_second"] > 0


@pytest.mark.skipif(not (RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").exists(), reason="record absent")
def test_a_frontier_point_costs_its_rows_samples_at_its_steps_share_and_their_scoring():
    """A temperature point draws as its row does; a point at half the suite's diffusion steps draws at
    half the row's count; each is scored as a row's samples are (the metrics stage's share per row)."""
    from dihal_bench.study.compute import stage_flops

    record = json.loads((RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").read_text())
    seed = record["per_seed"][0]
    assert "frontier" not in stage_flops(record, seed)  # a run without points has no such stage
    sampling = record["config"]["sampling"]
    seed["frontier"] = [{"method": "ar-lora", "temperature": 0.7},
                        {"method": "ar2diff-lora", "diffusion_steps": sampling["diffusion_steps"] // 2}]
    stages = stage_flops(record, seed)
    scored = sum(1 for row in seed["methods"].values() if row.get("samples"))
    scoring = stages["metrics"] / scored
    tokens = sampling["samples"] * sampling["seq_len"]
    per_token = {name: row_compute(record, seed, name)["inference_flops_per_token"]
                 for name in ("ar-lora", "ar2diff-lora")}
    expected = per_token["ar-lora"] * tokens + per_token["ar2diff-lora"] * tokens / 2 + 2 * scoring
    assert stages["frontier"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.skipif(not (RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").exists(), reason="record absent")
def test_the_latency_job_costs_every_timed_decode_at_its_rows_count():
    """Each timed row decodes once per round (the rivals suite ran 2, before the rounds were kept) 64 tokens
    at batch 1 and at batch 32 (the warm-up is left out); the backbone is the job's reference. Without an
    intact-backbone row the job decodes the backbone itself, at the same count: the total is the same."""
    from dihal_bench.study.compute import stage_flops

    record = json.loads((RECORDS / "rivals-smollm2-135m-20261203T162113Z.json").read_text())
    seed = record["per_seed"][0]
    timed = [name for name, row in seed["methods"].items() if row.get("latency")]
    assert set(timed) == {"dihal-chosen", "control-regressor", "ar-lora", "ar2diff-lora", "ar-backbone"}
    decoded = (1 + 32) * 2 * 64  # tokens per timed row: both batch sizes, both rounds
    expected = sum(row_compute(record, seed, name)["inference_flops_per_token"] for name in timed) * decoded
    assert stage_flops(record, seed)["latency"] == pytest.approx(expected, rel=1e-12)
    del seed["methods"]["ar-backbone"]
    assert stage_flops(record, seed)["latency"] == pytest.approx(expected, rel=1e-12)


def test_a_run_records_each_rows_compute_as_a_reading_would_count_it(tiny_suite_file, tmp_path):
    result = subprocess.run([sys.executable, "-m", "dihal_bench.cli", "run", "--suite", str(tiny_suite_file),
                             "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--quiet"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = (tmp_path / "results").glob("tiny-*.json")
    record = json.loads(path.read_text())
    seed = record["per_seed"][0]
    for name, row in seed["methods"].items():
        recorded = row["compute"]
        assert recorded["train_flops"] is not None and recorded["inference_flops_per_token"] is not None, name
        # a record made before the key was written is counted at read time to the same numbers
        del row["compute"]
        assert row_compute(record, seed, name) == recorded, name
    assert seed["methods"]["dihal-chosen"]["kind"] == "dihal"


def test_the_methods_table_shows_each_rows_compute_counted_from_a_sealed_record():
    from dihal_bench.leaderboard.aggregate import method_table
    from dihal_bench.leaderboard.read import read_groups

    root = Path(__file__).resolve().parent.parent
    group = next(g for g in read_groups(root / "results", lambda message: None) if g.suite == "rivals")
    numbers = method_table(group).numbers.set_index("method")
    train = numbers["train_pflop_mean"]
    # the LoRA rival runs the whole backbone forward and backward: tens of times DiHAL's training compute
    assert 20 < train["ar-lora"] / train["dihal-chosen"] < 60
    assert train["reference-human"] == 0 and numbers.loc["ar2diff-lora", "gflop_per_token_mean"] > 10 * numbers.loc[
        "dihal-chosen", "gflop_per_token_mean"]


@pytest.mark.skipif(not (RECORDS / "sanity-smollm2-135m-20261207T211945Z.json").exists(), reason="record absent")
def test_a_record_whose_metrics_read_no_model_counts_no_scoring_flops():
    """The sanity record's metrics are the chain's counts: its metrics stage ran no evaluator (6 s for
    21 rows), so it counts zero FLOPs, not a Gen.PPL pass it never made."""
    from dihal_bench.study.compute import stage_flops

    record = json.loads((RECORDS / "sanity-smollm2-135m-20261207T211945Z.json").read_text())
    seed = record["per_seed"][0]
    assert stage_flops(record, seed)["metrics"] == 0.0
    record["config"]["metrics"]["names"] = [*record["config"]["metrics"]["names"], "gen_ppl"]
    assert stage_flops(record, seed)["metrics"] > 0
