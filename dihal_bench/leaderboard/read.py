"""Run records in, flat rows out: every seed of a (suite, backbone, evaluator, matched budget) group, each
(configuration, seed) once from its newest record, as one row per method, swept layer, proxy and
locate layer.

`dihal_bench.study.records.load_record` checks each record against the v2 schema (and migrates a v1
record); what is read here is what the schema leaves open: names that must be non-empty,
numbers that key rows, and values that may be missing (a method without latency, a metric
that measured nothing), which become NaN.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dihal_bench.base.provenance import same_machine
from dihal_bench.errors import DihalError
from dihal_bench.locate.series import located_series
from dihal_bench.study.compute import row_compute
from dihal_bench.study.plan import METHOD_STAGES, split_scale
from dihal_bench.study.records import (
    DAMAGED,
    RECORD_FORMAT,
    UNVERIFIED,
    Integrity,
    load_record,
    record_integrity,
    slug,
)
from dihal_bench.training.budget import Budget

#: What every run record's format tag starts with, whatever its version: a file tagged so is
#: ours, and one this version cannot read is an error rather than a file quietly left out.
RUN_RECORD_FORMAT_PREFIX = RECORD_FORMAT.rsplit("/", 1)[0] + "/"

#: Method values that every method has, besides its metrics: key -> (section, key) in the record.
METHOD_CORE_VALUES = {
    "latency_ms_per_token": ("latency", "batch1_ms_per_token"),
    "latency_ratio": ("latency", "batch1_ratio_to_backbone"),
    "steps": ("train", "steps"),
    "tokens_seen": ("train", "tokens_seen"),
    # the held-out likelihood (docs/method.md#test-nll); NaN for a row without one, or a record from before it
    "test_nll": ("test_nll", "nats_per_token"),
}
#: Keys of a method row that are not values to average: ``row`` and ``scale`` are the method's label
#: split into the row it is and its budget scale (docs/method.md#budget-scales).
METHOD_ROW_LABELS = ("record", "seed", "method", "kind", "in_budget", "layer", "row", "scale", "test_nll_kind",
                     "draw_precision")
#: Per-layer values of the sweep (core: the runner writes them for every swept layer).
SWEEP_KEYS = ("bridge_mse", "bridge_r2", "hybrid_ppl", "kl_to_backbone", "skip_ppl")
#: Rank-correlation keys of a sweep's `correlations` entries (dihal_bench.numerics.stats' output).
CORRELATION_KEYS = ("spearman", "spearman_low", "spearman_high", "spearman_p", "kendall", "kendall_low",
                    "kendall_high", "kendall_p", "partial_spearman_given_depth")
#: The sweep's correlation sets: key -> the suffix of its proxy rows ("" for the standardised MSE).
CORRELATION_SETS = {"correlations": "", "correlations_trace": " · trace-metric MSE"}
#: Values of a sampling-steps point (ℓ*'s bridge sampled in K steps: `dihal_bench.hybrid.evaluation.steps_axis`).
STEPS_KEYS = ("bridge_mse", "bridge_mse_trace", "bridge_r2", "hybrid_ppl", "kl_to_backbone", "gen_ppl")
#: Keys of the layer and z-score rows besides the proxies': a proxy may not take one.
LAYER_ROW_KEYS = {"record", "seed", "layer", "chosen", "score", *SWEEP_KEYS}
#: The kinds of flat rows a record is read into.
ROW_KINDS = ("methods", "layers", "proxies", "z", "steps", "frontier", "stages")


@dataclass
class Group:
    """The pooled seeds of one (suite, backbone, evaluator) trained under one matched budget, each seed
    once (:func:`newest_per_seed`)."""

    suite: str
    backbone: str
    evaluator: str
    #: the matched budget, said where records of the same suite, backbone and evaluator were trained
    #: under two (`budget_title`); "" where the group's is the only one
    budget: str = ""
    corpora: set[str] = field(default_factory=set)
    sources: dict[str, list[int]] = field(default_factory=dict)  # record file name -> its seeds
    rows: dict[str, list[dict]] = field(default_factory=lambda: {kind: [] for kind in ROW_KINDS})
    #: metric name -> its description in the records (``higher_is_better``, ``display_name``,
    #: ``description``, ``source``), in the order the records list them
    metrics: dict[str, dict] = field(default_factory=dict)
    #: (metric, warning text) -> the methods whose records carry that ``<metric>_warning``
    warnings: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: method -> its first stored example samples (``samples.examples``) and where they come from
    samples: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    #: why some seeds have no rank correlations (under the proxies table)
    notes: list[str] = field(default_factory=list)
    #: where the records disagree on a metric (under the methods table)
    metric_notes: list[str] = field(default_factory=list)
    #: how the samples were made and scored, each setting with every value the records give
    #: (`protocol_values`): what a methods table's header states
    protocol: dict[str, list] = field(default_factory=dict)
    folder: str = ""  # set by `assign_folders` once every group is known
    #: the record files among ``sources`` that carry no seal (written before records were sealed)
    unverified: list[str] = field(default_factory=list)
    #: every pooled seed's own entry of its record (``per_seed[i]``) and the record's file name, in
    #: pooling order: what tests over seeds (rank tests, paired bootstraps, claims) read
    entries: list[tuple[str, dict]] = field(default_factory=list)

    @property
    def title(self) -> str:
        budget = f" · budget {self.budget}" if self.budget else ""
        return f"{self.suite} · backbone {self.backbone} · evaluator {self.evaluator}{budget}"

    @property
    def seeds(self) -> int:
        """How many seeds the group pools (each once): the n of a value every seed has."""
        return sum(len(seeds) for seeds in self.sources.values())

    def add(self, record: dict, source: str) -> None:
        """Pool one record (as `load_record` returns it) into the group."""
        rows, seeds, notes = record_rows(record, source)
        self.corpora.add(record["corpus"])
        self.sources[source] = seeds
        for kind, new in rows.items():
            self.rows[kind] += new
        self._add_metrics(record["metrics"], source)
        for key, value in protocol_values(record).items():
            if value not in self.protocol.setdefault(key, []):
                self.protocol[key].append(value)
        self.entries += [(source, entry) for entry in record["per_seed"]]
        for entry in record["per_seed"]:
            for name, method in entry["methods"].items():
                for metric in record["metrics"]:
                    warning = method["metrics"].get(f"{metric}_warning")
                    if isinstance(warning, str) and warning:
                        warned = self.warnings.setdefault((metric, warning), [])
                        if name not in warned:
                            warned.append(name)
                examples = method["samples"].get("examples")
                if examples and name not in self.samples:
                    self.samples[name] = ([str(text) for text in examples], f"seed {entry['seed']} of {source}")
        self.notes += [note for note in notes if note not in self.notes]

    def _add_metrics(self, metrics: dict[str, dict], source: str) -> None:
        for name, description in metrics.items():
            known = self.metrics.setdefault(name, dict(description))
            # Records made with different versions of a plugin may disagree; an arrow either
            # way would rank the methods of one record backwards, so the column gets none.
            if known["higher_is_better"] != description["higher_is_better"] and known["higher_is_better"] is not None:
                known["higher_is_better"] = None
                self.metric_notes.append(f"The records disagree on whether a higher {name} is better "
                                         f"({source} says {description['higher_is_better']}): its column has no arrow.")


def read_groups(results_dir: Path, warn: Callable[[str], None]) -> list[Group]:
    """Every run record in ``results_dir`` (``*.json``), grouped.

    A JSON object of another format (another tool's output) is skipped with a warning naming
    it. A file that should be a run record and cannot be read as one (unreadable, not JSON or
    truncated, not a JSON object, off the record schema) raises a DihalError naming it: a
    leaderboard quietly built without it would misstate the results.

    A record's seal is checked first (docs/method.md#records-and-leaderboards): one whose content
    does not match it (edited or damaged) is named in a warning and kept out of every table; one
    written before records were sealed is read, named in a warning and marked unverified in the
    tables' provenance line; cited job results that changed since the seal are named in a warning.
    """
    if not results_dir.is_dir():
        raise DihalError(f"no run records in {results_dir}: the folder does not exist")
    loaded: dict[tuple[str, str, str, str], list[tuple[str, dict, Path, Integrity]]] = {}
    left_out: list[tuple[Path, str]] = []  # damaged records and why
    for path in sorted(results_dir.glob("*.json")):
        raw = _json_object(path)
        found = raw.get("format")
        if not (isinstance(found, str) and found.startswith(RUN_RECORD_FORMAT_PREFIX)):
            warn(f"skipping {path}: not a dihal-bench run record (format {found!r}, expected {RECORD_FORMAT!r})")
            continue
        # a file name that is not UTF-8 comes as surrogate escapes: shown with U+FFFD instead
        source = path.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        integrity = _integrity(raw, path, warn)
        if integrity.status == DAMAGED:
            left_out.append((path, integrity.detail))
            continue
        record = load_record(path)
        try:
            key = (*(_name(record[part], part) for part in ("suite", "backbone", "evaluator")), budget_key(record))
            # read whole now: a malformed record is an error even where a newer one replaces its seeds
            record_rows(record, source)
        except MALFORMED as exc:
            raise malformed(path, exc) from None
        loaded.setdefault(key, []).append((source, record, path, integrity))
    groups: dict[tuple[str, str, str, str], Group] = {}
    budgets = Counter(key[:3] for key in loaded)  # matched budgets per (suite, backbone, evaluator)
    for key, records in loaded.items():
        for source, record, path, integrity in newest_per_seed(records, warn):
            try:
                budget = budget_title(record) if budgets[key[:3]] > 1 else ""
                group = groups.setdefault(key, Group(*key[:3], budget=budget))
                group.add(record, source)
                if integrity.status == UNVERIFIED:
                    group.unverified.append(source)
            except MALFORMED as exc:
                raise malformed(path, exc) from None
    if not groups and left_out:
        names = ", ".join(path.name for path, _ in left_out)
        raise DihalError(f"no intact run records in {results_dir}: {names} left out (edited or damaged)")
    for path, detail in left_out:  # said once the error above is ruled out: one line either way
        warn(f"left out {path}: it {detail}")
    if not groups:
        raise DihalError(f"no run records in {results_dir}")
    ordered = [groups[key] for key in sorted(groups)]
    assign_folders(ordered)
    return ordered


#: the fields of a budget that do not change what a run trains (the seed is each run's own)
UNTRAINED_BUDGET_FIELDS = ("seed", "checkpoint_every")


def matched_budget_of(record: dict) -> dict:
    """A record's matched budget as its suite set it (``config.budget``), every field typed and
    defaulted, so that two spellings of one protocol compare equal."""
    table = (record.get("config") or {}).get("budget") or {}
    try:
        budget = Budget.from_dict(dict(table)).to_dict()
    except (DihalError, TypeError, ValueError):  # a record this version cannot type: compared as written
        budget = dict(table)
    return {key: value for key, value in budget.items() if key not in UNTRAINED_BUDGET_FIELDS}


def budget_key(record: dict) -> str:
    """Part of a group's identity: records trained under two matched budgets are never pooled, since a
    row's label would then stand for two protocols (docs/method.md#budget-scales: a budget variant is
    a scale, with rows of its own, or a group of its own)."""
    return json.dumps(matched_budget_of(record), sort_keys=True)


def budget_title(record: dict) -> str:
    """``600×16×64, 6 epochs, lr 0.001``: the matched budget, as a group's title names it."""
    budget = matched_budget_of(record)
    shape = "×".join(str(budget.get(key, "?")) for key in ("steps", "batch_size", "seq_len"))
    return f"{shape}, {budget.get('epochs', 1)} epochs, lr {budget.get('lr', '?')}"


#: what reading a record that passed the schema but not our reading of it raises
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def protocol_values(record: dict) -> dict:
    """The settings of a record that say how its samples were made and scored: the scorer and
    whether it is the backbone itself, samples per seed, their length in tokens, the dtype the
    models computed in (those a record lacks are left out)."""
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    sampling = config.get("sampling") if isinstance(config.get("sampling"), dict) else {}
    values = {"scorer": record.get("evaluator"),
              "scorer_is_backbone": config.get("evaluator_is_backbone", record.get("evaluator") == record.get("backbone")),
              "samples": sampling.get("samples"), "seq_len": sampling.get("seq_len"), "dtype": config.get("dtype")}
    return {key: value for key, value in values.items() if value is not None}


def malformed(path: Path, exc: Exception) -> DihalError:
    if isinstance(exc, KeyError):
        return DihalError(f"run record {path} is malformed: missing field {one_line(exc)}")
    return DihalError(f"run record {path} is malformed ({type(exc).__name__}: {one_line(exc)})")


def newest_per_seed(records: list[tuple[str, dict, Path, Integrity]],
                    warn: Callable[[str], None]) -> list[tuple[str, dict, Path, Integrity]]:
    """One group's records with each (configuration, seed) kept once, from the newest record that
    has it (by ``created``): a seed run again under the same configuration (to add a metric, after
    a fix) replaces its older numbers instead of counting twice. A record left with no seed is
    dropped; each dropped seed is named in a warning. File-name order is kept for the rest."""
    taken: dict[tuple[str, int], str] = {}  # (configuration, seed) -> the newer record that keeps it
    kept: dict[str, tuple[str, dict, Path, Integrity]] = {}
    for source, record, path, integrity in sorted(records, key=lambda item: str(item[1].get("created", "")),
                                                  reverse=True):
        configuration = json.dumps(record.get("config"), sort_keys=True)
        entries = []
        for entry in record["per_seed"]:
            newer = taken.get((configuration, entry["seed"]))
            if newer is not None:
                warn(f"seed {entry['seed']} of {source} is also in the newer {newer}: only the newer is pooled")
            else:
                entries.append(entry)
        taken.update({(configuration, entry["seed"]): source for entry in entries})
        if entries:
            kept[source] = (source, {**record, "per_seed": entries}, path, integrity)
    return [kept[source] for source, *_ in records if source in kept]


def _integrity(raw: dict, path: Path, warn: Callable[[str], None]) -> Integrity:
    """The record's seal checked, with a warning for an unsealed record and for cited job results
    (where its job store is at hand) that changed; a damaged record is warned about by the caller."""
    jobs = raw.get("jobs")
    store = Path(jobs) if isinstance(jobs, str) and jobs else None
    integrity = record_integrity(raw, store)
    if integrity.status == UNVERIFIED:
        warn(f"{path} {integrity.detail}; included, marked unverified")
    elif integrity.changed:
        warn(f"{path}: the job result(s) it cites changed since it was sealed ({', '.join(integrity.changed)} "
             f"in {store}); its own numbers are intact")
    return integrity


#: the largest file read as a run record: the committed ones are a few hundred kB, a large study's
#: a few MB; a file past this is not read into memory at all
MAX_RECORD_BYTES = 64 * 2**20


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``, as stored (its format tag and seal are read from it);
    DihalError when it is none: a file over `MAX_RECORD_BYTES`, invalid UTF-8, nesting deeper
    than the parser recurses, a key twice in one object (which value is the record's?), a
    NaN or Infinity (not JSON, though Python writes and reads them), or a number past
    `MAX_MAGNITUDE`."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DihalError(f"run record {path} cannot be read ({exc.strerror or exc})") from None
    if size > MAX_RECORD_BYTES:
        raise DihalError(f"run record {path} is {size / 2**20:,.0f} MiB, over the {MAX_RECORD_BYTES / 2**20:.0f} MiB "
                         "a run record may be: it is not one (move it out of the results folder)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys,
                            parse_constant=_no_constant, parse_float=_bounded(float), parse_int=_bounded(int))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise DihalError(f"run record {path} is not readable JSON ({one_line(exc)})") from None
    if not isinstance(record, dict):
        raise DihalError(f"run record {path} is not a JSON object but a JSON {type(record).__name__}")
    try:  # JSON may spell lone UTF-16 surrogates, which no output file can encode
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise DihalError(f"run record {path} holds text that is not valid Unicode (a lone surrogate)") from None
    return record


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"key {twice[:60]!r} appears twice in one object")
    return dict(pairs)


#: the largest magnitude a record's number may have: a standard deviation over seeds sums squares,
#: which overflow float64 past ~1.3e154; no measurement comes near (a perplexity is below the vocabulary)
MAX_MAGNITUDE = 1e150


def _bounded(kind):
    def parse(text: str):
        value = kind(text)
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError(f"the number {text[:40]} is past {MAX_MAGNITUDE:g}, which no measurement reaches")
        return value
    return parse


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (a record holds None where it has no value)")


#: the longest suite, backbone or evaluator name read: each titles a table (the folder name is cut to fit)
MAX_NAME_CHARS = 1000


def _name(value, what: str) -> str:
    """A name a record gives (suite, backbone, evaluator): a non-empty string."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what!r} must be a non-empty string, got {type(value).__name__} {value!r:.40}")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{what!r} is {len(value):,} characters long, over {MAX_NAME_CHARS}")
    return value


def _integer(value, what: str) -> int:
    """A seed or layer number. Strictly an int (the schema's "integer" also takes 3.0): these
    key the rows, and a 3.0 would print as a different layer than 3."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")
    return value


def _number(value) -> float:
    """A record value as a float; NaN for anything that is not a number (None, text, bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def record_rows(record: dict, source: str) -> tuple[dict[str, list[dict]], list[int], list[str]]:
    """One record as flat rows, one per (seed, method), (seed, layer), (seed, proxy), (seed, locate
    layer), (seed, sampling-steps point) and (seed, frontier point), each tagged with the record's file
    name and the seed, and one per stage of the run (`stage_values`, the file name only); plus the
    record's seeds and its notes (why a seed has no rank correlations)."""
    rows: dict[str, list[dict]] = {kind: [] for kind in ROW_KINDS}
    seeds, notes = [], []
    metrics = list(record["metrics"])
    suite_steps = (record["config"].get("bridge") or {}).get("sample_steps")
    for entry in record["per_seed"]:
        seed = _integer(entry["seed"], "seed")
        seeds.append(seed)
        tag = {"record": source, "seed": seed}
        rows["methods"] += [{**tag, "method": name, **scale_values(name, method),
                             **method_values(method, metrics), **compute_values(record, entry, name)}
                            for name, method in entry["methods"].items()]
        rows["steps"] += [{**tag, **steps_values(point, suite_steps)} for point in entry.get("steps_axis") or []]
        rows["frontier"] += [{**tag, **point} for point in frontier_values(entry, record["config"], metrics)]
        layers, z = layer_values(entry["locate"], entry["sweep"]["layers"])
        rows["layers"] += [{**tag, **row} for row in layers]
        rows["z"] += [{**tag, **row} for row in z]
        for key, suffix in CORRELATION_SETS.items():
            for name, values in (entry["sweep"].get(key) or {}).items():
                if isinstance(values, dict):
                    estimates = {k: _number(values.get(k)) for k in CORRELATION_KEYS}
                    rows["proxies"].append({**tag, "proxy": name + suffix, **estimates,
                                            "swept_layers": _number(values.get("n"))})
                elif not suffix:  # {"warning": why there are none}, said once
                    notes.append(f"No rank correlations for seed {seed} of {source}: {values}.")
    rows["stages"] = stage_values(record, source)
    return rows, seeds, notes


@dataclass(frozen=True)
class RankSeries:
    """One seed's swept layers as rank tests read them: each series (S(ℓ), each proxy signed so
    that higher is better, each other preprocessing's S(ℓ), ``depth`` = −ℓ) and each bridge-error
    target negated (key: the proxy-row suffix of `CORRELATION_SETS`), over the swept layers that
    locate scored, shallowest first. The same series `dihal_bench.hybrid.sweep.layer_correlations` builds."""

    layers: list[int]
    series: dict[str, list[float]]
    targets: dict[str, list[float]]


def rank_series(entry: dict) -> RankSeries | None:
    """The seed's rank series, or None where fewer than 3 swept layers were scored or a target
    value is missing (a record from before the trace-metric error has no such target)."""
    located = entry["locate"]
    index = {_integer(layer, "locate layer"): i for i, layer in enumerate(located["layers"])}
    swept = sorted((row for row in entry["sweep"]["layers"] if row["layer"] in index), key=lambda row: row["layer"])
    if len(swept) < 3:
        return None
    layers = [_integer(row["layer"], "sweep layer") for row in swept]
    series = located_series({**located, "layers": list(index)}, layers, _number)
    targets = {}
    for suffix, key in ((CORRELATION_SETS["correlations"], "bridge_mse"),
                        (CORRELATION_SETS["correlations_trace"], "bridge_mse_trace")):
        values = [-_number(row.get(key)) for row in swept]
        if all(math.isfinite(value) for value in values):
            targets[suffix] = values
    return RankSeries(layers, series, targets)


#: the compute columns of a method row (compute_values), which no metric may be named
COMPUTE_KEYS = ("train_pflop", "gflop_per_token")


def compute_values(record: dict, entry: dict, name: str) -> dict:
    """A method row's training PFLOP in all and inference GFLOP per generated token, as recorded or
    counted from the record's shapes (docs/method.md#counting-compute); NaN where not known."""
    row = entry["methods"][name]
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    budget = row.get("budget") or entry.get("budget") or config.get("budget")  # a scaled row has its own
    if not isinstance(row.get("compute"), dict) and not budget:
        return {"train_pflop": float("nan"), "gflop_per_token": float("nan")}  # a record too old to count from
    counted = row_compute(record, entry, name)
    return {"train_pflop": _number(counted.get("train_flops")) / 1e15,
            "gflop_per_token": _number(counted.get("inference_flops_per_token")) / 1e9}


def scale_values(name: str, method: dict) -> dict:
    """The row a method label is and its budget scale (docs/method.md#budget-scales): the scale from the
    record's ``scale`` where it has one (records before scales have none: scale 1), checked against the
    label's ``@<s>x``, since a table keyed by the one and a plot by the other must not disagree."""
    row, named = split_scale(name)
    scale = _integer(method["scale"], "method scale") if "scale" in method else named
    if scale != named:
        raise ValueError(f"method {name!r} says scale {scale}, its label scale {named}")
    return {"row": row, "scale": scale}


def method_values(method: dict, metrics: list[str]) -> dict:
    """A method's row: its labels, each metric's value and the count it was computed on (side
    value ``<metric>_n``, as ``<metric>_samples``), latency, training and lm-eval results."""
    layer = method.get("layer")
    values = {"kind": method["kind"], "in_budget": method["in_budget"],
              "layer": None if layer is None else _integer(layer, "method layer"),
              "test_nll_kind": (method.get("test_nll") or {}).get("kind") or "",
              "draw_precision": method.get("draw_precision") or ""}
    taken = set(METHOD_ROW_LABELS) | set(METHOD_CORE_VALUES) | {"trainable_params", "valid_samples", *COMPUTE_KEYS}
    reported = method["metrics"]
    for metric in metrics:
        for key in (metric, f"{metric}_samples", f"{metric}_low", f"{metric}_high"):
            if key in taken:
                raise ValueError(f"metric name {metric!r} is taken by a methods table column ({key!r})")
            taken.add(key)
        values[metric] = _number(reported.get(metric))
        count = _number(reported.get(f"{metric}_n"))
        if not math.isnan(count):  # a column only where some metric reports its count
            values[f"{metric}_samples"] = count
        for bound in ("low", "high"):  # a metric's own interval (MAUVE's bootstrap), where it reports one
            value = _number(reported.get(f"{metric}_ci_{bound}"))
            if not math.isnan(value):
                values[f"{metric}_{bound}"] = value
        valid = _number(reported.get(f"{metric}_n_valid"))
        if "valid_samples" not in values and not math.isnan(valid):  # metrics share one validity rule
            values["valid_samples"] = valid
    for key, (section, name) in METHOD_CORE_VALUES.items():
        values[key] = _number((method.get(section) or {}).get(name))  # a reference method has no latency ratio
    values["trainable_params"] = float(sum(method["parameters"].values()))
    for task, results in (method.get("lm_eval") or {}).items():
        for metric, value in results.items():
            # numbers only (lm-eval also reports aliases), and no standard errors: a seed's stderr
            # averaged over seeds is no interval; the seeds' spread is the table's
            if not math.isnan(_number(value)) and "_stderr" not in metric:
                values[f"lm_eval/{task}/{metric}"] = _number(value)
    return values


def steps_values(point: dict, suite_steps) -> dict:
    """A sampling-steps point's row; ``suite_k``: whether K is the one the suite's DiHAL rows use."""
    steps = _integer(point["steps"], "steps-axis steps")
    return {"steps": steps, "sampler": str(point.get("sampler") or ""), "suite_k": steps == suite_steps,
            "layer": _integer(point["layer"], "steps-axis layer"), **{key: _number(point.get(key)) for key in STEPS_KEYS}}


#: a frontier point's sampling settings (docs/method.md#frontiers)
FRONTIER_AXES = ("temperature", "diffusion_steps")


def stage_values(record: dict, source: str) -> list[dict]:
    """The record's stages as rows (record, stage, rates, estimated and taken seconds, the share of
    them done on the estimating machine, FLOPs, FLOP/s); none where the record kept no estimate."""
    estimate = record.get("estimate")
    if not isinstance(estimate, dict):
        return []
    timings, compute = record.get("timings") or {}, record.get("compute") or {}
    rates = "measured" if str(estimate.get("source", "")).startswith("measured") else "assumed"
    rows = []
    for stage, estimated in (estimate.get("stages") or {}).items():
        took, counted = timings.get(stage), compute.get(stage) or {}
        rows.append({"record": source, "stage": stage, "rates": rates, "estimated_seconds": _number(estimated),
                     "seconds": _number(took), "ratio": _number(took) / _number(estimated) if estimated else math.nan,
                     "made_here": made_here(record, stage, _number(took)),
                     "pflop": _number(counted.get("flops")) / 1e15,
                     "gflop_per_second": _number(counted.get("flops_per_second")) / 1e9})
    return rows


def made_here(record: dict, stage: str, took: float) -> float:
    """The share of a stage's time done on the machine that made the record's estimate (its first
    sitting's, `dihal_bench.study.first_estimate`; the one that wrote the record where the estimate
    names none) from `dihal_bench.study.metering`'s ``machines``, the seconds each machine's jobs
    added; NaN where the record does not say (older records, Ray workers) or the stage took no time.
    A stage of `METHOD_STAGES` gets the share of the four together: they are metered as one executor
    stage, ``methods``, whose provenance says which machines did its jobs, not which stage each was."""
    estimating = (record.get("estimate") or {}).get("machine") or record.get("environment") or {}
    stages = (record.get("provenance") or {}).get("stages") or {}
    if stage in METHOD_STAGES and stage not in stages:
        timings = record.get("timings") or {}
        stage, took = "methods", sum(_number(timings.get(name, 0.0)) for name in METHOD_STAGES)
    machines = (stages.get(stage) or {}).get("machines")
    if not isinstance(machines, list) or not estimating.get("host_sha256") or not took > 0:
        return math.nan
    elsewhere = sum(_number(line.get("seconds")) for line in machines if not same_machine(line, estimating))
    return max(0.0, 1.0 - elsewhere / took)


def frontier_values(entry: dict, config: dict, metrics: list[str]) -> list[dict]:
    """The seed's frontier points as rows (method, axis, setting, each metric), each row's own point
    (the suite's setting) first on every axis it has points on, so that a frontier includes the row."""
    points = entry.get("frontier") or []
    sampling = config.get("sampling") or {}
    rows = []
    for method in dict.fromkeys(point["method"] for point in points):
        own = entry["methods"][method]
        for axis in FRONTIER_AXES:
            mine = [point for point in points if point["method"] == method and axis in point]
            if not mine:
                continue
            made = [(sampling.get(axis), own["metrics"], True), *((point[axis], point["metrics"], False) for point in mine)]
            rows += [{"method": method, "axis": axis, "setting": _number(value), "suite_setting": suite,
                      **{metric: _number(values.get(metric)) for metric in metrics}}
                     for value, values, suite in sorted(made, key=lambda made: _number(made[0]))]
    return rows


def layer_values(locate: dict, sweep_rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Rows of the layer table (swept layers and ℓ*) and of the z-score plot (every layer)."""
    index = {_integer(layer, "locate layer"): i for i, layer in enumerate(locate["layers"])}
    proxies = locate["proxies"]
    clashing = LAYER_ROW_KEYS.intersection(proxies)
    if clashing:
        raise ValueError(f"proxy name {min(clashing)!r} is taken by a layer table column")
    swept = {_integer(row["layer"], "sweep layer"): row for row in sweep_rows}
    chosen = _integer(locate["chosen_layer"], "chosen_layer")
    layers = []
    for layer in sorted(set(swept) | {chosen}):
        i = index.get(layer)
        row = {"layer": layer, "chosen": layer == chosen}
        for name, proxy in proxies.items():
            row[name] = _number(proxy["values"][i]) if i is not None else math.nan
        row["score"] = _number(locate["score"][i]) if i is not None else math.nan
        row.update({key: _number(swept.get(layer, {}).get(key)) for key in SWEEP_KEYS})
        layers.append(row)
    z = [{"layer": layer, "score": _number(locate["score"][i]),
          **{name: _number(proxy["z"][i]) for name, proxy in proxies.items()}}
         for layer, i in index.items()]
    return layers, z


#: Line breaks (\n, \r, U+2028, ...) and every other control character. Folded to spaces in
#: all text output: a name from a record must not end a Markdown table row or a LaTeX comment.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text) -> str:
    """``str(text)`` with every line break and control character replaced by a space."""
    return _CONTROL.sub(" ", str(text))


def assign_folders(groups: list[Group]) -> None:
    """Give each group its output folder: the slugs of its suite, backbone and evaluator
    joined by ``-``. Groups whose folders would coincide (slugs lose characters and length,
    the joining ``-`` is ambiguous, and some file systems ignore case) all get a digest of
    their three names appended, so that no group's files overwrite another's."""
    plain = ["-".join(slug(part) for part in (g.suite, g.backbone, g.evaluator)) for g in groups]
    taken = Counter(folder.casefold() for folder in plain)
    for group, folder in zip(groups, plain):
        if taken[folder.casefold()] > 1:
            names = [group.suite, group.backbone, group.evaluator] + ([group.budget] if group.budget else [])
            names = json.dumps(names)  # ASCII: non-ASCII is \u-escaped
            folder = f"{folder}-{hashlib.sha256(names.encode('ascii')).hexdigest()[:8]}"
        group.folder = folder
