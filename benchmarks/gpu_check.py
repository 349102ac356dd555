"""One call on a GPU machine: the `smoke` suite and the `diagnostic` suite's stages for one seed,
end to end (metrics and latency included), in float32 and in bfloat16, on random-weight models of
the embedded shapes, each record compared with the same script's CPU record made here.

What travels (the device call copies the working tree, 64 MiB at most, and reaches no network):
this repository (8 MB) and the shapes folder that `benchmarks/gpu_shapes.py export` writes here
(35 MB: the two models' configs and tokenizers). The machine's own torch and transformers are used;
dihal-bench installs beside them with `pip install --no-deps -e .` (its other dependencies must be
there: mauve-text is not needed, MAUVE is switched off). Random weights are built there from a fixed
seed by `gpu_shapes.build`, so both machines run the same weights when their torch draws the same
initial values; the record keeps a fingerprint of the weights, and a comparison whose fingerprints
differ says so instead of comparing.

    python benchmarks/gpu_shapes.py export shapes                         # here, once
    python benchmarks/gpu_check.py run shapes --device cpu --scale small \\
        --json benchmarks/results/gpu_check_cpu.json                      # here: the CPU record
    python benchmarks/gpu_check.py run shapes --device cuda --scale small \\
        --compare benchmarks/results/gpu_check_cpu.json --json $OUT/gpu_check_cuda.json   # there

What is compared, and with what tolerance. A run's numbers fall in three groups:

- forward-only numbers: the locate stage's per-layer scores and proxy values, and the two
  references' scores (held-out text, and unigram draws from a CPU generator, scored by the
  evaluator). Only the weights, the data and rounding enter them, so two devices must agree to a
  tolerance set by the coarser dtype's unit roundoff u (2^-24 float32, 2^-8 bfloat16, 2^-11
  float16): a decoder layer rounds its results about ROUNDINGS_PER_LAYER times (norms, q/k/v/o,
  softmax, three MLP maps, residual adds), each error relative and of either sign, so over L layers
  they add like a random walk to ROUNDINGS_PER_LAYER·sqrt(L)·u relative to the value; a perplexity
  is exp(mean NLL), whose error is that relative error times the NLL (at most ln V for a vocabulary
  V), so its tolerance is on ln(PPL): ROUNDINGS_PER_LAYER·sqrt(L)·u·ln V.
- numbers downstream of a device random stream: every trained model's loss and scores and every
  sampled text's metrics. torch draws a CUDA generator's numbers with another algorithm than a CPU
  generator's, from the same seed, so these differ by design; they are reported with their ratio
  and checked finite, not held to a tolerance.
- latency: a property of the hardware, reported as the ratio GPU/CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_shapes  # noqa: E402  (benchmarks/ is not a package)

from dihal_bench.base.files import write_json_atomic  # noqa: E402
from dihal_bench.base.provenance import environment  # noqa: E402
from dihal_bench.config.suite import apply_overrides, resolve_suite  # noqa: E402
from dihal_bench.study.runner import run_suite  # noqa: E402

#: unit roundoff per dtype: half the gap between 1 and the next representable number
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: roundings of results relative to the value per decoder layer (see the module docstring)
ROUNDINGS_PER_LAYER = 16
DTYPES = ("float32", "bfloat16")
#: the diagnostic suite cut to the smoke suite's sizes: the same stages and methods, minutes not hours
SMALL = {
    "locate.tokens": "512", "locate.seq_len": "64",
    "sweep.layers": "[3, 15]", "sweep.eval_sequences": "8",
    "sweep.budget.steps": "6", "sweep.budget.batch_size": "4", "sweep.budget.seq_len": "32", "sweep.budget.epochs": "1",
    "budget.steps": "6", "budget.batch_size": "4", "budget.seq_len": "32", "budget.epochs": "1",
    "bridge.steps_axis": "[1, 8]",
    "sampling.samples": "4", "sampling.seq_len": "16", "sampling.batch_size": "4", "sampling.diffusion_steps": "4",
    "metrics.min_valid": "1", "metrics.latency_repeats": "1",
}
#: overrides for every run: MAUVE needs the mauve extra (not on a bare GPU machine) and scores samples only
ALWAYS = {"metrics.mauve": "false"}
SUITES = ("smoke", "diagnostic")


def tolerance(kind: str, dtypes: tuple[str, ...], layers: int, vocab: int) -> float:
    """The allowed difference of a forward-only number between two runs in ``dtypes``: relative
    for ``kind`` "relative", on ln(value) for "log" (perplexities)."""
    relative = ROUNDINGS_PER_LAYER * math.sqrt(layers) * max(UNIT_ROUNDOFF[d] for d in dtypes)
    return relative * math.log(vocab) if kind == "log" else relative


def forward_numbers(record: dict) -> dict[str, tuple[str, float]]:
    """The forward-only numbers of a run record, by a path name: (``relative`` | ``log``, value)."""
    numbers: dict[str, tuple[str, float]] = {}
    for seed in record["per_seed"]:
        prefix = f"seed{seed['seed']}"
        locate = seed.get("locate") or {}
        for layer, score in zip(locate.get("layers", []), locate.get("score", []), strict=True):
            numbers[f"{prefix}/locate/score/layer{layer}"] = ("relative", score)
        for name, proxy in (locate.get("proxies") or {}).items():
            for layer, value in zip(locate["layers"], proxy.get("values", []), strict=True):
                numbers[f"{prefix}/locate/{name}/layer{layer}"] = ("relative", value)
        for method, result in seed.get("methods", {}).items():
            if result.get("kind") == "reference":
                for key in ("gen_ppl", "gen_ppl_sample_mean"):
                    value = (result.get("metrics") or {}).get(key)
                    if value is not None:
                        numbers[f"{prefix}/{method}/{key}"] = ("log", value)
    return numbers


def sampled_numbers(record: dict) -> dict[str, float]:
    """Numbers downstream of a device random stream (trained models, sampled texts)."""
    numbers = {}
    for seed in record["per_seed"]:
        for method, result in seed.get("methods", {}).items():
            if result.get("kind") == "reference":
                continue
            for group in ("train", "metrics"):
                for key, value in (result.get(group) or {}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        numbers[f"seed{seed['seed']}/{method}/{group}/{key}"] = float(value)
    return numbers


def latency_numbers(record: dict) -> dict[str, float]:
    numbers = {}
    for seed in record["per_seed"]:
        for method, result in seed.get("methods", {}).items():
            for key, value in (result.get("latency") or {}).items():
                if key.endswith("ms_per_token") and isinstance(value, (int, float)):
                    numbers[f"seed{seed['seed']}/{method}/{key}"] = float(value)
    return numbers


def compare(reference: dict, other: dict) -> dict:
    """``other``'s run (one suite, one dtype) against ``reference``'s: each forward-only number
    within its tolerance or not, the sampled ones' ratios and finiteness, latency ratios.
    Both are this script's run entries (``record``, ``dtype``, ``layers``, ``vocab``, ``weights``)."""
    if reference["weights"] != other["weights"]:
        return {"comparable": False,
                "why": "the random weights differ (another torch draws other initial values): nothing to compare"}
    dtypes = (reference["dtype"], other["dtype"])
    expected, got = forward_numbers(reference["record"]), forward_numbers(other["record"])
    rows, outside = {}, []
    for name in sorted(expected.keys() & got.keys()):
        kind, a = expected[name]
        b = got[name][1]
        allowed = tolerance(kind, dtypes, reference["layers"], reference["vocab"])
        if kind == "log":
            difference = abs(math.log(b) - math.log(a)) if a > 0 and b > 0 else math.inf
        else:
            difference = abs(b - a) / max(abs(a), sys.float_info.epsilon)
        within = difference <= allowed
        rows[name] = {"reference": a, "value": b, "difference": difference, "tolerance": allowed, "kind": kind,
                      "within": within}
        if not within:
            outside.append(name)
    sampled_a, sampled_b = sampled_numbers(reference["record"]), sampled_numbers(other["record"])
    sampled = {name: {"reference": sampled_a[name], "value": sampled_b[name], "finite": math.isfinite(sampled_b[name]),
                      "ratio": sampled_b[name] / sampled_a[name] if sampled_a[name] else None}
               for name in sorted(sampled_a.keys() & sampled_b.keys())}
    latency_a, latency_b = latency_numbers(reference["record"]), latency_numbers(other["record"])
    latency = {name: latency_b[name] / latency_a[name] for name in sorted(latency_a.keys() & latency_b.keys())
               if latency_a[name]}
    missing = sorted(expected.keys() ^ got.keys())
    return {"comparable": True, "dtypes": list(dtypes), "forward": rows, "forward_outside": outside,
            "forward_missing": missing, "sampled": sampled,
            "sampled_not_finite": [name for name, row in sampled.items() if not row["finite"]],
            "latency_ratio": latency, "all_within": not outside and not missing}


def fingerprint(folder: Path) -> str:
    """sha256 of a built checkpoint's weight files: equal on two machines iff the weights are."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run_one(suite: str, models: Path, device: str, dtype: str, scale: str, seed: int, work: Path) -> dict:
    """One suite in one dtype on the random-weight models, timed; the run entry ``compare`` reads."""
    name, config = resolve_suite(suite)
    backbone = models / "smollm2-135m"
    evaluator = backbone if suite == "smoke" else models / "gemma3-270m"
    sets = {**(SMALL if scale == "small" and suite == "diagnostic" else {}), **ALWAYS,
            "backbone": str(backbone), "evaluator": str(evaluator), "seeds": f"[{seed}]",
            "device": device, "dtype": dtype}
    config = apply_overrides(config, sets)
    started = time.perf_counter()
    path = run_suite(name, config, out_root=work / f"{suite}-{dtype}", results_dir=work / "results",
                     progress=False, calibrate=True)
    wall = time.perf_counter() - started
    shape = json.loads((backbone / "config.json").read_text())
    record = json.loads(path.read_text())
    return {"suite": suite, "dtype": dtype, "device": device, "sets": sets, "wall_s": wall,
            "layers": shape["num_hidden_layers"], "vocab": shape["vocab_size"], "weights": fingerprint(backbone),
            "stages": stage_ratios(record), "job_times": gpu_shapes.times(work / f"{suite}-{dtype}"),
            "record": record}


def stage_ratios(record: dict) -> dict:
    """Each stage's calibrated estimate (made by the run before its work, from rates measured on
    this machine: ``record["estimate"]``) against the seconds it took (``record["timings"]``): what
    the calibration's check on a GPU reads (benchmarks/eta_bench.py --gpu-json)."""
    estimated = (record.get("estimate") or {}).get("stages", {})
    stages = {}
    for stage, measured in record.get("timings", {}).items():
        if stage in estimated:
            stages[stage] = {"estimated_s": estimated[stage], "measured_s": measured,
                             "ratio": estimated[stage] / measured if measured else None}
    return stages


def machine() -> dict:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {**environment(), "gpu": cuda, "processor": platform.processor()}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the suites and write the records (and the comparison)")
    run.add_argument("shapes", type=Path, help="the folder `gpu_shapes.py export` wrote")
    run.add_argument("--device", default="cuda")
    run.add_argument("--dtypes", default=",".join(DTYPES))
    run.add_argument("--suites", default=",".join(SUITES))
    run.add_argument("--scale", choices=("small", "full"), default="small",
                     help="small: the diagnostic suite at the smoke suite's sizes (SMALL); full: as written")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--compare", type=Path, help="this script's CPU JSON: compare each run with its own")
    run.add_argument("--json", type=Path, required=True, help="where to write the records and comparison")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        gpu_shapes.build(args.shapes, work / "models")
        runs = [run_one(suite, work / "models", args.device, dtype, args.scale, args.seed, work)
                for suite in args.suites.split(",") for dtype in args.dtypes.split(",")]
    report = {"benchmark": "gpu_check", "machine": machine(), "scale": args.scale, "seed": args.seed,
              "wall_s": time.perf_counter() - started, "runs": runs}
    if args.compare:
        reference = {(entry["suite"], entry["dtype"]): entry for entry in json.loads(args.compare.read_text())["runs"]}
        report["comparison"] = {}
        for entry in runs:
            # a dtype the reference lacks is compared with its float32 run, at the coarser dtype's tolerance
            base = reference.get((entry["suite"], entry["dtype"])) or reference.get((entry["suite"], "float32"))
            if base is not None:
                report["comparison"][f"{entry['suite']}/{entry['dtype']}"] = compare(base, entry)
    write_json_atomic(args.json, report)
    for entry in runs:
        print(f"{entry['suite']} {entry['dtype']} on {entry['device']}: {entry['wall_s']:.0f} s")
    for key, result in report.get("comparison", {}).items():
        print(f"{key}: " + (result["why"] if not result["comparable"] else
                            f"{len(result['forward'])} forward-only numbers, outside tolerance: "
                            f"{result['forward_outside'] or 'none'}"))


if __name__ == "__main__":
    main()
