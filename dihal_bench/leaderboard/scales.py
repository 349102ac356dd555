"""The budget table folded into one line per row: a metric of each row trained at several budget
scales, one column per scale, so that a row reads as its curve on a line (the README's headline
next to the Gen.PPL-against-FLOPs plot). Made from the budget table's own numbers, so the two can
never disagree; the budget table stays the full account (every metric, seeds, PFLOP per scale)."""

from __future__ import annotations

import pandas as pd

from dihal_bench.leaderboard.aggregate import Column, Table, budget_table
from dihal_bench.leaderboard.read import Group

#: the metrics a folded table can show: key -> the words its title and note use
FOLDABLE = {"gen_ppl": "Gen.PPL", "test_nll": "test NLL (nats per token)"}


def scales_table(group: Group, metric: str = "gen_ppl") -> Table | None:
    """``metric`` of each row of the budget table at each of its scales, one column per scale where some
    row has the metric (— in a row that has it not there), then the row's training PFLOP at its lowest
    scale and the scales whose samples the degenerate rule flagged. None where the group has no budget
    table or none of its rows has the metric."""
    budget = budget_table(group)
    if budget is None or f"{metric}_mean" not in budget.numbers:
        return None
    lines = budget.numbers.assign(row=budget.labels["row"], scale=budget.labels["scale"],
                                  degenerate=budget.labels["degenerate"])
    lines = lines[lines[f"{metric}_n"] > 0]
    if lines.empty:
        return None
    scales = sorted(dict.fromkeys(lines["scale"]), key=lambda label: int(label.rstrip("×")))
    rows = list(dict.fromkeys(lines["row"]))
    numbers = pd.DataFrame({"row": rows})
    for scale in scales:
        at = lines[lines["scale"] == scale].set_index("row")
        for stat in ("mean", "std", "n"):
            filler = 0 if stat == "n" else float("nan")
            numbers[f"{scale}_{stat}"] = [at[f"{metric}_{stat}"].get(row, filler) for row in rows]
    lowest = lines.groupby("row", sort=False).first()
    for stat in ("mean", "std", "n"):
        numbers[f"train_pflop_{stat}"] = [lowest[f"train_pflop_{stat}"][row] for row in rows]
    flagged = {row: [f"{scale} ({flag})" for scale, flag in zip(part["scale"], part["degenerate"])
                     if flag not in ("no", "—")] for row, part in lines.groupby("row", sort=False)}
    labels = {"row": rows, "degenerate": ["; ".join(flagged[row]) or "no" for row in rows]}
    numbers = numbers.assign(degenerate=labels["degenerate"])
    columns = [Column("row", "Row", "text"), *(Column(scale, scale) for scale in scales),
               Column("train_pflop", "Train PFLOP (lowest scale)"), Column("degenerate", "Degenerate at", "text")]
    words = FOLDABLE.get(metric, metric)
    note = (f"The budget table's {words}, one column per budget scale s (s × the matched budget's steps: "
            "docs/method.md#budget-scales); — where the row was not trained at that scale. Train PFLOP: at the "
            "row's lowest scale (each scale's own is in the budget table).")
    return Table(f"scales_{metric}", f"{words} at each budget scale", note, numbers, labels, columns, group.seeds)
