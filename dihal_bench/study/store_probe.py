"""The dry run's "done" column: which of a plan's jobs the job store already holds, found by
computing their keys through the stages' own code with a store that runs nothing."""

from __future__ import annotations

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.plan import seed_units


class _Probe(Exception):
    """Raised by :class:`_ProbeStore` in place of running a job: its key is all a probe needs."""


class _ProbeStore:
    """A job store that runs nothing: it notes whether the real store holds each job asked for."""

    def __init__(self, store):
        self.store = store
        self.found: list[bool] = []

    def run(self, kind: str, spec: dict, work) -> dict:
        from dihal_bench.study.jobs import RESULT

        self.found.append((self.store.folder(kind, spec) / RESULT).exists())
        raise _Probe


def done_units(suite: str, config: SuiteConfig, out_root) -> dict[str, str]:
    """Per unit label, whether the job store under ``out_root`` holds its finished job for each seed:
    "yes", "no", or "k of n seeds". Only units whose job keys need no earlier stage's result are
    listed: locate's (its key is the config and the seed). Every later key names ℓ*, the swept
    layers or a trained bridge, which only locate's result and the loaded backbone give."""
    from pathlib import Path

    from dihal_bench.study.run import Run
    from dihal_bench.study.stages.locate import locate_unit

    if not (Path(out_root) / suite / "jobs").is_dir():
        return {unit.label: "no" for unit in seed_units(config) if unit.stage == "locate"}
    run = Run(suite, config, Path(out_root), progress=False)
    probe = run.store = _ProbeStore(run.store)
    for seed in config.seeds:
        try:
            locate_unit(run, seed)
        except _Probe:
            pass
    found, seeds = sum(probe.found), len(config.seeds)
    return {"locate": "yes" if found == seeds else "no" if found == 0 else f"{found} of {seeds} seeds"}
