"""Built-in geometry proxies: how diffusion-friendly is one layer's hidden-state cloud?

Every proxy is a plain function ``fn(hidden, *, <constants>, seed=0) -> float`` on an
(N, d) tensor of one layer's hidden states, already preprocessed by the harness
(``dihal_bench.locate.geometry.preprocess``; by default centred and scaled to unit average
per-dimension variance). Keyword constants are the proxy's parameters: the harness records
them in the run and lets the user override them. All arithmetic is in float64.

The first three are DiHAL's (arXiv 2605.14368, docs/method.md#locate): local curvature, global
monotonicity and effective rank. The rest are standard estimators of intrinsic dimension
and shape, offered so that users can see whether they predict bridgeability as well, and
``depth``, the reference that any geometry score has to beat.

Global Σ below is the population covariance (1/N), so that after ``trace`` preprocessing
tr Σ / d is exactly 1. Medians are the usual midpoint median and skip NaNs.
"""

from __future__ import annotations

import numbers

import torch

from dihal_bench import hookimpl
from dihal_bench.errors import DihalError

# Bounds the (queries × N) distance block held in memory at once (2**22 float64 = 32 MiB).
_DISTANCE_BLOCK = 2**22


def _float64(hidden: torch.Tensor) -> torch.Tensor:
    if hidden.ndim != 2:
        raise DihalError(f"a proxy needs (N, d) hidden states, got shape {tuple(hidden.shape)}")
    return hidden.detach().to(torch.float64)


def _sample(n: int, count: int, seed: int) -> torch.Tensor:
    """``min(count, n)`` distinct indices in [0, n), reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=generator)[:count]


def _median(values: torch.Tensor) -> float:
    return torch.nanquantile(values, 0.5).item()


def _covariance(x: torch.Tensor) -> torch.Tensor:
    centred = x - x.mean(dim=0)
    return centred.T @ centred / x.shape[0]


def _nearest(x: torch.Tensor, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Euclidean distances (ascending) and indices of the k nearest neighbours of each
    ``x[q]``, q in ``queries``, among the other points of ``x`` (the query point itself is
    never its own neighbour; an exact duplicate of it is, at distance 0).

    Candidates are ranked by squared distances from one matrix product per block of
    queries; the returned distances are then recomputed directly from the differences, so
    that exact duplicates give exactly 0 instead of a rounding residue of ‖x‖².
    """
    if k >= x.shape[0]:
        raise DihalError(f"need more than k={k} points for a k-nearest-neighbour proxy, got N={x.shape[0]}")
    squared_norms = x.square().sum(dim=1)
    rows_per_block = max(1, _DISTANCE_BLOCK // x.shape[0])
    indices = []
    for block in queries.split(rows_per_block):
        squared = squared_norms[block, None] - 2 * x[block] @ x.T + squared_norms[None, :]
        squared[torch.arange(len(block)), block] = torch.inf
        indices.append(squared.topk(k, dim=1, largest=False).indices)
    neighbours = torch.cat(indices)
    distances = (x[neighbours] - x[queries, None, :]).norm(dim=-1)
    distances, order = distances.sort(dim=1)
    return distances, neighbours.gather(1, order)


def local_curvature(hidden: torch.Tensor, *, anchors: int = 512, k: int = 32, seed: int = 0) -> float:
    """DiHAL's local curvature m_curv: median over ``anchors`` random anchor points of
    1 / λ_max(C_i), where C_i is the sample covariance (divisor k−1) of the anchor's k
    nearest neighbours. The anchor itself is not one of its neighbours.

    Higher is more diffusion-friendly (the paper's "local compactness"): small λ_max
    means every neighbourhood is tight in all directions, so a denoiser that lands near
    the right point lands among states that decode alike.

    A k-point covariance has rank ≤ k−1 and its nonzero eigenvalues are those of the
    k × k Gram matrix of the centred neighbours divided by k−1, so each C_i costs a k × k
    eigenproblem instead of a d × d one. A neighbourhood of identical points gives 1/0 =
    inf, which the median tolerates.
    """
    if k < 2:
        raise DihalError(f"local_curvature needs k >= 2 neighbours for a covariance, got k={k}")
    x = _float64(hidden)
    anchor_idx = _sample(x.shape[0], anchors, seed)
    _, neighbours = _nearest(x, anchor_idx, k)
    largest = []
    for block in neighbours.split(64):  # bounds the (anchors, k, d) gather
        points = x[block]
        points = points - points.mean(dim=1, keepdim=True)
        gram = points @ points.mT / (k - 1)
        largest.append(torch.linalg.eigvalsh(gram)[:, -1])
    return _median(1.0 / torch.cat(largest))


def global_monotonicity(hidden: torch.Tensor, *, pairs: int = 2048, ridge: float = 1e-3, seed: int = 0) -> float:
    """DiHAL's global monotonicity m_mono: median over ``pairs`` random pairs i ≠ j of the
    Rayleigh quotient Δᵀ(Σ + εI)⁻¹Δ / ΔᵀΔ, with Δ = h_i − h_j and ε = ridge · tr Σ / d.

    For the Gaussian surrogate U(h) = ½ (h−μ)ᵀ(Σ+εI)⁻¹(h−μ) this quotient is the
    strong-monotonicity constant of ∇U along the pair's direction: higher means a stiffer
    potential, whose Langevin dynamics contract faster, so higher is more diffusion-friendly.

    Σ is diagonalised once; each Δ is projected onto its eigenvectors. Pairs of identical
    points have no direction and are skipped.
    """
    x = _float64(hidden)
    n, d = x.shape
    eigenvalues, eigenvectors = torch.linalg.eigh(_covariance(x))
    eigenvalues = eigenvalues.clamp_min(0)  # rounding can leave tiny negatives
    epsilon = ridge * eigenvalues.sum() / d
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(n, (pairs,), generator=generator)
    second = (first + torch.randint(1, n, (pairs,), generator=generator)) % n  # uniform over j ≠ i
    projected = ((x[first] - x[second]) @ eigenvectors).square()
    quotients = (projected / (eigenvalues + epsilon)).sum(dim=1) / projected.sum(dim=1)
    return _median(quotients)


def effective_rank(hidden: torch.Tensor) -> float:
    """DiHAL's effective rank k_eff = tr Σ / λ_max(Σ) (the stable rank of the centred
    data; not the entropy-based effective rank of Roy & Vetterli 2007).

    Lower is more diffusion-friendly: variance concentrated in few directions means the
    bridge has a low-dimensional target to reconstruct.
    """
    eigenvalues = torch.linalg.eigvalsh(_covariance(_float64(hidden)))
    return (eigenvalues.sum() / eigenvalues[-1]).item()


def participation_ratio(hidden: torch.Tensor) -> float:
    """Participation ratio (tr Σ)² / tr Σ² = (Σλ)² / Σλ², a linear dimension estimate
    widely used for neural population activity (Gao, Trautmann, Yu et al. 2017, "A theory
    of multineuronal dimensionality, dynamics and measurement", bioRxiv 214262).

    It equals d for an isotropic cloud and r for r equal nonzero eigenvalues, but unlike
    tr Σ / λ_max it weighs the whole spectrum, not just its top. Lower is more
    diffusion-friendly, for the same reason as effective rank.
    """
    covariance = _covariance(_float64(hidden))
    return (covariance.trace().square() / covariance.square().sum()).item()


def anisotropy(hidden: torch.Tensor) -> float:
    """Mean cosine similarity over all pairs i ≠ j of the given vectors (Ethayarajh 2019,
    "How Contextual are Contextualized Word Representations?", EMNLP).

    Computed on the vectors as given, not re-centred. Under ``none`` preprocessing this is
    Ethayarajh's anisotropy: near 1 when the states lie in a narrow cone. Under ``trace``
    or ``standardize`` the vectors are centred, so it is near 0 for any symmetric cloud
    and large only for a lopsided one (a dense mass on one side balanced by far outliers,
    as massive activations produce).

    Lower is more diffusion-friendly: the bridge denoises from isotropic Gaussian noise
    and the paper's contraction argument assumes a near log-concave, Gaussian-like target;
    a cone or a lopsided, outlier-balanced cloud is far from that. This direction is our
    reading, not the paper's; a negative score weight flips it.

    Exact and O(N d): with unit vectors u_i, Σ_{i≠j} u_i·u_j = ‖Σ_i u_i‖² − N. Zero
    vectors have no direction and are left out.
    """
    x = _float64(hidden)
    norms = x.norm(dim=1)
    units = x[norms > 0] / norms[norms > 0, None]
    n = units.shape[0]
    return ((units.sum(dim=0).square().sum() - n) / (n * (n - 1))).item()


def twonn_dimension(hidden: torch.Tensor, *, max_points: int = 1024, seed: int = 0) -> float:
    """TwoNN intrinsic dimension (Facco, d'Errico, Rodriguez & Laio 2017, "Estimating the
    intrinsic dimension of datasets by a minimal neighborhood information", Sci. Rep. 7).

    For each point μ = r₂ / r₁, the ratio of its 2nd to 1st nearest-neighbour distance,
    is Pareto distributed with exponent equal to the intrinsic dimension m if the density
    is locally constant; the maximum-likelihood estimate is m = n / Σ log μ_i. (Facco et
    al. fit the empirical CDF instead, discarding the largest 10% of μ; the MLE uses all.)
    ``max_points`` random points (from ``seed``) are the query points, their neighbours
    are searched among all N. Points with an exact duplicate (r₁ = 0) are skipped.

    Lower is more diffusion-friendly: fewer intrinsic degrees of freedom for the bridge
    to reconstruct, the nonlinear counterpart of a low effective rank.
    """
    x = _float64(hidden)
    distances, _ = _nearest(x, _sample(x.shape[0], max_points, seed), 2)
    distances = distances[distances[:, 0] > 0]
    log_ratios = torch.log(distances[:, 1] / distances[:, 0])
    return (log_ratios.numel() / log_ratios.sum()).item()


def mle_dimension(hidden: torch.Tensor, *, k: int = 20, max_points: int = 1024, seed: int = 0) -> float:
    """Maximum-likelihood intrinsic dimension (Levina & Bickel 2004, "Maximum Likelihood
    Estimation of Intrinsic Dimension", NeurIPS), averaged as MacKay & Ghahramani (2005,
    "Comments on 'Maximum Likelihood Estimation of Intrinsic Dimension'") recommend.

    At a point with neighbour distances T_1 ≤ … ≤ T_k the local estimate is
    m_k = [ (1/(k−1)) Σ_{j<k} log(T_k / T_j) ]⁻¹. Averaging the m_k over points is biased
    by their heavy upper tail; MacKay & Ghahramani average the inverses and invert:
    m = [ mean_i 1/m_k(x_i) ]⁻¹. Query points are ``max_points`` random points (from
    ``seed``), neighbours are searched among all N; points with an exact duplicate are
    skipped.

    Lower is more diffusion-friendly, as for ``twonn_dimension``.
    """
    if k < 2:
        raise DihalError(f"mle_dimension needs k >= 2 neighbours, got k={k}")
    x = _float64(hidden)
    distances, _ = _nearest(x, _sample(x.shape[0], max_points, seed), k)
    distances = distances[distances[:, 0] > 0]
    inverse_estimates = torch.log(distances[:, -1:] / distances[:, :-1]).mean(dim=1)
    return (1.0 / inverse_estimates.mean()).item()


def depth(hidden: torch.Tensor, *, layer: int | None = None) -> float:
    """The layer index ℓ itself; lower is better ("shallower is better").

    Not geometry: the reference ranking. Bridgeability falls with depth almost whatever
    the hidden states look like (a shallower target is fewer layers away from the
    embeddings the bridge starts from), so a proxy only informs the choice of ℓ* to the
    extent that it ranks layers better than depth alone. Locate reports it beside every
    proxy but adds it to the score only where a user selects it. The harness passes
    ``layer``; the states are not looked at.
    """
    if layer is None:
        raise DihalError("depth needs the index of the layer being scored (locate passes it as layer=)")
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise DihalError(f"depth needs an integer layer index, got {layer!r}")
    return float(layer)


@hookimpl
def register_proxies(register):
    register("local_curvature", local_curvature, higher_is_better=True,
             description="DiHAL's local compactness: median 1/λ_max of k-nearest-neighbour covariances")
    register("global_monotonicity", global_monotonicity, higher_is_better=True,
             description="DiHAL's global monotonicity: median Rayleigh quotient of the inverse covariance over pairs")
    register("effective_rank", effective_rank, higher_is_better=False,
             description="DiHAL's effective rank: tr Σ / λ_max(Σ), the stable rank of the centred states")
    register("participation_ratio", participation_ratio, higher_is_better=False,
             description="participation ratio (tr Σ)² / tr Σ², a whole-spectrum linear dimension (Gao et al. 2017)")
    register("anisotropy", anisotropy, higher_is_better=False,
             description="mean pairwise cosine similarity of the states as given (Ethayarajh 2019)")
    register("twonn_dimension", twonn_dimension, higher_is_better=False,
             description="TwoNN intrinsic dimension from nearest-neighbour distance ratios (Facco et al. 2017)")
    register("mle_dimension", mle_dimension, higher_is_better=False,
             description="maximum-likelihood intrinsic dimension over k neighbours (Levina & Bickel 2004)")
    register("depth", depth, higher_is_better=False,
             description="the layer index: the shallower-is-better reference, outside the score unless selected")
