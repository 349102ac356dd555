"""How well a run's estimate holds: each stage's estimated seconds against the seconds the run
then took, for one suite (default: smoke) run in a fresh temporary job store; or, with
``--record PATH``, for a run already made: the estimate the run itself made before it started
(``own``, kept in records since they carry one; the one to read, since it was made on the same
machine under the same load), and the estimate of the record's configuration now (assumed rates,
and rates measured on this machine with ``--calibrate``), each against the stage times it recorded.

The estimate is the one ``dihal-bench run`` prints before its work starts, from rates measured
on this machine by ``dihal_bench.study.calibration.calibrate`` (a few seconds), and the assumed
FLOP/s (``--dry-run`` without ``--calibrate``) beside it. The measured seconds are the run
record's ``timings``: each stage's units' compute time, summed over seeds. A ratio of 1.00 is a
perfect estimate; the issue's bar is within 25% (0.80-1.25) per stage. Models are loaded before
the calibration, so no stage pays for loading them. On a shared machine the figures move with
the other load: say so when quoting them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import common
from tabulate import tabulate

from dihal_bench.config.suite import (
    apply_overrides,
    record_config,
    resolve_suite,
    resolved_config,
)
from dihal_bench.registry.resolve import describe_backbone
from dihal_bench.study.calibration import calibrate_run
from dihal_bench.study.estimate import (
    assumed_throughput,
    backbone_parameters,
    unit_seconds,
)
from dihal_bench.study.plan import seed_units
from dihal_bench.study.run import Run
from dihal_bench.study.runner import run_suite

STAGES = ("locate", "targets", "sweep", "dihal", "controls", "references", "baselines", "steps", "metrics", "latency")


def stage_estimates(config, num_layers: int, throughput) -> dict[str, float]:
    """Each stage's estimated seconds over all seeds of ``config``."""
    totals: dict[str, float] = {}
    for unit in seed_units(config, num_layers):
        totals[unit.stage] = totals.get(unit.stage, 0.0) + unit_seconds(unit, config, None, throughput)
    return {stage: seconds * len(config.seeds) for stage, seconds in totals.items()}


def table(estimates: dict[str, dict[str, float]], took: dict[str, float]) -> tuple[list, dict]:
    """Rows (stage, each estimate, measured, each ratio) and the JSON report of the same."""
    kinds = list(estimates)
    first = estimates[kinds[0]]
    rows, report = [], {}
    for stage in [s for s in STAGES if s in first]:
        measured = took.get(stage)
        ratios = {kind: (estimates[kind].get(stage, 0.0) / measured if measured else None) for kind in kinds}
        rows.append([stage, *(f"{estimates[kind].get(stage, 0.0):.0f}" for kind in kinds), f"{measured or 0.0:.0f}",
                     *("-" if ratios[kind] is None else f"{ratios[kind]:.2f}" for kind in kinds)])
        report[stage] = {"measured_s": measured, **{f"{kind}_s": estimates[kind].get(stage, 0.0) for kind in kinds},
                         **{f"{kind}_ratio": ratios[kind] for kind in kinds}}
    measured_total = sum(took[s] for s in first if s in took)
    totals = {kind: sum(estimates[kind].values()) for kind in kinds}
    rows.append(["all stages", *(f"{totals[kind]:.0f}" for kind in kinds), f"{measured_total:.0f}",
                 *(f"{totals[kind] / measured_total:.2f}" for kind in kinds)])
    report["all stages"] = {"measured_s": measured_total, **{f"{kind}_s": totals[kind] for kind in kinds}}
    headers = ["stage", *(f"estimated s ({kind})" for kind in kinds), "measured s",
               *(f"{kind}/measured" for kind in kinds)]
    return [headers, *rows], report


def from_record(path: Path, calibrated: bool) -> tuple[dict, dict]:
    """The estimate of a committed record's configuration against the stage times it recorded."""
    record = json.loads(path.read_text())
    config = record_config(record["config"], str(path))
    params = backbone_parameters(config.backbone)
    shape = describe_backbone(config.backbone)
    layers = None if shape is None else shape.num_layers
    estimates = {}
    if "estimate" in record:  # the run's own, made at its start
        own = record["estimate"]
        estimates["own"] = {stage: own["stages"].get(stage, 0.0) for stage in STAGES if stage in own["stages"]}
        print(f"the run's own estimate: {own['source']}")
    estimates["assumed"] = stage_estimates(config, layers, assumed_throughput(config, params))
    if calibrated:  # the run's models and training windows, as `run --calibrate` measures them
        with tempfile.TemporaryDirectory() as folder:
            rates = calibrate_run(Run(record["suite"], config, Path(folder), progress=False))
        estimates["calibrated"] = stage_estimates(config, layers, rates)
        print(f"calibrated rates: {rates.describe(params)}")
    rows, report = table(estimates, record["timings"])
    environment = record.get("environment", {})
    print(f"record {path.name}: suite {record['suite']}, seeds {record['seeds']}, made on "
          f"{environment.get('cpu_count')} CPUs, {config.device} ({config.dtype})")
    print(tabulate(rows[1:], headers=rows[0]))
    return report, {"record": path.name, "suite": record["suite"], "seeds": record["seeds"]}


#: the issue's bar: a stage's estimate within 25% of what it took
WITHIN = (0.80, 1.25)


def from_gpu_json(path: Path) -> dict:
    """Per-stage estimated/measured ratios recomputed from a GPU run's JSON: ``gpu_shapes_h200.json``
    (``figures.stages``: the calibrated dry run's per-stage estimate and the summed job seconds) or
    ``gpu_check.py``'s (``runs[].stages``: each record's own estimate against its timings). The
    former holds the estimate the rates gave, not the rates themselves (``estimate.rates``) nor the
    job counts per stage, so a changed price model cannot be re-applied to it: a GPU run of
    gpu_check.py records both (the run record's ``estimate`` and ``job_times``)."""
    data = json.loads(path.read_text())
    if data.get("benchmark") == "gpu_check":
        runs = {f"{run['suite']}/{run['dtype']}": run["stages"] for run in data["runs"]}
    else:
        runs = {data["settings"]["suite"]: data["figures"]["stages"]}
    report = {}
    for name, stages in runs.items():
        rows = []
        for stage, figures in stages.items():
            estimated, measured = figures["estimated_s"], figures["measured_s"]
            ratio = estimated / measured if measured else None
            within = ratio is not None and WITHIN[0] <= ratio <= WITHIN[1]
            rows.append([stage, f"{estimated:.1f}", "-" if measured is None else f"{measured:.1f}",
                         "-" if ratio is None else f"{ratio:.2f}", "-" if ratio is None else ("yes" if within else "no")])
            report.setdefault(name, {})[stage] = {"estimated_s": estimated, "measured_s": measured, "ratio": ratio,
                                                  "within_25pct": within if ratio is not None else None}
        print(f"{path.name}: {name}")
        print(tabulate(rows, headers=["stage", "estimated s", "measured s", "estimated/measured", "within 25%"]))
    return report


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a suite override, as `dihal-bench run --set`")
    parser.add_argument("--record", type=Path, help="compare with this run record's stage times; run nothing")
    parser.add_argument("--gpu-json", type=Path, help="recompute the per-stage ratios of a GPU run's JSON "
                        "(gpu_shapes_h200.json or gpu_check.py's); run nothing")
    parser.add_argument("--calibrate", action="store_true",
                        help="with --record: also the estimate from rates measured on this machine now")
    args = parser.parse_args()
    if args.gpu_json is not None:
        common.report("eta", {"stages": from_gpu_json(args.gpu_json)}, {"gpu_json": args.gpu_json.name}, args.json)
        return
    if args.record is not None:
        report, settings = from_record(args.record, args.calibrate)
        common.report("eta", {"stages": report}, settings, args.json)
        return
    name, config = resolve_suite(args.suite)
    sets = dict(item.split("=", 1) for item in args.sets)
    if args.quick:
        sets.setdefault("sampling.samples", "2")
        sets.setdefault("metrics.mauve", "false")
    config = resolved_config(apply_overrides(config, {**sets, "seeds": f"[{args.seed}]"}))
    with tempfile.TemporaryDirectory() as folder:
        run = Run(name, config, Path(folder) / "runs", progress=False)
        measured_rates = calibrate_run(run)
        params = backbone_parameters(config.backbone) or float(run.backbone.num_parameters)
        calibrated = stage_estimates(config, run.backbone.num_layers, measured_rates)
        assumed = stage_estimates(config, run.backbone.num_layers, assumed_throughput(config, params))
        record = json.loads(run_suite(name, config, out_root=Path(folder) / "runs", results_dir=Path(folder) / "results",
                                      progress=False).read_text())
    took = record["timings"]
    rows, report = [], {}
    for stage in [s for s in STAGES if s in calibrated]:
        ratio = calibrated[stage] / took[stage] if took.get(stage) else None
        rows.append([stage, f"{calibrated[stage]:.1f}", f"{assumed[stage]:.1f}", f"{took.get(stage, 0.0):.1f}",
                     "-" if ratio is None else f"{ratio:.2f}"])
        report[stage] = {"estimated_s": calibrated[stage], "assumed_s": assumed[stage], "measured_s": took.get(stage),
                         "ratio": ratio}
    estimated_total, measured_total = sum(calibrated.values()), sum(took[s] for s in calibrated if s in took)
    rows.append(["all stages", f"{estimated_total:.1f}", f"{sum(assumed.values()):.1f}", f"{measured_total:.1f}",
                 f"{estimated_total / measured_total:.2f}"])
    print(f"suite {name}, seed {args.seed}, {config.device} ({config.dtype}); rates: "
          f"{measured_rates.describe(params)}")
    print(tabulate(rows, headers=["stage", "estimated s (calibrated)", "estimated s (assumed)", "measured s",
                                  "estimated/measured"]))
    common.report("eta", {"stages": report, "estimated_s": estimated_total, "measured_s": measured_total},
                  {"suite": name, "seed": args.seed, "device": config.device, "dtype": config.dtype, "sets": sets},
                  args.json)


if __name__ == "__main__":
    main()
