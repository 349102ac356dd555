"""The paper's claims, each measured on the run records and decided by a rule written down before
the numbers (docs/method.md#claims-and-decision-rules): ``dihal-bench claims``, whose Markdown a text
embeds between ``<!-- claims:start -->`` and ``<!-- claims:end -->`` (its summary, claim and verdict
alone, between ``<!-- claims:summary:start -->`` and ``<!-- claims:summary:end -->``; the summary of one
suite's claims alone between ``<!-- claims:summary:SUITE:start -->`` and ``<!-- claims:summary:SUITE:end -->``).

Records are read and pooled as the leaderboard reads them (`read.read_groups`: each (configuration,
seed) once, from its newest record). Every verdict is one of `VERDICTS` and cites its rule and its
interval; a claim whose records lack the data (per-sample NLLs in records made before they were
kept) is "not tested", never given a number the records do not hold. In a group whose records train
rows at several budget scales, a paired Gen.PPL claim's verdict cell lists one of `VERDICTS` per scale
(docs/method.md, "Claims across budget scales").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.degenerate import UNIGRAM, seed_flags
from dihal_bench.leaderboard.read import Group, rank_series, read_groups
from dihal_bench.leaderboard.render import markdown_text
from dihal_bench.numerics.seeds import SeedsNeeded, seeds_needed, t_interval
from dihal_bench.numerics.stats import (
    SampleNLL,
    Stratum,
    log_gen_ppl,
    paired_log_ppl_difference,
    spearman_versus,
    stratified_rank_test,
)
from dihal_bench.study.plan import scaled_label, split_scale

START_MARKER = "<!-- claims:start -->"
END_MARKER = "<!-- claims:end -->"
SUMMARY_START = "<!-- claims:summary:start -->"
SUMMARY_END = "<!-- claims:summary:end -->"
#: a summary of the claims measured on one suite's records (a front page that shows one study)
SUITE_SUMMARY = re.compile(r"<!-- claims:summary:(?P<suite>[\w.-]+):start -->")
#: the paper's Spearman ρ of S(ℓ) with bridgeability (Llama-3.1-8B; 0.93 on Qwen3-8B): the lower one
PAPER_RHO = 0.91
#: every test and interval of the table is at this level (two-sided 95%)
ALPHA = 0.05
#: how much worse than the oracle layer ℓ* may be on Gen.PPL and still be "competitive" (a ratio)
ORACLE_MARGIN = 1.10
#: fixed draws, so that the table is the same on every machine and run (N_BOOT_SEED: the
#: within-seed bootstraps behind a "seeds needed" figure)
N_PERM, N_BOOT, N_BOOT_SEED, SEED = 10_000, 2_000, 500, 0
REPRODUCED, NOT_REPRODUCED, NOT_SHOWN, NOT_TESTED = "reproduced", "not reproduced", "not shown", "not tested"
#: the answers to this benchmark's own questions (the rivals rows), which are not the paper's claims
YES, NO = "yes", "no"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_SHOWN, NOT_TESTED, YES, NO)
#: the continuous-diffusion baselines the paper compares DiHAL with; the claim is about these
#: (variants and controls of them, and the rivals, are rows of the tables but not of the claim)
PAPER_BASELINES = ("diffusion-lm", "sed", "ld4lg", "codar")
#: what a researcher would otherwise do with the same backbone and allowance (issue 21): each a
#: question of this benchmark, answered from the records that hold the row
RIVALS = {
    "ar-lora": "the backbone fine-tuned autoregressively with LoRA",
    "ar2diff-lora": "the backbone adapted into a masked-diffusion LM with LoRA",
    "mdlm": "masked diffusion (MDLM) trained from scratch",
}
NO_NLL = "not tested: the records keep no per-sample NLLs (records from before they were kept), so no interval"
#: the row every paired Gen.PPL claim puts against another: DiHAL at the geometry-chosen layer ℓ*
DIHAL = "dihal-chosen"


@dataclass(frozen=True)
class Claim:
    """One row of the claims table: the paper's claim, what the records measure, the rule, the
    interval (or test) the rule reads, and the verdict."""

    claim: str
    measurement: str
    rule: str
    interval: str
    verdict: str
    #: the group it was measured on, "backbone (suite)"; empty for a claim no record speaks to
    where: str = ""
    #: the suite of that group (empty as ``where`` is)
    suite: str = ""


def claims_of(results_dir: Path, warn: Callable[[str], None] = print) -> list[Claim]:
    """The claims of the run records in ``results_dir``, pooled as the leaderboard pools them."""
    return evaluate(read_groups(Path(results_dir), warn))


def evaluate(groups: list[Group]) -> list[Claim]:
    """Every claim each group's records can speak to: the geometry claim where a group has a sweep;
    the paper's method claims where DiHAL at ℓ* has a Gen.PPL on every seed and the suite runs the
    paper's comparison (a row of `PAPER_BASELINES`); the latency claim from every group with a
    Gen.PPL, since each run times its decodes afresh; each rival where a group holds its row.

    A suite built for another question (the rivals suite) also holds DiHAL at ℓ* and its regressor
    control, but from the same seeds and settings as the diagnostic suite's: its samples are the
    same samples again, so a second row of the paper's claims from it would count one measurement
    twice, not add a replication."""
    def on(group: Group, claim: Claim) -> Claim:
        return replace(claim, where=name(group), suite=group.suite)

    rows: list[Claim] = []
    for group in groups:
        rows += [on(group, correlation_claim(group))] if any(rank_series(e) for _, e in group.entries) else []
    compared = [group for group in groups if has_gen_ppl(group)]
    paper = [group for group in compared if set(first_methods(group)) & set(PAPER_BASELINES)]
    for group in paper:
        rows += [on(group, claim) for claim in paper_claims(group)]
    if compared and not paper:
        rows.append(Claim(CLAIM_BASELINES, "no committed record with Gen.PPL holds a row of the paper's baselines",
                          "—", "no measurement", NOT_TESTED))
    rows += [on(group, latency_claim(group)) for group in compared]
    for rival in RIVALS if compared else ():
        holding = [group for group in compared if rival in row_scales(group)]
        rows += [on(group, claim) for group in holding for claim in rival_rows(group, rival)] or [untested_rival(rival)]
    return rows


def paper_claims(group: Group) -> list[Claim]:
    """The paper's method claims from a group that runs its comparison. With one budget scale, as
    they always were; with several, the paired ones decided at each scale and then at matched training
    compute, one row per other row (docs/method.md, "Claims across budget scales"). The oracle claim
    compares two layers of DiHAL, not DiHAL with another row, so it stays at the matched budget."""
    if not multi_scale(group):
        return [baselines_claim(group), oracle_claim(group), regressor_claim(group)]
    baselines = paper_baselines(group)
    return [across_scales(group, {s: baselines_claim(group, s) for s in shared_scales(group, baselines)}),
            oracle_claim(group),
            across_scales(group, {s: regressor_claim(group, s) for s in shared_scales(group, ["control-regressor"])}),
            *[compute_matched(group, other) for other in [*baselines, "control-regressor"]
              if other in row_scales(group)]]


def rival_rows(group: Group, rival: str) -> list[Claim]:
    """The question about ``rival`` from a group that holds it: one row with one budget scale; with
    several, the row per scale and the row at matched training compute."""
    if not multi_scale(group):
        return [rival_question(group, rival)]
    return [across_scales(group, {s: rival_question(group, rival, s) for s in shared_scales(group, [rival])}),
            compute_matched(group, rival)]


def has_gen_ppl(group: Group) -> bool:
    """Whether every pooled seed scored DiHAL at ℓ* with Gen.PPL: the method claims are about text
    under an evaluator (a known-answer suite on a synthetic language has none)."""
    return bool(group.entries) and all(
        isinstance(((entry["methods"].get("dihal-chosen") or {}).get("metrics") or {}).get("gen_ppl"), (int, float))
        for _, entry in group.entries)


def render(rows: list[Claim]) -> str:
    header = ["claim of the paper", "measured here (pooled seeds)", "decision rule", "interval / test", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in (row.claim, row.measurement, row.rule, row.interval,
                                                               f"**{row.verdict}**")) + " |" for row in rows]
    return "\n".join(lines)


def render_summary(rows: list[Claim]) -> str:
    """The claims table cut to what a reader scans first: each claim, where it was measured, its verdict."""
    lines = ["| claim of the paper | measured on | verdict |", "|---|---|---|"]
    lines += [f"| {cell(row.claim)} | {cell(row.where) or '—'} | **{cell(row.verdict)}** |" for row in rows]
    return "\n".join(lines)


def cell(text: str) -> str:
    """A table cell of our own text: one line, and a pipe that cannot end the cell."""
    return " ".join(text.split()).replace("|", "\\|")


# --- the geometry claim --------------------------------------------------------------------------


def correlation_claim(group: Group) -> Claim:
    """S(ℓ) ranks layers by bridgeability with ρ ≈ 0.91: pooled permutation test against 0, Fisher-z
    test against the paper's value, and the depth control with its power."""
    per_seed = [s for s in (rank_series(entry) for _, entry in group.entries) if s is not None and "" in s.targets]
    claim = f"S(ℓ) correlates with bridge quality, Spearman ρ ≈ {PAPER_RHO}"
    rule = (f"reproduced iff ρ > 0 at pooled p ≤ {ALPHA} and ρ is not significantly below {PAPER_RHO}; not "
            f"reproduced iff H₀: ρ = {PAPER_RHO} is rejected below (one-sided p ≤ {ALPHA}); else not shown")
    untestable = untestable_series(per_seed)
    if untestable:
        return Claim(claim, f"{name(group)}: {untestable}", rule, "none", NOT_TESTED)
    rhos = [stratified_rank_test([Stratum(s.series["score"], s.targets[""])])["rho"] for s in per_seed]
    pooled = stratified_rank_test([Stratum(s.series["score"], s.targets[""]) for s in per_seed],
                                  n_perm=N_PERM, seed=SEED)
    depth = stratified_rank_test([Stratum(s.series["depth"], s.targets[""]) for s in per_seed],
                                 n_perm=N_PERM, seed=SEED)
    partial = stratified_rank_test([Stratum(s.series["score"], s.targets[""], s.layers) for s in per_seed],
                                   n_perm=N_PERM, seed=SEED)
    versus = spearman_versus(rhos, [len(s.layers) for s in per_seed], PAPER_RHO, level=1 - ALPHA)
    layers = sorted({len(s.layers) for s in per_seed})
    measurement = (
        f"{name(group)}: Spearman ρ of S(ℓ) with −(bridge MSE) over {'/'.join(map(str, layers))} swept layers "
        f"= {fmt(pooled['rho'])} ({seeds(group)}: {' / '.join(fmt(r) for r in rhos)}), pooled permutation "
        f"p = {p_text(pooled['p'])}; depth alone ρ = {fmt(depth['rho'])}. {beyond_depth(partial)}")
    interval = (f"95% CI of ρ [{fmt(versus['low'])}, {fmt(versus['high'])}] (Fisher z, Bonett–Wright variance, "
                f"seeds pooled); H₀: ρ = {PAPER_RHO}: z = {versus['z']:.2f}, p = {p_text(versus['p_below'])}")
    if versus["p_below"] <= ALPHA:
        verdict = NOT_REPRODUCED
    elif pooled["p"] <= ALPHA and pooled["rho"] > 0:
        verdict = REPRODUCED
    else:
        verdict = NOT_SHOWN
        # on Fisher's z scale, each seed's ρ with Bonett & Wright's variance, against ρ = 0
        z = [math.atanh(max(-0.999999, min(0.999999, r))) for r in rhos]
        within = [(1 + r * r / 2) / (len(s.layers) - 3) for r, s in zip(rhos, per_seed)]
        interval += "; " + seeds_needed(z, within).text() + " (Fisher z of ρ against 0)"
    return Claim(claim, measurement, rule, interval, verdict)


def beyond_depth(partial: dict) -> str:
    """The partial ρ given depth with its power statement, or why there is none."""
    if partial["rho"] is None:
        return ("Beyond depth: no partial ρ, S(ℓ) or the error ranks the layers exactly as depth does "
                f"(depth leaves {100 * partial['residual_share_y']:.1f}% of the error's rank variance)")
    return (f"Beyond depth: partial ρ = {fmt(partial['rho'])}, p = {p_text(partial['p'])}, where depth leaves "
            f"{100 * partial['residual_share_y']:.1f}% of the error's rank variance and only |partial ρ| ≥ "
            f"{fmt(partial['critical_rho'])} could be detected at α = {ALPHA}")


def untestable_series(per_seed: list) -> str | None:
    """Why the seeds' sweeps cannot carry the geometry tests, or None: each needs at least 4 swept
    layers (a partial ρ given depth, and Fisher's z), and a score and an error that vary beyond depth."""
    if not per_seed:
        return "no seed has a sweep with its bridge MSE"
    if min(len(s.layers) for s in per_seed) < 4:
        return f"{min(len(s.layers) for s in per_seed)} swept layers; the tests need at least 4 per seed"
    series = [Stratum(s.series["score"], s.targets[""], s.layers) for s in per_seed]
    if not all(math.isfinite(v) for stratum in series for v in stratum.x):
        return "S(ℓ) is missing at a swept layer"
    if stratified_rank_test([Stratum(st.x, st.y) for st in series], n_perm=1)["rho"] is None:
        return "S(ℓ) or the bridge error is constant over the swept layers: nothing to rank"
    return None


# --- the method claims ---------------------------------------------------------------------------


def baselines_claim(group: Group, scale: int = 1) -> Claim:
    """DiHAL at ℓ* has a lower Gen.PPL than every matched-budget baseline: both sides at ``scale``
    (the paper's baselines that the records train at it)."""
    dihal = scaled_label(DIHAL, scale)
    rivals = [method for method, row in first_methods(group).items()
              if split_scale(method) in {(base, scale) for base in PAPER_BASELINES}
              and row["kind"] == "baseline" and row["in_budget"]]
    ratios = "; ".join(f"{markdown_text(rival)} {per_seed_ratio(group, dihal, rival)}" for rival in rivals)
    comparisons = {rival: compare(group, dihal, rival) for rival in rivals}
    measurement = (f"{name(group)}: Gen.PPL of DiHAL at ℓ\\* ÷ each matched baseline's ({seeds(group)}): {ratios}"
                   f"{floor_note(list(comparisons.values()))}{compute_note(group, dihal, rivals)}")
    rule = (f"reproduced iff, for every matched baseline, the paired {100 * (1 - ALPHA):.0f}% interval of "
            "log Gen.PPL(DiHAL) − log Gen.PPL(baseline) lies below 0; not reproduced iff one lies above 0; "
            f"else not shown. {FLOOR_RULE}")
    if not rivals:
        return Claim(CLAIM_BASELINES, measurement, rule, "no matched baseline in the records", NOT_TESTED)
    untested = [c.reason for c in comparisons.values() if c.result is None]
    if untested:
        return Claim(CLAIM_BASELINES, measurement, rule, untested[0], NOT_TESTED)
    results = {rival: c.result for rival, c in comparisons.items()}
    interval = "; ".join(f"{markdown_text(rival)} {ratio_interval(result)}" for rival, result in results.items())
    if any(result["low"] > 0 for result in results.values()):
        verdict = NOT_REPRODUCED
    elif all(result["high"] < 0 for result in results.values()):
        verdict = REPRODUCED
    else:
        verdict = NOT_SHOWN
        interval += "; " + "; ".join(f"{markdown_text(rival)}: {c.seeds_needed().text()}"
                                     for rival, c in comparisons.items() if c.result["low"] <= 0 <= c.result["high"])
    return Claim(CLAIM_BASELINES, measurement, rule, interval, verdict)


CLAIM_BASELINES = "under a matched budget DiHAL at ℓ\\* beats the continuous-diffusion baselines on Gen.PPL"


def oracle_claim(group: Group) -> Claim:
    """ℓ* is competitive with the oracle layer: Gen.PPL within `ORACLE_MARGIN` of it."""
    layers = " / ".join(f"{entry['roles'].get('chosen')} vs {entry['roles'].get('oracle')}" for _, entry in group.entries)
    measurement = (f"{name(group)}: ℓ\\* vs the oracle layer by bridge error {layers} ({seeds(group)}); "
                   f"Gen.PPL at ℓ\\* ÷ at the oracle layer {per_seed_ratio(group, 'dihal-chosen', 'dihal-oracle')}")
    rule = (f"reproduced iff the upper end of the paired {100 * (1 - ALPHA):.0f}% interval of Gen.PPL(ℓ\\*) ÷ "
            f"Gen.PPL(oracle) is ≤ {ORACLE_MARGIN:.2f} (at most 10% worse); not reproduced iff its lower end is "
            f"> {ORACLE_MARGIN:.2f}; else not shown. {FLOOR_RULE}")
    claim = "geometry-chosen layers stay competitive with the oracle layer"
    if not all("dihal-oracle" in entry["methods"] for _, entry in group.entries):
        return Claim(claim, measurement, rule, "no oracle-layer row in the records", NOT_TESTED)
    comparison = compare(group, "dihal-chosen", "dihal-oracle")
    return decide(claim, measurement + floor_note([comparison]), rule, comparison, math.log(ORACLE_MARGIN),
                  below=REPRODUCED, above=NOT_REPRODUCED, inclusive=True)


def regressor_claim(group: Group, scale: int = 1) -> Claim:
    """Diffusion is what makes the bridge work: DiHAL beats the same network trained as a one-step
    regressor (both at ``scale``)."""
    dihal, regressor = scaled_label(DIHAL, scale), scaled_label("control-regressor", scale)
    measurement = (f"{name(group)}: Gen.PPL of DiHAL at ℓ\\* ÷ the one-step regressor with the same network and "
                   f"budget {per_seed_ratio(group, dihal, regressor)} ({seeds(group)})")
    rule = (f"reproduced iff the paired {100 * (1 - ALPHA):.0f}% interval of log Gen.PPL(DiHAL) − "
            f"log Gen.PPL(regressor) lies below 0; not reproduced iff above 0; else not shown. {FLOOR_RULE}")
    claim = "diffusion steps are what make the bridge work (beyond one-step regression)"
    if not all(regressor in entry["methods"] for _, entry in group.entries):
        return Claim(claim, measurement, rule, "no regressor control in the records", NOT_TESTED)
    comparison = compare(group, dihal, regressor)
    return decide(claim, measurement + floor_note([comparison]), rule, comparison, 0.0,
                  below=REPRODUCED, above=NOT_REPRODUCED)


def rival_question(group: Group, rival: str, scale: int = 1) -> Claim:
    """This benchmark's question, not the paper's: does DiHAL at ℓ* beat ``rival`` on Gen.PPL with
    the same backbone, data and allowance (both at ``scale``)?"""
    dihal, other = scaled_label(DIHAL, scale), scaled_label(rival, scale)
    question = f"(this benchmark's question) DiHAL at ℓ\\* beats {RIVALS[rival]} on Gen.PPL under the same allowance"
    measurement = (f"{name(group)}: Gen.PPL of DiHAL at ℓ\\* ÷ {markdown_text(other)}'s "
                   f"{per_seed_ratio(group, dihal, other)} ({seeds(group)})")
    comparison = compare(group, dihal, other)
    measurement += floor_note([comparison]) + compute_note(group, dihal, [other])
    return decide(question, measurement, rival_rule(rival), comparison, 0.0, below=YES, above=NO)


def rival_rule(rival: str) -> str:
    return (f"yes iff the paired {100 * (1 - ALPHA):.0f}% interval of log Gen.PPL(DiHAL) − log Gen.PPL({rival}) "
            f"lies below 0; no iff above 0; else not shown. {FLOOR_RULE}")


def untested_rival(rival: str) -> Claim:
    """The question about ``rival`` where no record with Gen.PPL holds its row."""
    return Claim(f"(this benchmark's question) DiHAL at ℓ\\* beats {RIVALS[rival]} on Gen.PPL under the same allowance",
                 f"no committed record with Gen.PPL holds a row for {markdown_text(rival)}", "—",
                 "no measurement", NOT_TESTED)


# --- claims across budget scales (docs/method.md, "Claims across budget scales") -------------------


def multi_scale(group: Group) -> bool:
    """Whether the group's records train any row at a scale other than the matched budget: only
    then do the paired claims read per scale, so a group with one scale reads exactly as before."""
    return any(split_scale(label)[1] != 1 for _, entry in group.entries for label in entry["methods"])


def row_scales(group: Group) -> dict[str, list[int]]:
    """Each row (its label at scale 1) -> the budget scales every pooled seed holds it at, ascending:
    a comparison at a scale needs both sides on every seed, as one at the matched budget does."""
    found: dict[str, list[int]] = {}
    for label in first_methods(group):
        row, scale = split_scale(label)
        found.setdefault(row, []).append(scale)
    return {row: sorted(scales) for row, scales in found.items()}


def shared_scales(group: Group, others: list[str]) -> list[int]:
    """The scales where DiHAL at ℓ* and at least one of ``others`` were both trained ([1] where there
    is none, so that the claim still has its row and says why it is not tested)."""
    scales = row_scales(group)
    theirs = {scale for other in others for scale in scales.get(other, [])}
    return [scale for scale in scales.get(DIHAL, []) if scale in theirs] or [1]


def paper_baselines(group: Group) -> list[str]:
    """The paper's baselines the group trains within the allowance, at any scale, in record order:
    the rows the baselines claim reads (its variants and the over-allowance rows are not)."""
    methods = first_methods(group)
    return [row for row, scales in row_scales(group).items() if row in PAPER_BASELINES
            and methods[scaled_label(row, scales[0])]["kind"] == "baseline"
            and methods[scaled_label(row, scales[0])]["in_budget"]]


SCALES_RULE = ("Decided at each budget scale where both sides were trained, DiHAL at ℓ\\* at that scale against the "
               "other row at the same scale.")


def across_scales(group: Group, decided: dict[int, Claim], *, claim: str | None = None, rule_note: str = SCALES_RULE,
                  names: dict[int, str] | None = None) -> Claim:
    """One row from a claim decided at each of several scales (``names``: how each scale is called,
    "2×" unless given): every scale's verdict, and where two consecutive scales disagree, both named
    with their intervals. Each scale is its own test; the row says how many were made instead of
    correcting for them."""
    names = {s: (names or {}).get(s, f"{s}×") for s in sorted(decided)}
    first = decided[min(decided)]
    prefix = f"{name(group)}: "
    measurement = prefix + "; ".join(f"{names[s]}: {decided[s].measurement.removeprefix(prefix)}" for s in names)
    rule = f"{first.rule} {rule_note} No correction across scales: each scale is its own test."
    verdict = " · ".join(f"{names[s]}: {decided[s].verdict}" for s in names)
    return Claim(claim or first.claim, measurement, rule, scales_interval(decided, names), verdict)


def scales_interval(decided: dict[int, Claim], names: dict[int, str]) -> str:
    """The interval cell of a row over scales: how many scales were tested, each change of verdict
    between consecutive scales with both intervals, then the intervals of the scales no change names."""
    scales = sorted(decided)
    changes = [(a, b) for a, b in zip(scales, scales[1:]) if decided[a].verdict != decided[b].verdict]
    named = {s for pair in changes for s in pair}
    parts = [f"{len(scales)} budget scale{'s' if len(scales) != 1 else ''} tested "
             f"({', '.join(f'{s}×' for s in scales)}), each at the {100 * ALPHA:.0f}% level, "
             "no correction across them"]
    parts += [f"The verdict changes between {names[a]} and {names[b]} ({decided[a].verdict} → {decided[b].verdict}): "
              f"{names[a]}: {decided[a].interval}; {names[b]}: {decided[b].interval}" for a, b in changes]
    rest = [f"{names[s]}: {decided[s].interval}" for s in scales if s not in named]
    heading = "Other scales: " if changes else "The same verdict at every scale: " if len(scales) > 1 else ""
    return ". ".join(parts + ([heading + "; ".join(rest)] if rest else []))


def compute_matched(group: Group, other: str) -> Claim:
    """DiHAL at ℓ* against ``other`` at matched training compute: for ``other`` at each of its scales
    r, DiHAL at the largest of its scales that costs no more in training FLOPs, decided by the pair's
    own rule. What a matched parameter budget leaves open is whether DiHAL merely trains cheaper."""
    rival = other in RIVALS
    words = {"below": YES, "above": NO} if rival else {"below": REPRODUCED, "above": NOT_REPRODUCED}
    asker = "(this benchmark's question) " if rival else ""
    what = RIVALS[other] if rival else markdown_text(other)
    claim = f"{asker}DiHAL at ℓ\\* beats {what} on Gen.PPL at matched training compute"
    rule = rival_rule(other) if rival else (
        f"reproduced iff the paired {100 * (1 - ALPHA):.0f}% interval of log Gen.PPL(DiHAL) − log Gen.PPL({other}) "
        f"lies below 0; not reproduced iff above 0; else not shown. {FLOOR_RULE}")
    own = {s: train_pflop(group, scaled_label(DIHAL, s)) for s in row_scales(group).get(DIHAL, [])}
    theirs = {r: train_pflop(group, scaled_label(other, r)) for r in row_scales(group).get(other, [])}
    decided = {r: matched_pair(group, scaled_label(other, r), own, theirs[r], claim, rule, words) for r in theirs}
    picks = {r: matched_scale(own, flops) for r, flops in theirs.items()}
    names = {r: f"{r}×" if pick is None else f"{r}× (DiHAL {pick}×)" for r, pick in picks.items()}
    note = (f"The scales named are {other}'s: at each, DiHAL at ℓ\\* at the largest of its scales whose training "
            f"FLOPs (mean over the seeds; locate and the sweep not charged) are at most {other}'s there; not tested "
            "where DiHAL's smallest scale costs more.")
    return across_scales(group, decided, claim=claim, rule_note=note, names=names)


def matched_scale(own: dict[int, float | None], theirs: float | None) -> int | None:
    """DiHAL's largest scale whose training PFLOP (``own``: scale -> mean) are at most ``theirs``;
    None where none is, or where a count is missing (a pick without it could be the wrong one)."""
    if theirs is None or any(flops is None for flops in own.values()):
        return None
    affordable = [scale for scale, flops in own.items() if flops <= theirs]
    return max(affordable) if affordable else None


def matched_pair(group: Group, other: str, own: dict[int, float | None], theirs: float | None, claim: str, rule: str,
                 words: dict[str, str]) -> Claim:
    """``other`` (one scaled row, ``theirs`` PFLOP) against DiHAL at ℓ* at `matched_scale`, or "not
    tested" with both counts where even DiHAL's smallest scale costs more, or naming a missing count."""
    label = markdown_text(other)
    pick = matched_scale(own, theirs)
    if pick is None:
        missing = [scaled_label(DIHAL, s) for s, flops in own.items() if flops is None]
        missing += [other] if theirs is None else []
        smallest = min(own)
        why = (f"no training FLOP count for {', '.join(markdown_text(m) for m in missing)}" if missing else
               f"DiHAL at ℓ\\* at its smallest scale ({smallest}×) trains on {fmt(own[smallest])} PFLOP, "
               f"more than {label}'s {fmt(theirs)} PFLOP")
        return Claim(claim, f"{label}: no scale of DiHAL at ℓ\\* to set against it", rule, f"not tested: {why}",
                     NOT_TESTED)
    dihal = scaled_label(DIHAL, pick)
    comparison = compare(group, dihal, other)
    ratio = f"{fmt(own[pick] / theirs) if theirs else '—'}× {label}'s FLOPs"
    measurement = (f"{label} ({fmt(theirs)} PFLOP) against DiHAL at ℓ\\* at {pick}× ({fmt(own[pick])} PFLOP, "
                   f"{ratio}): Gen.PPL ratio {per_seed_ratio(group, dihal, other)} ({seeds(group)})"
                   f"{floor_note([comparison])}")
    return decide(claim, measurement, rule, comparison, 0.0, **words)


def latency_claim(group: Group) -> Claim:
    """DiHAL decodes more slowly than the backbone: the log ratio of seconds per sequence at batch 1,
    per seed the mean over its interleaved rounds, with a t interval over seeds (over the rounds
    when there is one seed)."""
    per_seed = [latency_rounds(entry) for _, entry in group.entries]
    claim = "DiHAL is slower than the backbone at inference"
    shown = " / ".join("—" if not rounds else f"{fmt(math.exp(sum(rounds) / len(rounds)))}"
                       f"{f' ({len(rounds)} rounds)' if len(rounds) > 1 else ' (median)'}" for rounds in per_seed)
    measurement = (f"{name(group)}: DiHAL at ℓ\\* seconds per sequence ÷ the backbone's, batch 1, same run, "
                   f"interleaved rounds (geometric mean over a seed's rounds; records before 2026-12-04 keep "
                   f"only the median): {shown} ({seeds(group)})")
    rule = (f"per seed the mean log ratio over its rounds; reproduced iff the {100 * (1 - ALPHA):.0f}% t interval "
            "over seeds (over rounds with one seed) lies above ratio 1; not reproduced iff below; else not shown")
    if not per_seed or not all(per_seed):
        return Claim(claim, measurement, rule, "none: a seed has no latency ratio", NOT_TESTED)
    means = [sum(rounds) / len(rounds) for rounds in per_seed]
    values, over = (means, "seeds") if len(means) > 1 else (per_seed[0], "rounds of one seed")
    if len(values) < 2:
        return Claim(claim, measurement, rule, "none: one seed with one value (its median), no spread",
                     NOT_SHOWN)
    mean, low, high = t_interval(values, level=1 - ALPHA)
    interval = (f"ratio {fmt(math.exp(mean))}, 95% t interval over {over} "
                f"[{fmt(math.exp(low))}, {fmt(math.exp(high))}]")
    verdict = REPRODUCED if low > 0 else NOT_REPRODUCED if high < 0 else NOT_SHOWN
    if verdict == NOT_SHOWN:
        within = [variance_of_mean(rounds) for rounds in per_seed]
        interval += "; " + seeds_needed(means, within).text()
    return Claim(claim, measurement, rule, interval, verdict)


def latency_rounds(entry: dict) -> list[float]:
    """The seed's log latency ratios of DiHAL at ℓ* to the backbone at batch 1: one per round where
    the record keeps rounds, else the log of its median ratio, else none."""
    latency = (entry["methods"].get("dihal-chosen") or {}).get("latency") or {}
    rounds = latency.get("batch1_ratio_per_round")
    if isinstance(rounds, list) and rounds and all(is_positive(r) for r in rounds):
        return [math.log(r) for r in rounds]
    median = latency.get("batch1_ratio_to_backbone")
    return [math.log(median)] if is_positive(median) else []


def variance_of_mean(values: list[float]) -> float:
    """The sampling variance of the mean of ``values`` (0 for one value: nothing to estimate it from)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / (n - 1) / n


def is_positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# --- reading the pooled seeds ------------------------------------------------------------------


#: how every Gen.PPL rule counts a degenerate row (docs/method.md#claims-and-decision-rules)
FLOOR_RULE = ("A side whose samples are degenerate on a seed (entropy more than ln(4/3) nats below the held-out "
              "text's) is scored there as the seed's unigram reference when that scores worse.")


@dataclass(frozen=True)
class Comparison:
    """Gen.PPL of ``first`` against ``second`` over a group's seeds: each seed's per-sample NLLs of
    both sides (degenerate sides floored), the pooled paired bootstrap, or why there is none."""

    sides: tuple[dict[int, SampleNLL], dict[int, SampleNLL]]
    result: dict | None
    reason: str = ""
    floored: tuple[str, ...] = ()  # "diffusion-lm on seed 2", each side scored as the unigram reference

    def seeds_needed(self, boundary: float = 0.0) -> SeedsNeeded:
        """How many seeds would decide the comparison at ``boundary`` (numerics.seeds)."""
        per_seed = [paired_log_ppl_difference({s: self.sides[0][s]}, {s: self.sides[1][s]}, n_boot=N_BOOT_SEED,
                                              seed=SEED, level=1 - ALPHA) for s in self.sides[0]]
        return seeds_needed([r["difference"] for r in per_seed], [r["sd"] ** 2 for r in per_seed], boundary)


def compare(group: Group, first: str, second: str) -> Comparison:
    """The paired comparison of two methods' Gen.PPL over the group's seeds (`FLOOR_RULE` applied)."""
    sides: tuple[dict[int, SampleNLL], dict[int, SampleNLL]] = ({}, {})
    floored = []
    for _, entry in group.entries:
        flags = seed_flags(entry)
        for side, method in zip(sides, (first, second)):
            row = sample_nll(entry, method)
            if row is None:
                return Comparison(sides, None, NO_NLL)
            if flags.get(method):
                floor = sample_nll(entry, UNIGRAM)
                if floor is None:
                    return Comparison(sides, None, f"not tested: {method} is degenerate on seed {entry['seed']}, "
                                                   f"which has no {UNIGRAM} row with per-sample NLLs to score it as")
                if log_gen_ppl(floor) > log_gen_ppl(row):
                    row = floor
                    floored.append(f"{method} on seed {entry['seed']}")
            side[entry["seed"]] = row
    result = paired_log_ppl_difference(*sides, n_boot=N_BOOT, seed=SEED, level=1 - ALPHA)
    return Comparison(sides, result, floored=tuple(floored))


def decide(claim: str, measurement: str, rule: str, comparison: Comparison, boundary: float, *, below: str,
           above: str, inclusive: bool = False) -> Claim:
    """One comparison's verdict: ``below`` iff the interval lies below ``boundary`` (or touches it,
    with ``inclusive``), ``above`` iff above, else not shown with the seeds that would decide it."""
    result = comparison.result
    if result is None:
        return Claim(claim, measurement, rule, comparison.reason, NOT_TESTED)
    interval = ratio_interval(result)
    if result["high"] < boundary or (inclusive and result["high"] == boundary):
        verdict = below
    elif result["low"] > boundary:
        verdict = above
    else:
        verdict = NOT_SHOWN
        interval += "; " + comparison.seeds_needed(boundary).text()
    return Claim(claim, measurement, rule, interval, verdict)


def floor_note(comparisons: list[Comparison]) -> str:
    """What the measurement cell says of the rows scored as the unigram reference."""
    floored = list(dict.fromkeys(item for c in comparisons for item in c.floored))
    return f"; degenerate, scored as the unigram reference: {', '.join(floored)}" if floored else ""


def sample_nll(entry: dict, method: str) -> SampleNLL | None:
    """A method's per-sample NLLs and token counts on a seed, or None where the record lacks them."""
    metrics = (entry["methods"].get(method) or {}).get("metrics") or {}
    nll, tokens = metrics.get("gen_ppl_nll_per_sample"), metrics.get("gen_ppl_tokens_per_sample")
    if not (isinstance(nll, list) and isinstance(tokens, list)) or metrics.get("gen_ppl") is None:
        return None
    return SampleNLL(nll, tokens)


def compute_note(group: Group, first: str, others: list[str]) -> str:
    """What "matched" does not say: each of ``others``' training FLOPs in all ÷ ``first``'s, means
    over the group's seeds (docs/method.md#counting-compute); empty where a count is missing."""
    own = train_pflop(group, first)
    counted = [(other, train_pflop(group, other)) for other in others]
    cells = [f"{markdown_text(other)} {fmt(flops / own)}× ({fmt(flops)} vs {fmt(own)} PFLOP)"
             for other, flops in counted if own and flops]
    return f"; training compute ÷ DiHAL's: {', '.join(cells)}" if cells else ""


def train_pflop(group: Group, method: str) -> float | None:
    """A method row's training PFLOP, the mean over the group's seeds that count it (None where none
    does): what a compute note and a compute-matched pick read."""
    values = [row["train_pflop"] for row in group.rows["methods"]
              if row["method"] == method and math.isfinite(row.get("train_pflop", math.nan))]
    return sum(values) / len(values) if values else None


def per_seed_ratio(group: Group, first: str, second: str) -> str:
    """Gen.PPL(first) ÷ Gen.PPL(second) per seed, with both values."""
    cells = []
    for _, entry in group.entries:
        a, b = (((entry["methods"].get(m) or {}).get("metrics") or {}).get("gen_ppl") for m in (first, second))
        cells.append(f"{fmt(a / b)} ({fmt(a)} vs {fmt(b)})" if a and b else "—")
    return " / ".join(cells)


def ratio_interval(result: dict) -> str:
    return (f"ratio {fmt(result['ratio'])}, paired 95% CI [{fmt(result['ratio_low'])}, {fmt(result['ratio_high'])}] "
            f"({result['samples']} sample pairs, {result['seeds']} seed{'s' if result['seeds'] != 1 else ''})")


def first_methods(group: Group) -> dict[str, dict]:
    """Methods every pooled seed has, as the first seed describes them, in its order."""
    _, first = group.entries[0]
    return {name: method for name, method in first["methods"].items()
            if all(name in entry["methods"] for _, entry in group.entries)}


def name(group: Group) -> str:
    return f"{markdown_text(group.backbone)} ({markdown_text(group.suite)})"


def seeds(group: Group) -> str:
    """"seed 1" or "seeds 0 / 1": which seeds a measurement's per-seed figures are, in their order."""
    names = [str(entry["seed"]) for _, entry in group.entries]
    return ("seed " if len(names) == 1 else "seeds ") + " / ".join(names)


def fmt(x: float | None) -> str:
    """Three significant figures, thousands in full with separators."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) >= 0.01 else f"{x:.1e}"


def p_text(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.0e}"


#: the claims blocks a text can hold: start marker -> (end marker, what fills it)
CLAIM_BLOCKS = {START_MARKER: (END_MARKER, render), SUMMARY_START: (SUMMARY_END, render_summary)}


def block_filler(start: str) -> tuple[str, Callable[[list[Claim]], str]] | None:
    """(end marker, what fills the block) for a line that starts a claims block, else None."""
    if start in CLAIM_BLOCKS:
        return CLAIM_BLOCKS[start]
    if (match := SUITE_SUMMARY.fullmatch(start)) is None:
        return None
    suite = match["suite"]
    return (f"<!-- claims:summary:{suite}:end -->",
            lambda rows: render_summary([row for row in rows if row.suite == suite]))


def claim_blocks(text: str) -> list[str]:
    """The start markers of the claims blocks ``text`` holds, each on a line of its own (prose may
    name a marker, in backticks, without holding a block)."""
    return [line for line in dict.fromkeys(text.splitlines()) if block_filler(line) is not None]


def embed(text: str, rows: list[Claim]) -> str:
    """``text`` with each claims block it holds rewritten from ``rows``."""
    held = claim_blocks(text)
    if not held:
        raise DihalError(f"the text has no claims block ({START_MARKER} or {SUMMARY_START} on a line of its own)")
    for start in held:
        end, fill = block_filler(start)
        begin = re.search(f"^{re.escape(start)}$", text, re.M).end()
        close = text.find(end, begin)
        if close < 0:
            raise DihalError(f"the claims block {start} has no {end} after it")
        text = text[:begin] + "\n" + fill(rows) + "\n" + text[close:]
    return text
