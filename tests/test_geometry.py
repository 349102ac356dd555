"""The harness side of Locate: preprocessing, proxy parameters, z-scores, layer choice."""

import json
import math

import numpy as np
import pytest
import torch
from dihal_builtin import proxies as builtin

from dihal_bench.errors import DihalError
from dihal_bench.locate.geometry import (
    channel_shares,
    check_finite,
    choose_layer,
    depth_spearman,
    evaluate_proxies,
    layer_scores,
    preprocess,
    proxy_params,
    top_channel_share,
    top_channels,
    zscore,
)

C = math.sqrt(1.5)  # z-scores of [1, 2, 3] are [−C, 0, C] (population std √(2/3))


def cloud(n: int, scales, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scales = torch.as_tensor(scales, dtype=torch.float32)
    return torch.randn(n, len(scales), generator=generator) * scales + 3.0


# -- preprocess ---------------------------------------------------------------------------


def test_trace_preprocessing_centres_and_gives_unit_average_variance():
    x = preprocess(cloud(500, [10.0, 1.0, 0.1]), "trace")
    assert x.dtype == torch.float32
    # The float32 output is rounded (u = eps32/2 relative, |x| ≲ 6 here) and torch sums 500
    # values in float32: the mean is within ~log2(500)·u·6 ≈ 3e-6 of 0 and the mean square
    # within ~12u ≈ 7e-7 of 1, on any machine.
    assert torch.allclose(x.mean(dim=0), torch.zeros(3), atol=1e-5)
    assert x.square().mean().item() == pytest.approx(1.0, rel=1e-5)
    # a scalar rescaling keeps the shape: dimension ratios survive
    stds = x.std(dim=0)
    assert (stds[0] / stds[1]).item() == pytest.approx(10.0, rel=0.1)


def test_standardize_gives_unit_variance_per_dimension_and_tolerates_constant_ones():
    x = cloud(500, [10.0, 1.0, 0.0])
    out = preprocess(x.double(), "standardize")
    assert out.dtype == torch.float64
    variances = out.square().mean(dim=0)
    assert torch.allclose(variances[:2], torch.ones(2, dtype=torch.float64))
    assert torch.equal(out[:, 2], torch.zeros(500, dtype=torch.float64))


def test_none_preprocessing_keeps_values():
    x = cloud(10, [1.0, 2.0]).to(torch.bfloat16)
    out = preprocess(x, "none")
    assert out.dtype == torch.float32
    assert torch.equal(out, x.float())


def test_preprocessing_errors():
    with pytest.raises(DihalError, match="unknown preprocessing 'whiten'"):
        preprocess(cloud(10, [1.0]), "whiten")
    with pytest.raises(DihalError, match="constant"):
        preprocess(torch.ones(10, 4), "trace")


# -- checks and parameters -----------------------------------------------------------------


def test_check_finite_names_the_layer():
    x = cloud(10, [1.0, 1.0])
    check_finite(x, 7)
    for bad in (math.nan, math.inf):
        x[3, 1] = bad
        with pytest.raises(DihalError, match="^layer 7 has NaN or inf hidden states$"):
            check_finite(x, 7)


def toy_proxy(hidden, *, k=5, scale=2.0, seed=0):
    return float(hidden.shape[0] * scale)


def test_proxy_params_resolves_defaults_overrides_and_the_run_seed():
    assert proxy_params(toy_proxy, {}, seed=11) == {"k": 5, "scale": 2.0, "seed": 11}
    assert proxy_params(toy_proxy, {"k": 9}, seed=11) == {"k": 9, "scale": 2.0, "seed": 11}
    assert proxy_params(toy_proxy, {"seed": 3}, seed=11)["seed"] == 3
    assert proxy_params(builtin.effective_rank, {}, seed=11) == {}


def test_proxy_params_rejects_an_unknown_key_naming_proxy_and_key():
    with pytest.raises(DihalError, match=r"proxy 'curv' has no parameter 'kk'; its parameters: k, scale, seed"):
        proxy_params(toy_proxy, {"kk": 3}, seed=0, name="curv")
    with pytest.raises(DihalError, match="'toy_proxy'"):
        proxy_params(toy_proxy, {"kk": 3}, seed=0)


# -- z-scores, scores, choice --------------------------------------------------------------


def test_zscore_uses_population_std_and_maps_equal_values_to_zero():
    assert np.allclose(zscore([1.0, 2.0, 3.0]), [-C, 0.0, C])
    assert np.array_equal(zscore([4.0, 4.0, 4.0]), np.zeros(3))
    assert np.array_equal(zscore([0.1 + 0.2, 0.3, 0.3]), np.zeros(3))  # equal up to rounding


def test_layer_scores_hand_computed_with_signs_and_weights():
    raw = {"curv": [1.0, 2.0, 3.0], "k_eff": [2.0, 1.0, 3.0]}
    better = {"curv": True, "k_eff": False}
    scores, z = layer_scores(raw, better)
    assert np.allclose(z["curv"], [-C, 0.0, C]) and np.allclose(z["k_eff"], [0.0, -C, C])
    assert np.allclose(scores, [-C, C, 0.0])  # z(curv) − z(k_eff)
    assert choose_layer([1, 2, 3], scores) == 2

    scores, _ = layer_scores(raw, better, weights={"curv": 2.0})
    assert np.allclose(scores, [-2 * C, C, C])
    assert choose_layer([1, 2, 3], scores) == 2  # tie between layers 2 and 3


def test_layer_scores_errors():
    with pytest.raises(DihalError, match="'mono'"):
        layer_scores({"curv": [1.0, 2.0]}, {"curv": True}, weights={"mono": 1.0})
    with pytest.raises(DihalError, match="different numbers of layers"):
        layer_scores({"a": [1.0, 2.0], "b": [1.0]}, {"a": True, "b": True})
    with pytest.raises(DihalError, match="'a' has NaN"):
        layer_scores({"a": [1.0, math.nan]}, {"a": True})


def test_choose_layer_breaks_ties_toward_the_shallower_layer():
    assert choose_layer([1, 2, 3], [1.0, 3.0, 3.0]) == 2
    assert choose_layer([9, 5, 2], [1.0, 3.0, 3.0]) == 2  # layer order, not list order
    assert choose_layer([4, 6], [3.0 + 1e-13, 3.0]) == 4
    assert choose_layer([4, 6], [3.0, 3.0 + 1e-13]) == 4
    assert choose_layer([4, 6], [3.0, 3.0 + 1e-9]) == 6
    with pytest.raises(DihalError):
        choose_layer([1, 2], [1.0])


# -- evaluate_proxies ----------------------------------------------------------------------

SMALL = {  # the DiHAL proxies plus one more, with constants small enough for a fast test
    "local_curvature": (builtin.local_curvature, True),
    "global_monotonicity": (builtin.global_monotonicity, True),
    "effective_rank": (builtin.effective_rank, False),
    "twonn_dimension": (builtin.twonn_dimension, False),
}
SMALL_OVERRIDES = {"local_curvature": {"anchors": 128, "k": 16}, "global_monotonicity": {"pairs": 512}}


def layers_of_different_shape() -> dict[int, torch.Tensor]:
    return {
        1: cloud(600, [1.0] * 12, seed=1),
        2: cloud(600, torch.logspace(1, -1, 12), seed=2),
        3: cloud(600, [5.0, 5.0] + [0.2] * 10, seed=3),
    }


def evaluate(hidden_by_layer, preprocessing="trace", seed=0, overrides=SMALL_OVERRIDES, **kwargs):
    return evaluate_proxies(hidden_by_layer, SMALL, overrides, preprocessing, seed, **kwargs)


def test_evaluate_proxies_record_is_json_and_complete():
    hidden = layers_of_different_shape()
    record = evaluate({3: hidden[3], 1: hidden[1], 2: hidden[2]}, seed=5, progress=True)
    assert json.loads(json.dumps(record)) == record
    assert record["layers"] == [1, 2, 3] and record["preprocessing"] == "trace"
    curvature = record["proxies"]["local_curvature"]
    assert curvature["higher_is_better"] is True
    assert curvature["params"] == {"anchors": 128, "k": 16, "seed": 5}
    assert record["proxies"]["effective_rank"]["params"] == {}
    expected = builtin.local_curvature(preprocess(hidden[2]), anchors=128, k=16, seed=5)
    assert curvature["values"][1] == expected


def test_score_and_choice_are_invariant_to_rescaling_a_layer_under_trace():
    hidden = layers_of_different_shape()
    rescaled = {**hidden, 2: 1000.0 * hidden[2]}

    def scores_of(record):
        raw = {name: p["values"] for name, p in record["proxies"].items()}
        better = {name: p["higher_is_better"] for name, p in record["proxies"].items()}
        return layer_scores(raw, better)[0]

    before, after = evaluate(hidden), evaluate(rescaled)
    # Equal up to float32 rounding: 1000·h and preprocess's float32 output are each rounded
    # (u = eps32/2 relative), so the proxies see inputs ≤ 2u apart. rel 1e-5 ≈ 170u leaves
    # room for the proxies' small condition numbers (measured: < 1u), and as these layers'
    # values differ by O(1) the z-scores pass the error on unmagnified.
    for name in SMALL:
        assert after["proxies"][name]["values"] == pytest.approx(before["proxies"][name]["values"], rel=1e-5)
    assert np.allclose(scores_of(after), scores_of(before), rtol=0, atol=1e-5)
    assert choose_layer([1, 2, 3], scores_of(after)) == choose_layer([1, 2, 3], scores_of(before))
    # without normalisation the scale leaks into the proxies, which is what trace prevents
    raw_before, raw_after = evaluate(hidden, "none"), evaluate(rescaled, "none")
    assert raw_after["proxies"]["local_curvature"]["values"][1] < 1e-3 * raw_before["proxies"]["local_curvature"]["values"][1]


def test_evaluate_proxies_is_reproducible_from_the_seed():
    hidden = layers_of_different_shape()
    assert evaluate(hidden, seed=1) == evaluate(hidden, seed=1)
    assert evaluate(hidden, seed=1)["proxies"]["local_curvature"]["values"] != evaluate(hidden, seed=2)["proxies"]["local_curvature"]["values"]


def test_evaluate_proxies_errors():
    hidden = layers_of_different_shape()
    nan_layer = {**hidden, 2: hidden[2].clone()}
    nan_layer[2][10, 3] = math.nan
    with pytest.raises(DihalError, match="^layer 2 has NaN or inf hidden states$"):
        evaluate(nan_layer)
    with pytest.raises(DihalError, match="unknown preprocessing 'pca'"):
        evaluate(hidden, "pca")
    few = {layer: h[:16] for layer, h in hidden.items()}
    with pytest.raises(DihalError, match=r"'local_curvature' needs more than k=16 tokens per layer, got N=16"):
        evaluate(few)
    with pytest.raises(DihalError, match=r"proxy 'global_monotonicity' has no parameter 'k'"):
        evaluate(hidden, overrides={"global_monotonicity": {"k": 3}})
    with pytest.raises(DihalError, match="unknown proxy in parameter overrides 'curvature'"):
        evaluate(hidden, overrides={"curvature": {"k": 3}})
    with pytest.raises(DihalError, match="layer 1: hidden states are constant"):
        evaluate({1: torch.ones(600, 12)})


# -- controls: one outlier channel, and depth -------------------------------------------------


def outlier_layers(shares_of_std=(30.0, 10.0, 3.0, 1.0), d: int = 16, n: int = 800) -> dict[int, torch.Tensor]:
    """Layers 1..4 of isotropic states plus one channel (7) whose std falls with depth: the
    outlier channel of a real residual stream, with every other direction the same."""
    return {layer: cloud(n, [scale if j == 7 else 1.0 for j in range(d)], seed=layer)
            for layer, scale in enumerate(shares_of_std, start=1)}


def test_top_channel_share_is_the_known_variance_share():
    # population variances 100 and 15 × 1: the share is 100 / 115, up to sampling noise of the
    # variance estimates (relative std √(2/n) ≈ 1.6% at n = 8000, so 5% is > 3σ)
    x = cloud(8000, [10.0] + [1.0] * 15, seed=4)
    share, channel = top_channel_share(x)
    assert channel == 0 and share == pytest.approx(100 / 115, rel=0.05)
    assert top_channel_share(1e3 * x + 5)[0] == pytest.approx(share, rel=1e-9)  # a property of the shape
    assert top_channel_share(cloud(8000, [1.0] * 16, seed=5))[0] == pytest.approx(1 / 16, rel=0.2)
    with pytest.raises(DihalError, match="constant"):
        top_channel_share(torch.ones(10, 4))
    shares = channel_shares(outlier_layers())
    assert shares["layers"] == [1, 2, 3, 4] and shares["top_channel"][:3] == [7, 7, 7]
    assert shares["top_channel_share"] == sorted(shares["top_channel_share"], reverse=True)


def test_trace_drop_top_removes_the_largest_variance_channels():
    x = cloud(2000, [1.0, 9.0, 1.0, 5.0, 1.0, 1.0], seed=2)
    assert top_channels(x, 2) == [1, 3]
    dropped = preprocess(x, "trace-drop-top", drop_top=2)
    kept = preprocess(x[:, [0, 2, 4, 5]], "trace")
    assert dropped.shape == (2000, 4) and torch.equal(dropped, kept)
    assert torch.equal(preprocess(x, "trace-drop-top", drop_top=0), preprocess(x, "trace"))
    with pytest.raises(DihalError, match="would remove every one of the 6"):
        preprocess(x, "trace-drop-top", drop_top=6)
    with pytest.raises(DihalError, match="non-negative integer"):
        preprocess(x, "trace-drop-top", drop_top=-1)


def test_an_outlier_channel_decides_the_trace_score_but_not_the_standardised_one():
    layers = outlier_layers()
    rank = {"effective_rank": (builtin.effective_rank, False)}

    def ranks(mode, **kwargs):
        return evaluate_proxies(layers, rank, {}, mode, 0, **kwargs)["proxies"]["effective_rank"]["values"]

    # under trace the effective rank follows the outlier: one dominant channel, rank near 1
    assert ranks("trace") == sorted(ranks("trace"))
    assert ranks("trace")[0] < 2.0 < 12.0 < ranks("trace")[-1]
    # standardised, or with the outlier removed, every layer is isotropic: tr Σ / λ_max is then
    # d / (1 + √(d/n))² at the Marchenko–Pastur edge (12.3 for d = 16, 11.6 for d = 15 at
    # n = 800), for every layer alike; 0.85–1.15 of it leaves several times the edge's
    # fluctuation at this n
    for mode, d in (("standardize", 16), ("trace-drop-top", 15)):
        values = ranks(mode, drop_top=1) if mode == "trace-drop-top" else ranks(mode)
        edge = d / (1 + math.sqrt(d / 800)) ** 2
        assert all(0.85 * edge < v < 1.15 * edge for v in values), (mode, values)


def test_depth_spearman_is_plus_one_for_a_score_falling_with_depth():
    assert depth_spearman([1, 2, 3, 4], [4.0, 3.0, 2.0, -1.0]) == pytest.approx(1.0)
    assert depth_spearman([1, 2, 3, 4], [-4.0, 3.0, 3.5, 9.0]) == pytest.approx(-1.0)
    assert depth_spearman([1, 2, 3], [1.0, 1.0, 1.0]) is None
    assert depth_spearman([1, 2], [2.0, 1.0]) is None


def test_a_proxy_taking_layer_receives_the_layer_index():
    seen = []

    def by_layer(hidden, *, layer=None):
        seen.append(layer)
        return float(layer)

    record = evaluate_proxies(outlier_layers(), {"depth": (by_layer, False)}, {}, "trace", 0)
    assert seen == [1, 2, 3, 4] and record["proxies"]["depth"]["values"] == [1.0, 2.0, 3.0, 4.0]
    assert record["proxies"]["depth"]["params"] == {}  # the layer is not a constant of the run
    with pytest.raises(DihalError, match="'layer' receives the index"):
        evaluate_proxies(outlier_layers(), {"depth": (by_layer, False)}, {"depth": {"layer": 2}}, "trace", 0)
