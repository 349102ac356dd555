"""Built-in geometry proxies against known answers on synthetic Gaussian clouds."""

import math

import numpy as np
import pytest
import torch
from dihal_builtin import proxies
from dihal_builtin.proxies import _nearest

from dihal_bench.errors import DihalError
from dihal_bench.locate.geometry import preprocess, takes_layer


def gaussian(n: int, scales, seed: int = 0) -> torch.Tensor:
    """n samples of N(0, diag(scales²))."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.as_tensor(scales, dtype=torch.float64)
    return torch.randn(n, len(scales), generator=generator, dtype=torch.float64) * scales


def on_subspace(n: int, r: int, d: int, seed: int = 0) -> torch.Tensor:
    """n standard Gaussian samples on a random r-dimensional linear subspace of R^d."""
    generator = torch.Generator().manual_seed(seed + 1)
    basis, _ = torch.linalg.qr(torch.randn(d, r, generator=generator, dtype=torch.float64))
    return gaussian(n, [1.0] * r, seed) @ basis.T


def registered() -> dict[str, tuple]:
    found = {}
    proxies.register_proxies(register=lambda name, fn, **meta: found.setdefault(name, (fn, meta)))
    return found


def call(fn, hidden: torch.Tensor, layer: int = 3, **constants) -> float:
    """``fn`` as the harness calls it on layer ``layer``: with ``layer=`` where it takes one."""
    return fn(hidden, **constants, **({"layer": layer} if takes_layer(fn) else {}))


def test_registration_names_and_directions():
    directions = {name: meta["higher_is_better"] for name, (_, meta) in registered().items()}
    assert directions == {
        "local_curvature": True,
        "global_monotonicity": True,
        "effective_rank": False,
        "participation_ratio": False,
        "anisotropy": False,
        "twonn_dimension": False,
        "mle_dimension": False,
        "depth": False,
    }


def test_nearest_matches_brute_force_and_excludes_the_query():
    x = gaussian(300, [1.0] * 5, seed=3)
    x[7] = x[11]  # an exact duplicate: a neighbour at distance 0, but never itself
    queries = torch.tensor([7, 0, 299])
    distances, indices = _nearest(x, queries, 4)
    # Brute force from the differences themselves: cdist's default for more than 25 rows
    # expands ‖a−b‖² = ‖a‖² + ‖b‖² − 2a·b, whose cancellation leaves √(eps64·‖a‖²) ≈ 1e-8
    # where the distance is 0, a residue no tolerance tied to float64 should have to absorb.
    all_distances = torch.cdist(x[queries], x, compute_mode="donot_use_mm_for_euclid_dist")
    all_distances[torch.arange(3), queries] = math.inf
    expected_distances, expected_indices = all_distances.sort(dim=1)
    assert torch.equal(indices, expected_indices[:, :4])
    # Both sides are √(Σ of d = 5 squared float64 differences), summed in possibly different
    # orders: each is within (d + 2)·eps64 of the true distance relative to it, so 4·d·eps64
    # relative holds on any machine; a duplicate's 0 is exact on both sides (atol 0).
    d = x.shape[1]
    assert torch.allclose(distances, expected_distances[:, :4], rtol=4 * d * torch.finfo(x.dtype).eps, atol=0)
    assert indices[0, 0] == 11 and distances[0, 0] == 0


def test_effective_rank_and_participation_ratio_of_isotropic_data_are_d():
    x = gaussian(40_000, [1.0] * 8)
    assert proxies.effective_rank(x) == pytest.approx(8, rel=0.05)
    assert proxies.participation_ratio(x) == pytest.approx(8, rel=0.02)


def test_effective_rank_and_participation_ratio_of_rank_r_data_are_r():
    x = on_subspace(40_000, r=3, d=32)
    assert proxies.effective_rank(x) == pytest.approx(3, rel=0.05)
    assert proxies.participation_ratio(x) == pytest.approx(3, rel=0.02)


def test_effective_rank_and_participation_ratio_of_a_known_spectrum():
    # eigenvalues 4, 1, 1, 1, 1: tr Σ / λ_max = 8 / 4, (tr Σ)² / tr Σ² = 64 / 20
    x = gaussian(40_000, [2.0, 1.0, 1.0, 1.0, 1.0])
    assert proxies.effective_rank(x) == pytest.approx(2.0, rel=0.05)
    assert proxies.participation_ratio(x) == pytest.approx(3.2, rel=0.05)


def test_global_monotonicity_of_isotropic_gaussian_is_inverse_variance():
    sigma, ridge = 2.0, 1e-3
    x = gaussian(20_000, [sigma] * 8)
    expected = 1 / (sigma**2 + ridge * sigma**2)  # ε = ridge · tr Σ / d = ridge σ²
    assert proxies.global_monotonicity(x, pairs=4096, ridge=ridge) == pytest.approx(expected, rel=0.03)


def test_global_monotonicity_of_diagonal_gaussian_matches_monte_carlo():
    variances = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    ridge = 0.05
    epsilon = ridge * variances.mean()
    # Δ = h_i − h_j ~ N(0, 2Σ); the Rayleigh quotient's median under the true Σ
    delta_squared = np.random.default_rng(0).normal(size=(200_000, 6)) ** 2 * 2 * variances
    expected = np.median((delta_squared / (variances + epsilon)).sum(1) / delta_squared.sum(1))
    x = gaussian(20_000, np.sqrt(variances))
    assert proxies.global_monotonicity(x, pairs=8192, ridge=ridge) == pytest.approx(expected, rel=0.05)


def test_local_curvature_prefers_tight_neighbourhoods_and_scales_as_inverse_square():
    x = gaussian(2000, [1.0] * 6)
    spread = proxies.local_curvature(x, anchors=256, k=16)
    assert proxies.local_curvature(0.1 * x, anchors=256, k=16) > spread
    assert proxies.local_curvature(3.0 * x, anchors=256, k=16) == pytest.approx(spread / 9, rel=1e-9)


def test_local_curvature_on_a_line_is_set_by_the_neighbour_spacing():
    # evenly spaced points on a line, anchors away from the ends: the 4 nearest other
    # points are at offsets ±1, ±2, whose covariance (divisor 3) is 10 / 3
    x = torch.zeros(101, 3, dtype=torch.float64)
    x[:, 0] = torch.arange(101, dtype=torch.float64)
    interior = x[2:-2]
    assert proxies.local_curvature(interior, anchors=10, k=4) == pytest.approx(3 / 10, rel=1e-12)


@pytest.mark.parametrize("estimator", [proxies.twonn_dimension, proxies.mle_dimension])
@pytest.mark.parametrize("r", [2, 6])
def test_intrinsic_dimension_of_a_linear_subspace(estimator, r):
    x = on_subspace(4000, r=r, d=40, seed=r)
    assert estimator(x) == pytest.approx(r, rel=0.15)


def test_intrinsic_dimension_ignores_a_few_exact_duplicates():
    x = on_subspace(2000, r=4, d=20)
    with_duplicates = torch.cat([x, x[:20]])
    for estimator in (proxies.twonn_dimension, proxies.mle_dimension):
        value = estimator(with_duplicates, max_points=2020)
        assert math.isfinite(value)
        assert value == pytest.approx(estimator(x, max_points=2000), rel=0.05)


def test_anisotropy_of_a_cone_against_an_isotropic_cloud():
    isotropic = gaussian(4000, [1.0] * 16)
    cone = isotropic + torch.tensor([5.0] + [0.0] * 15, dtype=torch.float64)
    assert abs(proxies.anisotropy(isotropic)) < 0.01
    # each cone vector is the shared offset (‖·‖² = 25) plus noise (E‖·‖² = 16), so cos ≈ 25 / 41
    assert proxies.anisotropy(cone) == pytest.approx(25 / 41, rel=0.05)
    one_direction = torch.rand(50, 1, dtype=torch.float64) + 0.1
    assert proxies.anisotropy(one_direction * torch.randn(1, 16, dtype=torch.float64)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("name", sorted(registered()))
def test_proxies_are_invariant_to_rescaling_and_shifting_under_trace_preprocessing(name):
    fn, _ = registered()[name]
    x = gaussian(1200, torch.logspace(0.5, -0.5, 12))
    moved = 1e3 * x + 7.0
    assert call(fn, preprocess(moved, "trace")) == pytest.approx(call(fn, preprocess(x, "trace")), rel=1e-7)


@pytest.mark.parametrize("name", ["local_curvature", "global_monotonicity", "twonn_dimension", "mle_dimension"])
def test_seeded_proxies_are_reproducible_and_depend_on_the_seed(name):
    fn, _ = registered()[name]
    x = gaussian(2500, torch.logspace(0.5, -0.5, 10))
    assert fn(x, seed=1) == fn(x, seed=1)
    assert fn(x, seed=1) != fn(x, seed=2)


def test_every_proxy_returns_a_float_on_float32_input():
    x = gaussian(600, [1.0] * 8).float()
    for name, (fn, _) in registered().items():
        assert isinstance(call(fn, x), float), name


def test_depth_is_the_layer_index_whatever_the_states():
    assert proxies.depth(gaussian(50, [1.0] * 4), layer=7) == 7.0
    assert proxies.depth(gaussian(9, [100.0, 0.0], seed=2), layer=7) == 7.0
    assert proxies.depth(gaussian(50, [1.0] * 4), layer=np.int64(2)) == 2.0
    assert takes_layer(proxies.depth) and not takes_layer(proxies.local_curvature)
    with pytest.raises(DihalError, match="needs the index of the layer"):
        proxies.depth(gaussian(50, [1.0] * 4))
    with pytest.raises(DihalError, match="integer layer index, got True"):
        proxies.depth(gaussian(50, [1.0] * 4), layer=True)


def test_too_few_points_or_neighbours_raise():
    x = gaussian(20, [1.0] * 3)
    with pytest.raises(DihalError, match="k=20"):
        proxies.local_curvature(x, k=20)
    with pytest.raises(DihalError, match="k >= 2"):
        proxies.mle_dimension(x, k=1)
    with pytest.raises(DihalError, match=r"\(N, d\)"):
        proxies.effective_rank(x[0])
