"""Each run's stages against what it estimated before it started: the estimate, the time each stage
took (its jobs' stored seconds where a resumed run took them from the store), their ratio, and the
FLOPs counted with the rate they were done at (docs/method.md#counting-compute).

A row is one stage of one record, not a pool of seeds: every record is its own run, with its own
estimate and machine, so two runs' stages are never averaged."""

from __future__ import annotations

import math

import pandas as pd

from dihal_bench.leaderboard.aggregate import Column, Table
from dihal_bench.leaderboard.read import Group

#: how far a stage's time may be from its estimate and still count as met: issue 36's 25%
ESTIMATE_TOLERANCE = 0.25
STAGES_NOTE = (
    "One line per stage of each run record of the group (not pooled over seeds: each run has its own "
    "estimate). Estimated: the seconds the run printed before its work started (its first sitting's, which a "
    "resumed run keeps in its store), from rates measured on its machine (--calibrate) or assumed (Rates "
    "column). Took: the stage's compute time, the wall time of the process that finished the run plus the "
    "stored time of every job it took from the store and of every training checkpoint it resumed from, so a "
    "run resumed over several sittings states what its stages cost in all. Took ÷ estimated within 1 ± 0.25 "
    "is marked met. Made here: the share of Took done on the machine that made the estimate (the rest is jobs"
    " another machine, or one not named, did: its speed, not this one's; — where the record does not say; "
    "DiHAL, controls, references and baselines share one figure, since their jobs run as one stage). "
    "PFLOP: the FLOPs counted from the record's shapes (— where a stage's are not counted); GFLOP/s: PFLOP "
    "over Took. Records from before the estimate was kept have no lines."
)
PER_CELL = "Each cell: one run record's value for one stage (records are not pooled here)."


def met_label(ratio: float) -> str:
    if math.isnan(ratio):
        return "—"
    return "met" if abs(ratio - 1.0) <= ESTIMATE_TOLERANCE else ("slower" if ratio > 1 else "faster")


def stage_table(group: Group) -> Table | None:
    """One line per (record, stage) of the group's records that kept an estimate; None where none did."""
    frame = pd.DataFrame(group.rows["stages"])
    if frame.empty:
        return None
    keys = ["estimated_seconds", "seconds", "ratio", "made_here", "pflop", "gflop_per_second"]
    numbers = frame[["record", "stage"]].copy()
    for key in keys:  # one value per line: its own mean, no spread, n 1 where known
        numbers[f"{key}_mean"], numbers[f"{key}_std"] = frame[key], math.nan
        numbers[f"{key}_n"] = frame[key].notna().astype(int)
    labels = {"record": list(frame["record"]), "stage": list(frame["stage"]), "rates": list(frame["rates"]),
              "met": [met_label(ratio) for ratio in frame["ratio"]]}
    numbers = numbers.assign(rates=labels["rates"], met=labels["met"])
    columns = [Column("stage", "Stage", "text"), Column("estimated_seconds", "Estimated (s)"),
               Column("seconds", "Took (s)"), Column("ratio", "Took ÷ estimated"), Column("met", "Within 25%", "text"),
               Column("made_here", "Made here"),
               Column("pflop", "PFLOP", main=False), Column("gflop_per_second", "GFLOP/s", main=False),
               Column("rates", "Rates", "text", main=False), Column("record", "Record", "text", main=False)]
    return Table("stages", "Stages against the estimate", STAGES_NOTE, numbers, labels, columns, 1,
                 per_cell=PER_CELL)
