"""locate end to end on tiny random-weight backbones, and the example third-party proxy plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench.errors import DihalError
from dihal_bench.locate.pipeline import (
    LocateConfig,
    locate,
    summary_lines,
    table_rows,
    write_outputs,
)
from dihal_bench.registry.resolve import load_corpus

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PLUGIN = REPO / "plugins" / "examples" / "dihal-bench-spectral-gap"


@pytest.fixture
def tiny_backbone(tiny_models, char_tokenizer):
    return HFBackbone(tiny_models["qwen3"], char_tokenizer, "tiny-qwen3")


def small_config(**changes) -> LocateConfig:
    base = dict(tokens=256, seq_len=32, params={"local_curvature": {"anchors": 64, "k": 8}})
    return LocateConfig(**{**base, **changes})


def test_locate_scores_every_candidate_layer_and_picks_the_argmax(tiny_backbone, text_dir):
    result = locate(tiny_backbone, load_corpus(str(text_dir)), small_config(), progress=False)
    assert result["layers"] == [1, 2, 3]  # 1..L-1 of a 4-layer model
    signed = sum(e["weight"] * (1 if e["higher_is_better"] else -1) * np.array(e["z"])
                 for e in result["proxies"].values())
    assert np.allclose(signed, result["score"])
    # depth is measured as a reference, outside the score
    assert result["proxies"]["depth"]["values"] == [1.0, 2.0, 3.0] and not result["proxies"]["depth"]["in_score"]
    assert all(result["proxies"][name]["in_score"] for name in ("local_curvature", "effective_rank"))
    assert result["chosen_layer"] == result["layers"][int(np.argmax(result["score"]))]
    assert result["proxies"]["local_curvature"]["params"] == {"anchors": 64, "k": 8, "seed": 0}
    assert result["tokens_sampled"] == 256 and result["config"]["preprocessing"] == "trace"


def test_locate_reports_each_preprocessing_and_the_top_channel(tiny_backbone, text_dir):
    result = locate(tiny_backbone, load_corpus(str(text_dir)), small_config(drop_top=2), progress=False)
    variants = result["variants"]
    assert list(variants) == ["trace", "standardize", "trace-drop-top"]
    assert variants["trace"]["score"] == result["score"]  # the configured one is the choice itself
    assert variants["trace"]["chosen_layer"] == result["chosen_layer"]
    for entry in variants.values():
        assert len(entry["score"]) == 3 and entry["chosen_layer"] in (1, 2, 3)
    assert variants["trace-drop-top"]["drop_top"] == 2
    assert all(len(channels) == 2 for channels in variants["trace-drop-top"]["dropped_channels"])
    assert all(1 / tiny_backbone.width <= share <= 1 for share in result["top_channel_share"])
    lines = summary_lines(result)
    assert lines[0].startswith("ℓ* by preprocessing: trace ") and "trace-drop-top(k=2)" in lines[0]
    assert lines[1].startswith("top channel: ")
    headers, rows = table_rows(result)
    assert "score[standardize]" in headers and "top share" in headers and len(rows) == 3
    with pytest.raises(DihalError, match="unknown preprocessing variant 'pca'"):
        locate(tiny_backbone, load_corpus(str(text_dir)), small_config(variants=("pca",)), progress=False)


def test_locate_is_reproducible_from_the_seed(tiny_backbone, text_dir):
    corpus = load_corpus(str(text_dir))
    first = locate(tiny_backbone, corpus, small_config(seed=3), progress=False)
    again = locate(tiny_backbone, corpus, small_config(seed=3), progress=False)
    other = locate(tiny_backbone, corpus, small_config(seed=4), progress=False)
    assert first["score"] == again["score"]
    assert first["proxies"]["local_curvature"]["values"] != other["proxies"]["local_curvature"]["values"]


def test_locate_names_a_layer_with_nan_hidden_states(tiny_backbone, text_dir, monkeypatch):
    real = tiny_backbone.hidden_states

    def poisoned(input_ids, attention_mask=None):
        states = real(input_ids, attention_mask)
        states[2] = states[2].clone().fill_(float("nan"))
        return states

    monkeypatch.setattr(tiny_backbone, "hidden_states", poisoned)
    with pytest.raises(DihalError, match="layer 2 has NaN or inf"):
        locate(tiny_backbone, load_corpus(str(text_dir)), small_config(), progress=False)


def test_locate_refuses_too_few_layers_and_too_few_tokens(tiny_models, char_tokenizer, text_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0, eos_token_id=1)
    shallow = HFBackbone(LlamaForCausalLM(config), char_tokenizer, "two-layers")
    corpus = load_corpus(str(text_dir))
    with pytest.raises(DihalError, match="has 2 layers; locate needs at least 3"):
        locate(shallow, corpus, small_config(), progress=False)
    deep = HFBackbone(tiny_models["llama"], char_tokenizer, "tiny")
    with pytest.raises(DihalError, match=r"needs more than k=8 tokens per layer, got N=8"):
        locate(deep, corpus, small_config(tokens=8), progress=False)
    with pytest.raises(DihalError, match="exceeds the .* token positions"):
        locate(deep, corpus, small_config(tokens=10**6), progress=False)


def test_write_outputs_writes_json_csv_png(tiny_backbone, text_dir, tmp_path):
    result = locate(tiny_backbone, load_corpus(str(text_dir)), small_config(), progress=False)
    paths = write_outputs(result, tmp_path / "out")
    assert [p.name for p in paths] == ["locate.json", "locate.csv", "locate.png"]
    assert json.loads(paths[0].read_text())["chosen_layer"] == result["chosen_layer"]
    lines = paths[1].read_text().splitlines()
    assert lines[0].startswith("layer,local_curvature,z(local_curvature)") and len(lines) == 1 + 3
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_preprocessing_makes_the_choice_invariant_to_layer_scale(tiny_backbone, text_dir, monkeypatch):
    corpus = load_corpus(str(text_dir))
    plain = locate(tiny_backbone, corpus, small_config(), progress=False)
    real = tiny_backbone.hidden_states
    monkeypatch.setattr(tiny_backbone, "hidden_states",
                        lambda ids, mask=None: [h * (10.0 ** i) for i, h in enumerate(real(ids, mask))])
    scaled = locate(tiny_backbone, corpus, small_config(), progress=False)
    assert scaled["chosen_layer"] == plain["chosen_layer"]
    # Equal up to float32 rounding only: 10**i is no power of two, so h·10**i is rounded
    # (≤ u = eps32/2 relative per element) and preprocess rounds its float64 result back to
    # float32 (another u), so the proxies see inputs ≤ 2u apart. They are medians of ratios
    # and extreme eigenvalues of sums of those inputs (float64 inside), which pass such an
    # error on with a small condition number: allow each raw value 16u = 8·eps32 relative
    # (about 1u is typical), then carry that through the z-scores, which magnify it where a
    # proxy's values barely differ between layers.
    rho = 8 * float(np.finfo(np.float32).eps)
    tolerance = sum(abs(entry["weight"]) * zscore_error_bound(entry["values"], rho)
                    for entry in plain["proxies"].values())
    assert np.all(np.abs(np.subtract(scaled["score"], plain["score"])) <= tolerance)


def zscore_error_bound(values: list[float], rho: float) -> np.ndarray:
    """How far each z-score across layers can move when every value moves by at most ``rho``
    of itself. With M = max|v|: |Δv|, |Δmean| ≤ ρM and |Δstd| ≤ 2ρM, so for z = (v − mean)/std
    |Δz| ≤ 2ρ(M/std)(1 + |z|) to first order in ρ."""
    v = np.asarray(values, dtype=np.float64)
    z = (v - v.mean()) / v.std()
    return 2 * rho * np.abs(v).max() / v.std() * (1 + np.abs(z))


# --- the example plugin, installed for real, used by the CLI ------------------------------------


@pytest.fixture(scope="module")
def example_plugin_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(EXAMPLE_PLUGIN)], check=True, capture_output=True)
    return site


def run_cli(*args, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site or ""), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "dihal_bench.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_example_plugin_proxy_is_used_by_locate_all(example_plugin_site, tiny_model_dir, text_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli("locate", "--backbone", tiny_model_dir, "--corpus", str(text_dir), "--tokens", "128",
                     "--seq-len", "32", "--proxies", "all", "--param", "local_curvature.k=8",
                     "--param", "local_curvature.anchors=32", "--param", "mle_dimension.k=8",
                     "--quiet", "--out", str(out), site=example_plugin_site)
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "locate.json").read_text())
    assert "spectral_gap" in record["proxies"] and "twonn_dimension" in record["proxies"]
    assert "ℓ* =" in result.stdout


def test_locate_cli_bad_input_is_one_line_and_writes_nothing(tiny_model_dir, text_dir, tmp_path):
    out = tmp_path / "run"
    unknown = run_cli("locate", "--backbone", tiny_model_dir, "--corpus", str(text_dir), "--proxies", "nope",
                      "--out", str(out))
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines()[-1].startswith("Error: unknown proxy 'nope'")
    assert "Traceback" not in unknown.stderr
    few = run_cli("locate", "--backbone", tiny_model_dir, "--corpus", str(text_dir), "--tokens", "16",
                  "--seq-len", "32", "--quiet", "--out", str(out))
    assert few.returncode == 2 and "needs more than k=32 tokens" in few.stderr
    assert not out.exists()
