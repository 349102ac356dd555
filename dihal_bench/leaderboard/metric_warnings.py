"""The metrics' warnings under a methods table, one line per kind of warning.

A metric warns per method and seed (``<metric>_warning`` in the record): MAUVE warns on every row that
its sample count is too small, with that row's count in the text ("MAUVE on 127 samples per side …",
"… on 128 …"). Read row by row that is one near-identical sentence per distinct count; here warnings
that differ only in their numbers are one kind, said once, with each number that varies given as
its range and the rows it concerns named once ("every method" when it is all of them).
"""

from __future__ import annotations

import re

from dihal_bench.leaderboard.read import Group

#: a number inside a warning's text (what may differ between warnings of one kind)
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def warning_kind(text: str) -> str:
    """The warning with its numbers blanked: warnings of one kind share it."""
    return NUMBER.sub("#", text.rstrip("."))


def merged_text(texts: list[str]) -> str:
    """One warning for several of a kind: each number position as the one value they share, or as
    the range they span."""
    template = NUMBER.split(texts[0].rstrip("."))
    columns = list(zip(*(NUMBER.findall(text.rstrip(".")) for text in texts)))
    numbers = []
    for values in columns:
        low, high = min(values, key=float), max(values, key=float)
        numbers.append(low if float(low) == float(high) else f"{low}–{high}")
    return "".join(part + (numbers[i] if i < len(numbers) else "") for i, part in enumerate(template))


def warning_notes(group: Group) -> list[str]:
    """One note per (metric, kind of warning), naming the methods that carry it once."""
    everyone = {row["method"] for row in group.rows["methods"]}
    kinds: dict[tuple[str, str], tuple[list[str], list[str]]] = {}  # -> (texts, methods)
    for (metric, text), methods in group.warnings.items():
        texts, warned = kinds.setdefault((metric, warning_kind(text)), ([], []))
        texts.append(text)
        warned += [method for method in methods if method not in warned]
    notes = []
    for (metric, _), (texts, warned) in kinds.items():
        which = "every method" if set(warned) == everyone else ", ".join(warned)
        notes.append(f"{group.metrics[metric]['display_name']} warns ({which}): {merged_text(texts)}.")
    return notes
