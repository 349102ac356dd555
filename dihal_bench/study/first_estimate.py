"""The estimate a run printed before its first sitting, kept in its job store.

A run resumed over several sittings prices the whole plan again each time it starts, at the rates
of the machine it starts on. Its record must be checked against what was said before any of its work
was done, not against a figure made after most of it had been timed, so the first sitting's estimate is
stored as a job (kept by ``store prune``, carried with the store) and every later sitting takes it
from there. The machine that made it is named, so that the stages table can say how much of each
stage was done elsewhere."""

from __future__ import annotations

from datetime import datetime, timezone

from dihal_bench.base.provenance import machine, same_machine
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.jobs import JobStore

#: the job kind of a kept estimate (``estimate-<16 hex digits>`` in the store)
KIND = "estimate"


def first_estimate(store: JobStore, suite: str, config: SuiteConfig, estimate: dict) -> tuple[dict, bool]:
    """(the estimate of the first sitting of the run of ``suite`` under ``config``, whether that is
    this sitting): ``estimate``, this sitting's, is stored with the machine that made it and when
    if the store holds none for these seeds and settings (a changed config is another run)."""
    made = []

    def kept_here(_folder) -> dict:
        made.append(True)
        return {**estimate, "machine": machine(),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    kept = store.run(KIND, {"suite": suite, "config": config.to_dict()}, kept_here)
    return kept, bool(made)


def kept_line(kept: dict) -> str:
    """What a resumed run says about the estimate its record keeps."""
    here = same_machine(kept.get("machine") or {}, machine())
    return (f"the record keeps the estimate of this run's first sitting: {kept['total_seconds'] / 60:.0f} min, "
            f"made {kept['created']} on {'this' if here else 'another'} machine ({kept['source']})")
