"""The series a located result ranks layers by, read at chosen layers: what both the sweep's rank
correlations and the leaderboard's rank tables compare with bridgeability."""

from __future__ import annotations

from collections.abc import Callable


def located_series(located: dict, layers: list[int], number: Callable[[object], float] = float
                   ) -> dict[str, list[float]]:
    """Each series of ``located`` (locate's result) at ``layers``, signed so that higher is better:
    S(ℓ) as ``score``, each recorded proxy, ``depth`` (−ℓ), and each other preprocessing's S(ℓ)
    as ``score[<mode>]``. ``number`` reads each recorded value (the leaderboard's checks a record's)."""
    index = {layer: i for i, layer in enumerate(located["layers"])}
    at = [index[layer] for layer in layers]
    series = {"score": [number(located["score"][i]) for i in at]}
    for name, proxy in located["proxies"].items():
        sign = 1.0 if proxy["higher_is_better"] else -1.0
        series[name] = [sign * number(proxy["values"][i]) for i in at]
    series["depth"] = [-float(layer) for layer in layers]
    for name, variant in (located.get("variants") or {}).items():
        if name != located["preprocessing"]:
            series[f"score[{name}]"] = [number(variant["score"][i]) for i in at]
    return series
