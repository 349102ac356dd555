"""benchmarks/gpu_check.py's comparison on synthetic run records: a known difference inside and
outside the dtype's tolerance, a mixed-dtype pair, different weights, sampled numbers."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_check  # noqa: E402

LAYERS, VOCAB = 30, 49_152


def entry(dtype: str, *, human_ppl: float = 100.0, score: float = -1.5, loss: float = 0.25,
          weights: str = "abc", latency: float = 4.0) -> dict:
    record = {"per_seed": [{
        "seed": 1,
        "locate": {"layers": [3, 15], "score": [score, 0.5],
                   "proxies": {"effective_rank": {"values": [7.0, 9.0]}}},
        "methods": {
            "reference-human": {"kind": "reference", "metrics": {"gen_ppl": human_ppl, "gen_ppl_sample_mean": 110.0}},
            "dihal-chosen": {"kind": "dihal", "train": {"final_loss": loss, "steps": 6},
                             "metrics": {"gen_ppl": 5000.0}, "latency": {"batch1_ms_per_token": latency}},
        },
    }]}
    return {"suite": "smoke", "dtype": dtype, "layers": LAYERS, "vocab": VOCAB, "weights": weights, "record": record}


def test_the_tolerance_scales_with_the_dtype_s_unit_roundoff():
    float32 = gpu_check.tolerance("relative", ("float32",), LAYERS, VOCAB)
    assert float32 == pytest.approx(gpu_check.ROUNDINGS_PER_LAYER * math.sqrt(LAYERS) * 2.0 ** -24)
    assert gpu_check.tolerance("relative", ("float32", "bfloat16"), LAYERS, VOCAB) == pytest.approx(float32 * 2 ** 16)
    assert gpu_check.tolerance("log", ("float32",), LAYERS, VOCAB) == pytest.approx(float32 * math.log(VOCAB))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_forward_only_difference_inside_the_tolerance_passes_and_one_outside_fails(dtype):
    log_tolerance = gpu_check.tolerance("log", (dtype,), LAYERS, VOCAB)
    inside = gpu_check.compare(entry(dtype), entry(dtype, human_ppl=100.0 * math.exp(0.5 * log_tolerance)))
    assert inside["all_within"] and inside["forward_outside"] == []
    outside = gpu_check.compare(entry(dtype), entry(dtype, human_ppl=100.0 * math.exp(2.0 * log_tolerance)))
    assert not outside["all_within"]
    assert outside["forward_outside"] == ["seed1/reference-human/gen_ppl"]
    row = outside["forward"]["seed1/reference-human/gen_ppl"]
    assert row["difference"] == pytest.approx(2.0 * log_tolerance) and not row["within"]


def test_a_relative_number_uses_the_relative_tolerance():
    tolerance = gpu_check.tolerance("relative", ("float32",), LAYERS, VOCAB)
    result = gpu_check.compare(entry("float32"), entry("float32", score=-1.5 * (1 + 3 * tolerance)))
    assert result["forward_outside"] == ["seed1/locate/score/layer3"]


def test_a_bfloat16_run_against_a_float32_reference_gets_the_bfloat16_tolerance():
    # a difference far outside float32's tolerance but inside bfloat16's
    shifted = 100.0 * math.exp(0.5 * gpu_check.tolerance("log", ("bfloat16",), LAYERS, VOCAB))
    assert not gpu_check.compare(entry("float32"), entry("float32", human_ppl=shifted))["all_within"]
    assert gpu_check.compare(entry("float32"), entry("bfloat16", human_ppl=shifted))["all_within"]


def test_different_weights_are_not_compared():
    result = gpu_check.compare(entry("float32"), entry("float32", weights="other"))
    assert result["comparable"] is False and "weights differ" in result["why"]


def test_sampled_numbers_are_reported_not_held_to_a_tolerance_and_latency_as_a_ratio():
    result = gpu_check.compare(entry("float32"), entry("float32", loss=0.5, latency=1.0))
    assert result["all_within"]  # a trained loss twice as large is the device's random stream, not a failure
    assert result["sampled"]["seed1/dihal-chosen/train/final_loss"]["ratio"] == pytest.approx(2.0)
    assert result["latency_ratio"] == {"seed1/dihal-chosen/batch1_ms_per_token": pytest.approx(0.25)}
    broken = gpu_check.compare(entry("float32"), entry("float32", loss=math.nan))
    assert broken["sampled_not_finite"] == ["seed1/dihal-chosen/train/final_loss"]


def test_a_forward_number_missing_from_one_run_fails_the_comparison():
    other = entry("float32")
    other = copy.deepcopy(other)
    del other["record"]["per_seed"][0]["methods"]["reference-human"]
    result = gpu_check.compare(entry("float32"), other)
    assert not result["all_within"] and "seed1/reference-human/gen_ppl" in result["forward_missing"]
