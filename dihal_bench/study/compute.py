"""Each row's compute, counted from its shapes (docs/method.md#counting-compute): training FLOPs in
all and inference FLOPs per generated token, for a row being written (``method_compute``) and for
a sealed record read back (``row_compute``); and each stage's FLOPs and achieved FLOP/s
(``stage_compute``).

DiHAL and its controls are counted here (the bridge is the suite's); a baseline counts itself
(``Baseline.flop_account``), and a plugin that does not count reads "unknown".
"""

from __future__ import annotations

import re
from functools import lru_cache

from dihal_bench.api.flops import TRAINED, BackboneFlops, FlopAccount, MethodWork, dense
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import backbone_parameters_declared, describe_backbone
from dihal_bench.study.plan import split_scale

UNKNOWN = "unknown"
#: the bridges whose shape this module knows (dihal_builtin.bridge): in and out projections, a
#: conditioning skip, the blocks, a time MLP once per call
KNOWN_BRIDGES = ("dihal-bridge", "regressor")


@lru_cache(maxsize=8)
def backbone_flops(name: str) -> BackboneFlops | None:
    """A registered backbone's FLOP shape from its plugin's description and declared parameter
    count, without loading weights; None where the plugin declares either not."""
    try:
        shape = describe_backbone(name)
        parameters = backbone_parameters_declared(name)
    except DihalError:
        return None
    if shape is None or parameters is None:
        return None
    registration, arguments = get_registry().resolve("backbone", name)
    described = registration.meta["describe"](*arguments)
    vocab = described.get("vocab") if isinstance(described, dict) else None
    return BackboneFlops(shape.num_layers, shape.width, parameters, vocab if isinstance(vocab, int) else None)


def loaded_flops(backbone) -> BackboneFlops:
    """The FLOP shape of a loaded backbone (what a run writing its record has)."""
    config = getattr(getattr(backbone, "model", None), "config", None)
    return BackboneFlops(backbone.num_layers, backbone.width, backbone.num_parameters(), backbone.vocab_size,
                         bool(getattr(config, "tie_word_embeddings", True)))


def unknown(why: str) -> dict:
    return {"train_flops": None, "inference_flops_per_token": None, "counted": f"{UNKNOWN}: {why}"}


# -- DiHAL, its controls, the references -------------------------------------------------------------


def bridge_token(width: int, options: dict, context: float) -> float | None:
    """One position's forward through the DiHAL bridge (None without its d_model and layers)."""
    d, layers = options.get("d_model"), options.get("layers")
    if not (isinstance(d, int) and isinstance(layers, int)):
        return None
    matmul = 2 * width * d + layers * 12 * d * d + d * width + width * width
    return dense(matmul, layers, d, context)


def bridge_account(backbone: BackboneFlops, config: dict, budget: dict, row: dict) -> dict:
    """A DiHAL row or the regressor control: its targets (layers 1..ℓ over the distinct training
    windows once, or over every step's batch when streamed), the bridge trained 3x forward; each
    generated token: ``sample_steps`` cached bridge positions, the upper layers cached and the head."""
    bridge = config.get("bridge", {})
    if row.get("bridge") not in KNOWN_BRIDGES:
        return unknown(f"bridge {row.get('bridge')!r} has no FLOP count")
    layer, width, T = row["layer"], backbone.width, budget["seq_len"]
    work = budget_work(backbone, budget, config, {}, {})
    train_token = bridge_token(width, bridge.get("options", {}), T)
    sample_len = config["sampling"]["seq_len"]
    step_token = bridge_token(width, bridge.get("options", {}), (sample_len + 1) / 2)
    if train_token is None or step_token is None:
        return unknown("the suite's bridge options name no d_model and layers")
    streamed = bridge.get("targets") == "streamed"
    target_tokens = (row.get("train") or {}).get("tokens_seen", work.tokens) if streamed else work.distinct_tokens
    targets = target_tokens * backbone.layers_forward(layer, T)
    tokens = (row.get("train") or {}).get("tokens_seen", work.tokens)
    steps = row.get("sample_steps") or 1
    upper = backbone.layers_forward(backbone.layers - layer, (sample_len + 1) / 2) + backbone.head_forward()
    # the sink: layers 1..ℓ on the first token alone, once a sample
    sink = backbone.layers_forward(layer, 1) / sample_len if bridge.get("sink_passthrough") else 0.0
    return FlopAccount(targets + TRAINED * tokens * train_token, steps * step_token + upper + sink,
                       f"targets: layers 1..{layer} over the "
                       f"{'streamed batches' if streamed else 'distinct training windows once'}; "
                       f"the bridge 3x forward per trained token; sampling: {steps} cached bridge "
                       f"position(s), layers {layer + 1}..{backbone.layers} cached and the head per token; "
                       "not counted: locate, the sweep, evaluation").to_dict()


def skip_account(backbone: BackboneFlops, config: dict, row: dict) -> dict:
    layer, T = row["layer"], config["sampling"]["seq_len"]
    upper = backbone.layers_forward(backbone.layers - layer, (T + 1) / 2) + backbone.head_forward()
    return FlopAccount(0.0, upper, f"nothing trained; sampling: layers {layer + 1}..{backbone.layers} cached "
                                   "and the head per token").to_dict()


# -- the rows ----------------------------------------------------------------------------------------


def budget_work(backbone: BackboneFlops, budget: dict, config: dict, row: dict, options: dict) -> MethodWork:
    train = row.get("train") or {}
    parameters = train.get("parameters", row.get("parameters", {}))
    sampling = {"batch_size": config["sampling"]["batch_size"], **(train.get("sampling_options") or {})}
    return MethodWork(backbone, parameters if isinstance(parameters, dict) else {}, int(train.get("steps", budget["steps"])),
                      budget["batch_size"], budget["seq_len"], int(budget.get("epochs", 1)),
                      config["sampling"]["seq_len"], sampling, options)


def method_compute(backbone: BackboneFlops | None, config: dict, budget: dict, name: str, row: dict,
                   options: dict | None = None) -> dict:
    """The ``compute`` entry of one row: ``train_flops``, ``inference_flops_per_token`` (None where
    unknown) and ``counted``. ``config`` is the suite as the record holds it, ``budget`` the
    seed's matched budget, ``options`` the baseline's options where known (a record holds none)."""
    if backbone is None:
        return unknown("the backbone's plugin declares no shape or parameter count")
    kind = row.get("kind")
    if kind == "reference":
        return FlopAccount(0.0, 0.0, "no model").to_dict()
    if kind == "control" and row.get("bridge") is None:
        return skip_account(backbone, config, row)
    if kind in ("dihal", "control"):
        return bridge_account(backbone, config, budget, row)
    registration = get_registry().items["baseline"].get(name)
    if registration is None:
        return unknown(f"no baseline plugin named {name!r} is installed")
    account = registration.obj.flop_account(budget_work(backbone, budget, config, row, options or {}))
    if account is None:
        return unknown(f"baseline {name!r} does not count its FLOPs")
    if not (row.get("train") or {}).get("steps", 1):
        account = FlopAccount(0.0, account.inference_flops_per_token, account.counted)
    return account.to_dict()


def row_compute(record: dict, seed_entry: dict, method_name: str) -> dict:
    """The compute of row ``method_name`` of one seed of a run record: the one it recorded, else
    counted now from what it holds (the suite, the seed's budget, the row's parameters, steps and
    sampling options, the backbone's shape from its plugin)."""
    row = seed_entry["methods"][method_name]
    if isinstance(row.get("compute"), dict):
        return row["compute"]
    config = record["config"]
    budget = row.get("budget") or seed_entry.get("budget") or config["budget"]  # a scaled row has its own
    return method_compute(backbone_flops(record["backbone"]), config, budget, split_scale(method_name)[0], row)


# -- the stages --------------------------------------------------------------------------------------


def sampled(account: dict, config: dict) -> float:
    """FLOPs of drawing the suite's samples with a row's inference count."""
    per_token = account.get("inference_flops_per_token") or 0.0
    return per_token * config["sampling"]["samples"] * config["sampling"]["seq_len"]


def stage_flops(record: dict, seed_entry: dict) -> dict[str, float | None]:
    """FLOPs of one seed's stages, as counted (docs/method.md#counting-compute): locate's pass,
    the targets job, the sweep's bridges trained, each row's training and samples, the
    evaluator's scoring, the frontier points' samples and scoring, the latency job's decodes; None
    for what is not counted (the steps axis, the held-out likelihoods)."""
    config, backbone = record["config"], backbone_flops(record["backbone"])
    evaluator = backbone_flops(record.get("evaluator") or "")
    if backbone is None:
        return {}
    budget = seed_entry.get("budget") or config["budget"]
    rows = {name: row_compute(record, seed_entry, name) for name in seed_entry["methods"]}
    out: dict[str, float | None] = {"locate": config["locate"]["tokens"]
                                    * backbone.layers_forward(backbone.layers, config["locate"]["seq_len"])}
    sweep = seed_entry.get("sweep") or {}
    swept = [entry for entry in sweep.get("layers", []) if isinstance(entry, dict)]
    layers = [entry["layer"] for entry in swept] + list((seed_entry.get("roles") or {}).values())
    work = budget_work(backbone, budget, config, {}, {})
    out["targets"] = work.distinct_tokens * backbone.layers_forward(max(layers), budget["seq_len"]) if layers else 0.0
    token = bridge_token(backbone.width, config["bridge"].get("options", {}), config["sweep"]["budget"]["seq_len"])
    out["sweep"] = (sum(TRAINED * entry.get("tokens_seen", 0) * token for entry in swept) if token is not None
                    else None)
    for stage, kinds in (("dihal", ("dihal",)), ("controls", ("control",)), ("baselines", ("baseline",))):
        chosen = [name for name, row in seed_entry["methods"].items() if row.get("kind") in kinds]
        if any(rows[name]["train_flops"] is None for name in chosen):
            out[stage] = None
            continue
        # a DiHAL row's targets are the targets stage's
        own = [rows[name]["train_flops"] - (targets_share(backbone, work, seed_entry["methods"][name])
                                            if stage != "baselines" else 0.0) for name in chosen]
        out[stage] = sum(own) + sum(sampled(rows[name], config) for name in chosen)
    sampling = config["sampling"]
    # the evaluator's pass over one row's samples; none where every metric counts tokens or n-grams
    if not get_registry().reads_evaluator(config["metrics"]["names"]):
        scoring = 0.0
    else:
        scoring = (sampling["samples"] * sampling["seq_len"] * evaluator.forward(sampling["seq_len"])
                   if evaluator is not None else None)
    scored = sum(1 for row in seed_entry["methods"].values() if row.get("samples"))
    out["metrics"] = scored * scoring if scoring is not None else None
    out["references"] = 0.0
    points = seed_entry.get("frontier") or []
    if points:
        out["frontier"] = frontier_flops(points, rows, config, scoring)
    if any(row.get("latency") for row in seed_entry["methods"].values()):
        out["latency"] = latency_flops(seed_entry, rows, config, backbone)
    return out


def latency_flops(seed_entry: dict, rows: dict[str, dict], config: dict, backbone: BackboneFlops) -> float | None:
    """FLOPs of a seed's latency job (dihal_bench/study/stages/latency.py): each timed row decodes once
    per round, at every batch size, sequences of the suite's length, at its count per token; the intact
    backbone is timed as well where no row is it. The short warm-up decode is left out, as the estimate
    leaves it (8 tokens against a round's 64: 2.4% of the job at 5 rounds). None where a timed row's
    count is unknown."""
    length = config["sampling"]["seq_len"]
    suite_repeats = config["metrics"]["latency_repeats"]
    total, has_reference = 0.0, False
    for name, row in seed_entry["methods"].items():
        timed = row.get("latency")
        if not timed:
            continue
        per_token = rows[name]["inference_flops_per_token"]
        if per_token is None:
            return None
        sizes = [int(found[1]) for key in timed if (found := re.fullmatch(r"batch(\d+)_seconds_per_sequence", key))]
        for size in sizes:  # records before the rounds were kept ran the suite's repeats
            repeats = len(timed.get(f"batch{size}_ratio_per_round") or []) or suite_repeats
            total += per_token * size * repeats * length
        registration = get_registry().items["baseline"].get(split_scale(name)[0])
        has_reference |= bool(registration is not None and registration.obj.intact_backbone)
    if not has_reference:  # the job's own reference decode: the backbone, cached, at every size
        sizes = sorted({1, config["sampling"]["batch_size"]})
        total += backbone.forward((length + 1) / 2) * sum(sizes) * suite_repeats * length
    return total


def frontier_flops(points: list[dict], rows: dict[str, dict], config: dict, scoring: float | None) -> float | None:
    """FLOPs of a seed's frontier points: each point's samples, drawn at its row's inference count
    (a diffusion point's scaled by its share of the suite's steps, as the dry run prices it), and
    scored by the evaluator; None where a row's count or the evaluator's is unknown."""
    steps = config["sampling"].get("diffusion_steps")
    total = 0.0
    for point in points:
        per_token = rows[point["method"]]["inference_flops_per_token"]
        if per_token is None or scoring is None:
            return None
        share = point["diffusion_steps"] / steps if "diffusion_steps" in point and steps else 1.0
        total += sampled({"inference_flops_per_token": per_token * share}, config) + scoring
    return total


def targets_share(backbone: BackboneFlops, work: MethodWork, row: dict) -> float:
    if row.get("kind") == "control" and row.get("bridge") is None:
        return 0.0
    return work.distinct_tokens * backbone.layers_forward(row["layer"], work.seq_len)


def stage_compute(record: dict) -> dict[str, dict]:
    """Per stage, summed over the record's seeds: ``flops`` counted, ``seconds`` recorded and the
    achieved ``flops_per_second`` (None where either is unknown)."""
    totals: dict[str, dict] = {}
    for seed_entry in record.get("per_seed", []):
        timings = seed_entry.get("timings") or {}
        for stage, flops in stage_flops(record, seed_entry).items():
            entry = totals.setdefault(stage, {"flops": 0.0, "seconds": 0.0})
            seconds = timings.get(stage)
            entry["flops"] = None if flops is None or entry["flops"] is None else entry["flops"] + flops
            entry["seconds"] = None if seconds is None or entry["seconds"] is None else entry["seconds"] + seconds
    for entry in totals.values():
        known = entry["flops"] is not None and entry["seconds"]
        entry["flops_per_second"] = entry["flops"] / entry["seconds"] if known else None
    return totals


def main(paths: list[str]) -> None:
    """Print each record's rows (first seed) and stages as counted: ``python -m dihal_bench.study.compute RECORD...``."""
    import json

    for path in paths:
        with open(path) as handle:
            record = json.load(handle)
        seed = record["per_seed"][0]
        print(f"{path} (seed {seed['seed']})\n| row | train PFLOP | GFLOP/token |")
        for name in seed["methods"]:
            entry = row_compute(record, seed, name)
            train, token = entry["train_flops"], entry["inference_flops_per_token"]
            print(f"| {name} | {'-' if train is None else f'{train / 1e15:.4f}'} | "
                  f"{'-' if token is None else f'{token / 1e9:.3f}'} |")
        print("| stage | PFLOP | seconds | achieved GFLOP/s |")
        for stage, entry in stage_compute(record).items():
            cells = [entry["flops"] and entry["flops"] / 1e15, entry["seconds"],
                     entry["flops_per_second"] and entry["flops_per_second"] / 1e9]
            print(f"| {stage} | " + " | ".join("-" if c is None else f"{c:.4g}" for c in cells) + " |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
