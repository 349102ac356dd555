"""Whether the samples a job store holds are a record's own, before they are exported as its samples.

A record's seal keeps the sha256 of each cited job's result.json, and a samples job's result.json
keeps the sha256 of its samples file (which the export checks). So where the store's result.json is
the sealed one, the store's samples are the record's. Where it is not, the job was done again since
the record (another run's store with the same job keys, a store rebuilt on another machine) and its
samples may differ: a sampler or a training changed between revisions, or another machine's rounding
tipped one draw, and every later token of that sample follows another path.

Then the record's own fingerprint of each sample decides: the texts it keeps (``samples.examples``)
and, from Gen.PPL's side values, every sample's evaluator token count and summed NLL, set against the
store's own scoring of the same samples (its metrics job for that samples job, with the record's
evaluator). Token counts must be equal and NLLs within `NLL_RTOL` of each other. The evaluator scores in
float32, and the same text scored on two machines or thread counts differs only by rounding in the
order of its sums: 7·10⁻⁷ relative at most over the 17 rows × 128 samples of the diagnostic record of
seed 1, rescored on another machine (measured). A changed text changes at least one token's NLL, a
term of order one nat in a sum of a few hundred, so 10⁻⁴ separates the two by orders of magnitude.
A metrics job is keyed by its samples job's key, not by the samples' content, so a store in which a
samples job was deleted and done again under other code keeps the older scoring: the kept texts,
read from the samples themselves, are checked first for that reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dihal_bench.study.jobs import RESULT, JobStore
from dihal_bench.study.records import record_integrity
from dihal_bench.study.samples import read_samples

#: how far the store's summed NLL of a sample may be from the record's (relative) for the same text
NLL_RTOL = 1e-4


def unmatched_rows(record: dict, store: JobStore) -> list[str]:
    """One sentence for each row (method or frontier point, per seed) whose samples in ``store`` are not
    shown to be the record's (the module's docstring says how); [] where every row's are. A record
    without a seal (written just now, in memory) is taken as it is: its store is the one it names."""
    changed = set(record_integrity(record, Path(store.root)).changed)  # cited results unlike the sealed ones
    scorings = None
    problems = []
    for seed, method, entry, setting in sample_entries(record):
        job = Path(entry["samples"]["path"]).parts[0]
        if f"{job}/{RESULT}" not in changed:
            continue  # the sealed job itself, one the seal does not cover, or none (the export says so)
        if scorings is None:
            scorings = store_scorings(store)
        problem = fingerprint_problem(entry, store, scorings.get((entry.get("samples_job"), record.get("evaluator"))),
                                      record.get("evaluator"))
        if problem is not None:
            problems.append(f"{describe(seed, method, setting)}: its samples job {job} was done again since the "
                            f"record, and {problem}")
    return problems


def sample_entries(record: dict) -> list[tuple[int, str, dict, dict]]:
    """(seed, method, entry, setting) for each method and then each frontier point of each seed that
    drew samples, in the record's order; ``setting`` is a frontier point's temperature or number of
    denoising steps (docs/method.md#frontiers), {} for a method's own row."""
    entries = []
    for seed_entry in record.get("per_seed") or []:
        seed = seed_entry["seed"]
        for name, method in (seed_entry.get("methods") or {}).items():
            if isinstance((method.get("samples") or {}).get("path"), str):  # else a row that draws none
                entries.append((seed, name, method, {}))
        for point in seed_entry.get("frontier") or []:
            setting = {key: point[key] for key in ("temperature", "diffusion_steps") if key in point}
            entries.append((seed, point["method"], point, setting))
    return entries


def describe(seed: int, method: str, setting: dict) -> str:
    """How an error names one row's samples: ``mdlm (seed 1)``, ``mdlm at {'temperature': 0.7} (seed 1)``."""
    return f"{method}{f' at {setting}' if setting else ''} (seed {seed})"


def fingerprint_problem(entry: dict, store: JobStore, scored: tuple[list, list] | None,
                        evaluator: str | None) -> str | None:
    """Why the store's samples of ``entry`` do not match its fingerprint (``scored``: the store's
    per-sample NLLs and token counts of them under ``evaluator``, None where it holds none), or None
    when they do."""
    texts, _ = read_samples(store.resolve(entry["samples"]["path"]))
    examples = entry["samples"].get("examples") or []
    if texts[:len(examples)] != list(examples):
        return "its first texts are not the ones the record keeps"
    metrics = entry.get("metrics") or {}
    nll, tokens = metrics.get("gen_ppl_nll_per_sample"), metrics.get("gen_ppl_tokens_per_sample")
    if not (isinstance(nll, list) and isinstance(tokens, list)):
        return "the record keeps no per-sample NLLs to tell its samples by"
    if scored is None:
        return f"the store holds no scoring of them under {evaluator} to compare with"
    theirs, their_tokens = scored
    if their_tokens != tokens:
        differ = sum(a != b for a, b in zip(their_tokens, tokens)) + abs(len(their_tokens) - len(tokens))
        return f"{differ} of {len(tokens)} samples have another token count under {evaluator}"
    differ = sum(not _same_nll(a, b) for a, b in zip(theirs, nll))
    if differ:
        return f"{differ} of {len(nll)} samples score otherwise under {evaluator} (relative tolerance {NLL_RTOL:g})"
    return None


def store_scorings(store: JobStore) -> dict[tuple[str, str], tuple[list, list]]:
    """(per-sample NLLs, token counts) of each finished metrics job in ``store`` that keeps them, by
    (the samples job's key, the evaluator): read once for all the rows of a record."""
    scorings = {}
    for spec_path in sorted(Path(store.root).glob("metrics-*/spec.json")):
        try:
            spec = json.loads(spec_path.read_text(encoding="utf-8"))["spec"]
            result = json.loads((spec_path.parent / RESULT).read_text(encoding="utf-8"))["result"]
            nll, tokens = result.get("gen_ppl_nll_per_sample"), result.get("gen_ppl_tokens_per_sample")
            key = (spec["samples"], spec["evaluator"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # an unfinished or unreadable metrics job tells nothing
        if isinstance(nll, list) and isinstance(tokens, list):
            scorings.setdefault(key, (nll, tokens))
    return scorings


def _same_nll(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=NLL_RTOL)
