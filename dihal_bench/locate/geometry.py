"""Locate: preprocess each layer's hidden states, run the geometry proxies, score the layers.

docs/method.md#locate. For candidate layers ℓ, every proxy p gives a value m_p(ℓ); these are
z-scored across layers and combined as

    S(ℓ) = Σ_p w_p · sign_p · z(m_p)(ℓ),   sign_p = +1 if higher is better, else −1,

which with DiHAL's three proxies and unit weights is z(m_curv) + z(m_mono) − z(k_eff).
The chosen layer is ℓ* = argmax S, ties going to the shallower layer (the cheaper prefix
to replace). This module knows nothing about models: it takes tensors and proxy functions.

Scalar (``trace``) preprocessing keeps every hidden dimension at its own weight, so a single
outlier channel holding most of a layer's variance can decide every proxy at once;
:func:`top_channel_share` measures that, and ``trace-drop-top`` removes the k
largest-variance channels before rescaling, to show what the proxies say without them.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable

import numpy as np
import scipy.stats
import torch
from tqdm import tqdm

from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.locate.defaults import PREPROCESSING_MODES

#: channels ``trace-drop-top`` removes unless told otherwise
DROP_TOP_DEFAULT = 4

#: scores this close count as a tie
TIE_TOLERANCE = 1e-12

Proxy = Callable[..., float]


def preprocess(hidden: torch.Tensor, mode: str = "trace", drop_top: int = DROP_TOP_DEFAULT) -> torch.Tensor:
    """One layer's (N, d) hidden states, made comparable across layers.

    - ``trace``: centre by the mean, divide by the scalar √(tr Σ / d), so the average
      per-dimension variance is 1 and proxies see shape, not the residual stream's norm.
    - ``standardize``: centre, divide each dimension by its own standard deviation
      (dimensions with zero spread are left at 0).
    - ``trace-drop-top``: remove the ``drop_top`` channels (hidden dimensions) of largest
      variance (:func:`top_channels`), then ``trace`` on the d − k that remain.
    - ``none``: as given.

    Σ is the population covariance (1/N). Statistics are computed in float64; the result
    is float64 if the input was, else float32.
    """
    if mode not in PREPROCESSING_MODES:
        raise unknown_name("preprocessing", mode, PREPROCESSING_MODES)
    if hidden.ndim != 2:
        raise DihalError(f"hidden states must have shape (N, d), got {tuple(hidden.shape)}")
    out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    if mode == "none":
        return hidden.to(out_dtype)
    x = hidden.to(torch.float64)
    x = x - x.mean(dim=0)
    variances = x.square().mean(dim=0)
    if mode == "trace-drop-top":
        kept = torch.ones(x.shape[1], dtype=torch.bool)
        kept[_top_of(variances, drop_top)] = False
        x, variances = x[:, kept], variances[kept]
        mode = "trace"
    if mode == "trace":
        mean_variance = variances.mean()
        if mean_variance == 0:
            raise DihalError("hidden states are constant: 'trace' preprocessing cannot rescale them")
        x = x / mean_variance.sqrt()
    else:
        stds = variances.sqrt()
        x = x / torch.where(stds > 0, stds, torch.ones_like(stds))
    return x.to(out_dtype)


def check_drop_top(k, width: int | None = None) -> int:
    """``k`` as the number of channels ``trace-drop-top`` removes: an int in [0, width)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise DihalError(f"drop_top must be a non-negative integer (channels to remove), got {k!r}")
    if width is not None and k >= width:
        raise DihalError(f"drop_top={k} would remove every one of the {width} hidden dimensions")
    return int(k)


def channel_variances(hidden: torch.Tensor) -> torch.Tensor:
    """Population variance of each hidden dimension of (N, d) states, in float64."""
    if hidden.ndim != 2:
        raise DihalError(f"hidden states must have shape (N, d), got {tuple(hidden.shape)}")
    x = hidden.to(torch.float64)
    return (x - x.mean(dim=0)).square().mean(dim=0)


def _top_of(variances: torch.Tensor, k: int) -> torch.Tensor:
    k = check_drop_top(k, variances.numel())
    # a stable sort, so equal variances give the lower channel index on every machine
    return torch.sort(variances, descending=True, stable=True).indices[:k]


def top_channels(hidden: torch.Tensor, k: int) -> list[int]:
    """The ``k`` channels of largest variance, largest first (ties to the lower index):
    the ones ``trace-drop-top`` removes."""
    return _top_of(channel_variances(hidden), k).tolist()


def top_channel_share(hidden: torch.Tensor) -> tuple[float, int]:
    """The share of the layer's total variance, max_j Σ_jj / tr Σ, held by its
    largest-variance channel, and that channel. It is the same before and after ``trace``
    preprocessing (a scalar rescaling), and is 1/d for isotropic states. Near 1, one
    channel sets tr Σ, λ_max and every distance, so scalar-preprocessed proxies follow it."""
    variances = channel_variances(hidden)
    total = variances.sum()
    if total == 0:
        raise DihalError("hidden states are constant: they have no variance to share")
    channel = int(variances.argmax())  # the first of equal maxima: the lower index
    return (variances[channel] / total).item(), channel


def check_finite(hidden: torch.Tensor, layer: int) -> None:
    if not torch.isfinite(hidden).all():
        raise DihalError(f"layer {layer} has NaN or inf hidden states")


#: the proxy parameter that receives the index of the layer being scored (not a constant)
LAYER_PARAMETER = "layer"


def takes_layer(fn: Proxy) -> bool:
    """Whether ``fn`` has a parameter named ``layer`` after the tensor, to which the harness
    passes the index of the layer it is scoring."""
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    return any(p.name == LAYER_PARAMETER and p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters)


def proxy_params(fn: Proxy, overrides: dict, seed: int, name: str | None = None) -> dict:
    """The keyword constants ``fn`` will be called with: its defaults, updated by
    ``overrides``, with ``seed`` set to the run's seed if ``fn`` takes one (an explicit
    ``seed`` override wins). The first parameter is the hidden states and is not a constant;
    nor is ``layer``, which changes from layer to layer (see :func:`run_proxy`) and so is
    neither recorded nor overridable.
    """
    name = name or getattr(fn, "__name__", repr(fn))
    parameters = [p for p in list(inspect.signature(fn).parameters.values())[1:] if p.name != LAYER_PARAMETER]
    params = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    if "seed" in {p.name for p in parameters}:
        params["seed"] = seed
    if LAYER_PARAMETER in overrides and takes_layer(fn):
        raise DihalError(f"proxy {name!r}: parameter 'layer' receives the index of the layer being scored "
                         "and cannot be set")
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    accepted = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD}
    for key in overrides:
        if key not in accepted and not takes_any:
            known = ", ".join(sorted(accepted)) or "(none)"
            raise DihalError(f"proxy {name!r} has no parameter {key!r}; its parameters: {known}")
    return {**params, **overrides}


def zscore(values) -> np.ndarray:
    """(v − mean) / std across layers, population std; all-equal values give zeros."""
    v = np.asarray(values, dtype=np.float64)
    std = v.std()
    if std <= TIE_TOLERANCE * max(np.abs(v).max(initial=0.0), np.finfo(np.float64).tiny):
        return np.zeros_like(v)
    return (v - v.mean()) / std


def layer_scores(
    raw: dict[str, list[float]],
    higher_is_better: dict[str, bool],
    weights: dict[str, float] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """S(ℓ) = Σ_p w_p · sign_p · z(raw_p)(ℓ). Returns the scores (one per layer, in the
    order of the value lists) and each proxy's plain, unsigned z-scores. Proxies missing
    from ``weights`` weigh 1."""
    if not raw:
        raise DihalError("no proxies to score layers with")
    weights = weights or {}
    for name in weights:
        if name not in raw:
            raise unknown_name("proxy in score weights", name, raw)
    lengths = {len(values) for values in raw.values()}
    if len(lengths) != 1:
        raise DihalError(f"proxies were evaluated on different numbers of layers: {sorted(lengths)}")
    z = {}
    scores = np.zeros(lengths.pop())
    for name, values in raw.items():
        if not np.all(np.isfinite(values)):
            raise DihalError(f"proxy {name!r} has NaN or inf values; cannot score layers")
        z[name] = zscore(values)
        sign = 1.0 if higher_is_better[name] else -1.0
        scores += weights.get(name, 1.0) * sign * z[name]
    return scores, z


def choose_layer(layers: list[int], scores) -> int:
    """argmax of the scores; scores within TIE_TOLERANCE of the best go to the shallowest layer."""
    if len(layers) == 0 or len(layers) != len(scores):
        raise DihalError(f"need one score per layer, got {len(scores)} scores for {len(layers)} layers")
    best = max(scores)
    return min(layer for layer, score in zip(layers, scores) if score >= best - TIE_TOLERANCE)


def check_proxy_setup(
    proxies: dict[str, tuple[Proxy, bool]],
    overrides: dict[str, dict],
    preprocessing: str,
    seed: int,
    tokens: int,
    drop_top: int = DROP_TOP_DEFAULT,
) -> dict[str, dict]:
    """Validate a proxy run before any work is done; returns each proxy's resolved params."""
    if preprocessing not in PREPROCESSING_MODES:
        raise unknown_name("preprocessing", preprocessing, PREPROCESSING_MODES)
    check_drop_top(drop_top)
    for name in overrides:
        if name not in proxies:
            raise unknown_name("proxy in parameter overrides", name, proxies)
    params = {name: proxy_params(fn, overrides.get(name, {}), seed, name) for name, (fn, _) in proxies.items()}
    for name, p in params.items():
        if "k" in p and tokens <= p["k"]:
            raise DihalError(f"proxy {name!r} needs more than k={p['k']} tokens per layer, got N={tokens}")
    return params


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _as_number(value) -> float | None:
    """``value`` as a float if it is one real number (a Python or NumPy scalar, or a
    one-element tensor or array), else None. Booleans and complex numbers are not."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        return float(value.item())
    return None


def run_proxy(name: str, fn: Proxy, hidden: torch.Tensor, params: dict, layer: int, origin: str | None = None) -> float:
    """``fn(hidden, **params)`` as a finite float, with ``layer=layer`` added if ``fn`` takes
    a ``layer`` parameter. Whatever goes wrong inside a proxy, often
    a third-party plugin's, becomes one DihalError line naming the proxy, where it comes
    from (``origin``, e.g. "plugin spectral_gap from dihal-bench-spectral-gap 0.1.0") and
    the layer, instead of a traceback out of the middle of locate."""
    where = f"proxy {name!r}" + (f" ({origin})" if origin else "")
    extra = {LAYER_PARAMETER: layer} if takes_layer(fn) else {}
    try:
        value = fn(hidden, **params, **extra)
    except DihalError as error:
        raise DihalError(f"{where} failed on layer {layer}: {error}") from None
    except Exception as error:
        raise DihalError(f"{where} failed on layer {layer}: {_one_line(error)}") from error
    number = _as_number(value)
    if number is None:
        shape = f" of shape {tuple(value.shape)}" if hasattr(value, "shape") else ""
        raise DihalError(f"{where} returned a {type(value).__name__}{shape} on layer {layer}, not a number")
    if not math.isfinite(number):
        raise DihalError(f"{where} returned {number} on layer {layer}")
    return number


def evaluate_proxies(
    hidden_by_layer: dict[int, torch.Tensor],
    proxies: dict[str, tuple[Proxy, bool]],
    overrides: dict[str, dict],
    preprocessing: str,
    seed: int,
    progress: bool = False,
    origins: dict[str, str] | None = None,
    drop_top: int = DROP_TOP_DEFAULT,
) -> dict:
    """Preprocess each layer, check it is finite, and run every proxy on it.

    ``proxies`` maps name -> (fn, higher_is_better); ``overrides`` maps proxy name ->
    parameter overrides; ``origins`` optionally maps proxy name -> where it comes from,
    for error messages (see :func:`run_proxy`); ``drop_top`` is k of ``trace-drop-top``.
    Returns a JSON-serialisable record::

        {"layers": [...], "preprocessing": mode,
         "proxies": {name: {"higher_is_better": bool, "params": {...}, "values": [...]}}}

    with ``values`` in the order of ``layers`` (ascending). Under ``trace-drop-top`` it also
    holds ``drop_top`` (k) and ``dropped_channels``, each layer's k removed channels.
    """
    if not hidden_by_layer:
        raise DihalError("no layers to evaluate proxies on")
    layers = sorted(hidden_by_layer)
    fewest = min(hidden_by_layer[layer].shape[0] for layer in layers)
    params = check_proxy_setup(proxies, overrides, preprocessing, seed, fewest, drop_top)
    dropping = preprocessing == "trace-drop-top"

    values = {name: [] for name in proxies}
    dropped = []
    label = "geometry proxies" + ("" if preprocessing == "trace" else f" ({preprocessing})")
    for layer in tqdm(layers, desc=label, unit="layer", disable=not progress):
        hidden = hidden_by_layer[layer]
        check_finite(hidden, layer)
        try:
            if dropping:
                dropped.append(top_channels(hidden, drop_top))
            hidden = preprocess(hidden, preprocessing, drop_top)
        except DihalError as error:
            raise DihalError(f"layer {layer}: {error}") from None
        for name, (fn, _) in proxies.items():
            values[name].append(run_proxy(name, fn, hidden, params[name], layer, (origins or {}).get(name)))

    record = {
        "layers": layers,
        "preprocessing": preprocessing,
        "proxies": {
            name: {"higher_is_better": bool(better), "params": params[name], "values": values[name]}
            for name, (_, better) in proxies.items()
        },
    }
    if dropping:
        record |= {"drop_top": drop_top, "dropped_channels": dropped}
    return record


def channel_shares(hidden_by_layer: dict[int, torch.Tensor]) -> dict:
    """Per layer (ascending), :func:`top_channel_share`: ``{"layers", "top_channel_share",
    "top_channel"}``."""
    layers = sorted(hidden_by_layer)
    shares = []
    for layer in layers:
        try:
            shares.append(top_channel_share(hidden_by_layer[layer]))
        except DihalError as error:
            raise DihalError(f"layer {layer}: {error}") from None
    return {"layers": layers, "top_channel_share": [share for share, _ in shares],
            "top_channel": [channel for _, channel in shares]}


def depth_spearman(layers: list[int], scores) -> float | None:
    """Spearman ρ of the scores with −ℓ, the ``depth`` reference ranking (shallower is
    better): +1 when S(ℓ) orders the layers exactly by depth, shallow first. None when the
    scores are all equal (no ranking) or there are fewer than 3 layers."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(layers) != len(scores):
        raise DihalError(f"need one score per layer, got {len(scores)} scores for {len(layers)} layers")
    if len(scores) < 3 or np.all(scores == scores[0]):
        return None
    return float(scipy.stats.spearmanr(scores, -np.asarray(layers, dtype=np.float64)).statistic)
