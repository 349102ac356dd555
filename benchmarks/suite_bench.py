"""Where a suite run's wall-clock goes: the per-stage breakdown of a run record's ``timings``.

Reads run records (default: the newest ``results/diagnostic-*.json``; several ``--record``
paths are pooled, e.g. one record per seed run side by side), or with ``--run`` runs
``dihal-bench run --suite NAME`` (default: smoke) in a fresh temporary folder and reads the
record it writes. Prints each stage's seconds, its share of the total and its seconds per
seed, the time outside the stages, and the slowest stage. Models load lazily, inside the
first stage that needs them (usually locate).

Stages are the plan's (``dihal_bench.study.plan``: locate, targets, sweep, dihal, controls,
references, baselines, steps, metrics, latency), as the record's ``timings`` names them. Jobs
a run found already finished cost close to nothing, so a resumed run's record understates them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import common
from tabulate import tabulate

REPOSITORY = Path(__file__).resolve().parent.parent
#: the plan's stages, in the order a run does them (a record times only those it has)
STAGES = ("locate", "targets", "sweep", "dihal", "controls", "references", "baselines", "steps", "metrics", "latency")
#: for --run --quick: the smoke suite shrunk further (a check that the script works, not a measurement)
QUICK_OVERRIDES = {"locate.tokens": "128", "sweep.layers": "[3]", "sweep.eval_sequences": "2",
                   "methods.dihal": '["chosen"]', "methods.baselines": '["ar-backbone"]',
                   "sampling.samples": "2", "sampling.seq_len": "8", "sampling.batch_size": "2"}


def newest_record(results: Path, suite: str) -> Path:
    records = sorted(results.glob(f"{suite}-*.json"), key=lambda path: path.stat().st_mtime)
    if not records:
        raise SystemExit(f"error: no run record {results}/{suite}-*.json; pass --record PATH or --run")
    return records[-1]


def shown(path: Path) -> str:
    """A record's path as reports keep it: relative to the repository where it is inside it, so no
    report holds the path of the machine it was made on."""
    path = path.resolve()
    return str(path.relative_to(REPOSITORY)) if path.is_relative_to(REPOSITORY) else path.name


def dihal_bench_command() -> list[str]:
    """The ``dihal-bench`` console script of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("dihal-bench")
    found = str(beside) if beside.exists() else shutil.which("dihal-bench")
    if found is None:
        raise SystemExit("error: dihal-bench is not installed in this environment (pip install -e .)")
    return [found]


def run_suite(suite: str, overrides: dict[str, str], work: Path) -> tuple[Path, float]:
    """``dihal-bench run`` into ``work`` (jobs and record), its record and wall-clock seconds."""
    command = [*dihal_bench_command(), "run", "--suite", suite, "--out", str(work / "runs"),
               "--results", str(work / "results"), "--quiet"]
    command += [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    print("running:", " ".join(command), flush=True)
    completed, seconds = common.timed(subprocess.run, command)
    if completed.returncode != 0:
        raise SystemExit(f"error: dihal-bench run exited with status {completed.returncode}")
    return newest_record(work / "results", suite), seconds


def breakdown(records: list[dict]) -> dict:
    """Each stage's seconds, share of the total and seconds per seed over ``records`` pooled; the
    rest and the slowest stage."""
    total = sum(record["timings"]["total_seconds"] for record in records)
    seeds = sum(len(record["seeds"]) for record in records)
    timed = [stage for stage in STAGES if any(stage in record["timings"] for record in records)]
    stages = {stage: sum(record["timings"].get(stage, 0.0) for record in records) for stage in timed}
    stages["other"] = total - sum(stages.values())
    return {
        "stages": {stage: {"seconds": seconds, "share": seconds / total, "seconds_per_seed": seconds / seeds}
                   for stage, seconds in stages.items()},
        "total_seconds": total,
        "total_seconds_per_seed": total / seeds,
        "seeds": seeds,
        "slowest_stage": max(timed, key=lambda stage: stages[stage]),
        # each seed's own stage times, where the record keeps them (records since 2026-12-02)
        "per_seed": {f"{record['created']} seed {entry['seed']}": entry["timings"]
                     for record in records for entry in record["per_seed"] if "timings" in entry},
    }


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--record", type=Path, nargs="+",
                        help="run records, pooled (default: the newest results/diagnostic-*.json)")
    parser.add_argument("--results", type=Path, default=REPOSITORY / "results",
                        help="where to look for the newest record (default: the repository's results/)")
    parser.add_argument("--run", action="store_true", help="run a suite now (in a temporary folder) and read its record")
    parser.add_argument("--suite", default=None, help="the suite to --run (default smoke) or to find in --results "
                                                      "(default diagnostic)")
    args = parser.parse_args()

    wall_seconds = None
    if args.run:
        suite = args.suite or "smoke"
        with tempfile.TemporaryDirectory(prefix="suite-bench-") as work:
            path, wall_seconds = run_suite(suite, QUICK_OVERRIDES if args.quick else {}, Path(work))
            records = [json.loads(path.read_text())]
        paths, source = [], f"fresh `dihal-bench run --suite {suite}`"
    else:
        paths = args.record or [newest_record(args.results, args.suite or "diagnostic")]
        records = [json.loads(path.read_text()) for path in paths]
        source = ", ".join(shown(path) for path in paths)

    record = records[0]
    figures = breakdown(records)
    rows = [[stage, f["seconds"], 100 * f["share"], f["seconds_per_seed"]] for stage, f in figures["stages"].items()]
    rows.append(["total", figures["total_seconds"], 100.0, figures["total_seconds_per_seed"]])
    print(f"suite {record['suite']} on {record['backbone']} ({figures['seeds']} seed(s)), from {source}")
    print(tabulate(rows, headers=["stage", "seconds", "share %", "seconds per seed"], floatfmt=".1f"))
    print(f"slowest stage: {figures['slowest_stage']}")
    if figures["per_seed"]:
        names = list(figures["per_seed"])
        print("\nper seed (seconds):")
        print(tabulate([[stage, *(figures["per_seed"][name].get(stage) for name in names)]
                        for stage in [*STAGES, "total_seconds"] if any(stage in t for t in figures["per_seed"].values())],
                       headers=["stage", *names], floatfmt=".1f", missingval="—"))
    if wall_seconds is not None:
        print(f"command wall-clock {wall_seconds:.1f} s (the record's total plus start-up and imports)")

    common.report("suite_bench", {**figures, "command_wall_seconds": wall_seconds}, {
        "records": [shown(path) for path in paths], "suite": record["suite"], "backbone": record["backbone"],
        "ran": args.run, "overrides": QUICK_OVERRIDES if args.run and args.quick else {},
        "record_environment": record.get("environment"), "quick": args.quick,
        "seconds_per_seed_note": "wall-clock of each record's run; runs made side by side shared the CPU"}, args.json)


if __name__ == "__main__":
    main()
