"""The degenerate-sample rule (`dihal_bench.numerics.degenerate`) applied to a record's seed entry:
which rows collapsed on that seed, judged against the seed's own held-out text."""

from __future__ import annotations

from dihal_bench.numerics.degenerate import is_degenerate

#: the rows a run draws from the corpus: held-out text (what the rule compares with) and i.i.d.
#: unigram tokens (what a degenerate row is scored as in a Gen.PPL comparison)
HELD_OUT, UNIGRAM = "reference-human", "reference-unigram"


def entropy(row: dict | None) -> float | None:
    return ((row or {}).get("metrics") or {}).get("entropy")


def seed_flags(entry: dict) -> dict[str, bool | None]:
    """Method -> whether its samples on this seed are degenerate (None: not judged, the seed has no
    held-out row or the method no entropy)."""
    held_out = entropy(entry["methods"].get(HELD_OUT))
    return {name: is_degenerate(entropy(row), held_out) for name, row in entry["methods"].items()}


def degenerate_seeds(entries: list[tuple[str, dict]], method: str) -> list[int]:
    """The seeds, in pooling order, on which ``method``'s samples are degenerate."""
    return [entry["seed"] for _, entry in entries if seed_flags(entry).get(method)]


def flag_label(entries: list[tuple[str, dict]], method: str) -> str:
    """The methods table's cell: "seeds 2, 3", "no", or "—" where no seed could be judged."""
    judged = [seed_flags(entry).get(method) for _, entry in entries if method in entry["methods"]]
    flagged = degenerate_seeds(entries, method)
    if flagged:
        return ("seed " if len(flagged) == 1 else "seeds ") + ", ".join(map(str, flagged))
    return "no" if any(flag is False for flag in judged) else "—"
