"""The claims table: verdicts follow their decision rules on records with known answers, a record
without per-sample NLLs gets "not tested", and the README embeds exactly what `dihal-bench claims`
prints for the committed records (its summary: claim, where, verdict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.claims import (
    END_MARKER,
    NO,
    NOT_REPRODUCED,
    NOT_SHOWN,
    NOT_TESTED,
    REPRODUCED,
    START_MARKER,
    SUMMARY_END,
    SUMMARY_START,
    YES,
    Claim,
    claims_of,
    embed,
    evaluate,
    render,
    render_summary,
)
from dihal_bench.leaderboard.read import Group

ROOT = Path(__file__).resolve().parent.parent
LAYERS = list(range(1, 13))


def method(kind: str, gen_ppl_nll: list | None, tokens: list | None, *, in_budget: bool = True,
           latency: float | None = None) -> dict:
    metrics = {}
    if gen_ppl_nll is not None:
        valid = [(n, t) for n, t in zip(gen_ppl_nll, tokens) if n is not None]
        metrics = {"gen_ppl": float(np.exp(sum(n for n, _ in valid) / sum(t for _, t in valid))),
                   "gen_ppl_nll_per_sample": gen_ppl_nll, "gen_ppl_tokens_per_sample": tokens}
    return {"kind": kind, "in_budget": in_budget, "metrics": metrics,
            "latency": None if latency is None else {"batch1_ratio_to_backbone": latency}}


def entry(seed: int, score: list[float], mse: list[float], methods: dict) -> dict:
    """One seed as the runner writes it, with only what the claims read."""
    return {"seed": seed,
            "locate": {"layers": LAYERS, "score": score, "proxies": {}, "preprocessing": "trace"},
            "sweep": {"layers": [{"layer": layer, "bridge_mse": value} for layer, value in zip(LAYERS, mse)]},
            "roles": {"chosen": 2, "oracle": 1, "worst": 12}, "methods": methods}


def samples(log_ppl: float, shared: np.ndarray) -> tuple[list, list]:
    tokens = [64] * len(shared)
    return [float((log_ppl + noise) * 64) for noise in shared], tokens


def group_of(entries: list[dict]) -> Group:
    group = Group("diagnostic", "tiny", "tiny")
    group.entries = [("r.json", e) for e in entries]
    return group


def methods_for(seed: int, *, chosen: float, oracle: float, regressor: float, baseline: float,
                with_nll: bool = True, others: dict[str, float] | None = None) -> dict:
    """The methods of one seed at the given log Gen.PPLs; ``others``: more baseline rows."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(scale=0.3, size=128)
    sides = {}
    for name, log_ppl in (("dihal-chosen", chosen), ("dihal-oracle", oracle), ("control-regressor", regressor),
                          ("sed", baseline), *(others or {}).items()):
        nll, tokens = samples(log_ppl, shared + rng.normal(scale=0.05, size=128))
        kind = "dihal" if name.startswith("dihal") else "control" if name.startswith("control") else "baseline"
        sides[name] = method(kind, nll, tokens, latency=0.9 if name == "dihal-chosen" else None)
        if not with_nll:
            for key in ("gen_ppl_nll_per_sample", "gen_ppl_tokens_per_sample"):
                sides[name]["metrics"].pop(key)
    sides["ar-backbone"] = method("baseline", None, None, in_budget=False)
    return sides


def test_verdicts_follow_the_rules_on_planted_gaps():
    rng = np.random.default_rng(0)
    depth_ordered = [0.1 * layer + rng.normal(scale=0.01) for layer in LAYERS]
    entries = [entry(seed, [-v for v in depth_ordered], depth_ordered,
                     # DiHAL 20% below the regressor and the baseline; 2% above the oracle layer
                     methods_for(seed, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0)) for seed in (0, 1)]
    rows = {row.claim: row for row in evaluate([group_of(entries)])}
    geometry = next(row for claim, row in rows.items() if claim.startswith("S(ℓ)"))
    # S(ℓ) ranks the layers exactly as the error does: ρ = 1 > 0.91, reproduced
    assert geometry.verdict == REPRODUCED and "ρ of S(ℓ)" in geometry.measurement
    by_start = {claim.split(" ")[0]: row for claim, row in rows.items()}
    assert by_start["under"].verdict == REPRODUCED and "ratio" in by_start["under"].interval
    assert by_start["geometry-chosen"].verdict == REPRODUCED  # 2% worse, well inside the 10% margin
    assert by_start["diffusion"].verdict == REPRODUCED
    assert by_start["DiHAL"].verdict == NOT_REPRODUCED  # 0.9× the backbone: faster, not slower


def test_verdicts_turn_when_the_gap_reverses_or_vanishes():
    rng = np.random.default_rng(1)
    errors = [0.1 * layer for layer in LAYERS]
    unrelated = list(rng.permutation(12).astype(float))  # S(ℓ) unrelated to the error: ρ far below 0.91
    entries = [entry(seed, unrelated, errors, methods_for(seed, chosen=5.0, oracle=4.7, regressor=5.0, baseline=4.5))
               for seed in (0, 1)]
    rows = {row.claim.split(" ")[0]: row for row in evaluate([group_of(entries)])}
    assert rows["S(ℓ)"].verdict == NOT_REPRODUCED and "H₀: ρ = 0.91" in rows["S(ℓ)"].interval
    assert rows["under"].verdict == NOT_REPRODUCED  # the baseline is better by 40%
    assert rows["geometry-chosen"].verdict == NOT_REPRODUCED  # 35% worse than the oracle layer
    assert rows["diffusion"].verdict == NOT_SHOWN  # no gap: the interval holds 0


def test_the_baselines_claim_reads_the_papers_baselines_and_each_rival_is_its_own_question():
    errors = [0.1 * layer for layer in LAYERS]
    # a variant of SED far better than DiHAL is not one of the paper's baselines; the LoRA
    # fine-tune beats DiHAL, masked diffusion from scratch does not, and no record has ar2diff-lora
    others = {"sed-detached-readout": 4.0, "ar-lora": 4.5, "mdlm": 7.5}
    entries = [entry(seed, [-e for e in errors], errors,
                     methods_for(seed, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0, others=others))
               for seed in (0, 1)]
    rows = evaluate([group_of(entries)])
    baselines = next(row for row in rows if row.claim.startswith("under"))
    assert baselines.verdict == REPRODUCED and "sed-detached-readout" not in baselines.measurement
    questions = {row.claim: row for row in rows if row.claim.startswith("(this benchmark's question)")}
    by_rival = {rival: next(row for claim, row in questions.items() if description in claim)
                for rival, description in (("ar-lora", "fine-tuned"), ("mdlm", "MDLM"), ("ar2diff-lora", "adapted"))}
    assert by_rival["ar-lora"].verdict == NO and "ratio" in by_rival["ar-lora"].interval
    assert by_rival["mdlm"].verdict == YES
    assert by_rival["ar2diff-lora"].verdict == NOT_TESTED and "no committed record" in by_rival["ar2diff-lora"].measurement


def test_a_suite_without_the_papers_baselines_answers_its_own_questions_not_the_papers_claims():
    errors = [0.1 * layer for layer in LAYERS]
    diagnostic = group_of([entry(1, [-e for e in errors], errors,
                                 methods_for(1, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0))])
    rivals_methods = methods_for(1, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0, others={"ar-lora": 4.5})
    for dropped in ("sed", "dihal-oracle"):
        rivals_methods.pop(dropped)
    rivals = Group("rivals", "tiny", "tiny")
    rivals.entries = [("rivals.json", entry(1, [-e for e in errors], errors, rivals_methods))]
    rows = evaluate([diagnostic, rivals])
    # the paper's method claims once, from the suite that runs its comparison; the rivals suite's
    # DiHAL and regressor rows are the same samples again
    for start in ("under", "geometry-chosen", "diffusion"):
        assert [row.measurement.split(":")[0] for row in rows if row.claim.startswith(start)] == ["tiny (diagnostic)"]
    # each run times its decodes afresh: one latency row per suite
    assert [row.measurement.split(":")[0] for row in rows if row.claim.startswith("DiHAL is slower")] == [
        "tiny (diagnostic)", "tiny (rivals)"]
    assert next(row for row in rows if "fine-tuned" in row.claim).verdict == NO
    only_rivals = evaluate([rivals])
    assert [row.verdict for row in only_rivals if row.claim.startswith("under")] == [NOT_TESTED]
    assert not any(row.claim.startswith(("geometry-chosen", "diffusion")) for row in only_rivals)


def test_records_without_per_sample_nlls_are_not_tested_rather_than_given_a_number():
    errors = [0.1 * layer for layer in LAYERS]
    entries = [entry(seed, [-e for e in errors], errors,
                     methods_for(seed, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0, with_nll=False))
               for seed in (0, 1)]
    rows = {row.claim.split(" ")[0]: row for row in evaluate([group_of(entries)])}
    for claim in ("under", "geometry-chosen", "diffusion"):
        assert rows[claim].verdict == NOT_TESTED and "per-sample NLLs" in rows[claim].interval


def test_the_readme_embeds_the_claims_generated_from_the_committed_records():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # the front page summarises the study whose curve it shows; docs/results.md holds the full table
    assert readme.count("<!-- claims:summary:ladder:start -->") == 1 and readme.count("<!-- claims:summary:ladder:end -->") == 1
    rows = claims_of(ROOT / "results", warn=lambda message: None)
    assert embed(readme, rows) == readme, "README claims are stale: run `dihal-bench claims --readme README.md`"


def test_the_summary_gives_each_claim_where_it_was_measured_and_its_verdict_as_the_full_table_does():
    rows = claims_of(ROOT / "results", warn=lambda message: None)
    text = f"a\n{START_MARKER}\nold\n{END_MARKER}\nb\n{SUMMARY_START}\nold\n{SUMMARY_END}\nc\n"
    filled = embed(text, rows)
    full, summary = filled.split(SUMMARY_START)
    assert render(rows) in full and "old" not in filled and filled.endswith(f"{SUMMARY_END}\nc\n")
    lines = summary.split(SUMMARY_END)[0].strip().splitlines()[2:]  # past the header and its rule
    assert len(lines) == len(rows)
    for line, row in zip(lines, rows):
        claim, where, verdict = (part.strip() for part in line.strip("|").split(" | "))
        # each row's group is the one its measurement names; the verdict is the full table's
        assert row.measurement.startswith(f"{where}: ") and verdict == f"**{row.verdict}**"
    assert {row.where for row in rows} >= {"smollm2-135m (diagnostic)", "smollm2-135m (rivals)"}


def test_a_suite_summary_holds_the_claims_of_that_suite_alone():
    rows = [Claim("c1", "m", "r", "i", "yes", where="b (ladder)", suite="ladder"),
            Claim("c2", "m", "r", "i", "no", where="b (diagnostic)", suite="diagnostic"),
            Claim("c3", "m", "r", "i", "no", where="b (ladder-x)", suite="ladder-x")]
    text = "a\n<!-- claims:summary:ladder:start -->\nold\n<!-- claims:summary:ladder:end -->\nb\n"
    assert embed(text, rows) == f"a\n<!-- claims:summary:ladder:start -->\n{render_summary(rows[:1])}\n" \
                                "<!-- claims:summary:ladder:end -->\nb\n"
    with pytest.raises(DihalError, match="has no <!-- claims:summary:ladder:end -->"):
        embed("<!-- claims:summary:ladder:start -->\nold\n", rows)


def test_the_claims_command_prints_the_table_and_writes_it_between_the_markers(tmp_path):
    runner = CliRunner()
    printed = runner.invoke(cli, ["claims", "--results", str(ROOT / "results")])
    assert printed.exit_code == 0, printed.output
    rows = claims_of(ROOT / "results", warn=lambda message: None)
    table = render(rows)
    assert table in printed.output
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{START_MARKER}\nold table\n{END_MARKER}\nafter\n", encoding="utf-8")
    written = runner.invoke(cli, ["claims", "--results", str(ROOT / "results"), "--readme", str(readme)])
    assert written.exit_code == 0, written.output
    assert readme.read_text(encoding="utf-8") == f"before\n{START_MARKER}\n{table}\n{END_MARKER}\nafter\n"
    with pytest.raises(DihalError, match="claims:start"):
        embed("no markers here", rows)
    with pytest.raises(DihalError, match="no <!-- claims:end --> after it"):
        embed(f"{START_MARKER}\nold table\n", rows)
    missing = runner.invoke(cli, ["claims", "--results", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "Error:" in missing.output


def test_a_sweep_too_short_for_the_tests_is_not_tested():
    errors = [0.1 * layer for layer in LAYERS]
    short = entry(0, [-e for e in errors], errors, {})
    short["sweep"]["layers"] = short["sweep"]["layers"][:3]
    (row,) = evaluate([group_of([short])])
    assert row.verdict == NOT_TESTED and "at least 4" in row.measurement


def with_entropy(methods: dict, entropies: dict[str, float]) -> dict:
    for name, h in entropies.items():
        methods[name]["metrics"]["entropy"] = h
    return methods


def references(seed: int, *, unigram_log_ppl: float | None) -> dict:
    """The held-out row (entropy 3.6) and, unless None, the unigram reference at that log Gen.PPL."""
    rng = np.random.default_rng(100 + seed)
    rows = {"reference-human": method("reference", None, None, in_budget=False)}
    rows["reference-human"]["metrics"]["entropy"] = 3.6
    if unigram_log_ppl is not None:
        rows["reference-unigram"] = method("reference", *samples(unigram_log_ppl, rng.normal(scale=0.3, size=128)),
                                           in_budget=False)
        rows["reference-unigram"]["metrics"]["entropy"] = 3.9
    return rows


def test_a_degenerate_baseline_is_scored_as_the_unigram_reference_and_cannot_win_by_collapse():
    errors = [0.1 * layer for layer in LAYERS]

    def seeds(collapsed_entropy: float, unigram: float | None) -> list[dict]:
        # SED writes collapsed text with a low Gen.PPL (log 4.0 against DiHAL's 5.0)
        return [entry(seed, [-e for e in errors], errors,
                      with_entropy({**methods_for(seed, chosen=5.0, oracle=4.98, regressor=5.2, baseline=4.0),
                                    **references(seed, unigram_log_ppl=unigram)},
                                   {"dihal-chosen": 3.65, "sed": collapsed_entropy})) for seed in (0, 1)]

    def baselines_row(rows):
        return next(row for row in rows if row.claim.startswith("under"))

    healthy = baselines_row(evaluate([group_of(seeds(3.5, unigram=8.5))]))
    assert healthy.verdict == NOT_REPRODUCED  # SED's text is as varied as natural text: its win stands
    collapsed = baselines_row(evaluate([group_of(seeds(2.0, unigram=8.5))]))
    assert collapsed.verdict == REPRODUCED  # scored as i.i.d. unigram text, SED loses
    assert "degenerate, scored as the unigram reference: sed on seed 0, sed on seed 1" in collapsed.measurement
    assert "unigram reference when that scores worse" in collapsed.rule
    no_floor = baselines_row(evaluate([group_of(seeds(2.0, unigram=None))]))
    assert no_floor.verdict == NOT_TESTED and "no reference-unigram row" in no_floor.interval


def test_a_claim_that_is_not_shown_says_how_many_seeds_would_decide_it():
    errors = [0.1 * layer for layer in LAYERS]
    entries = [entry(seed, [-e for e in errors], errors,
                     methods_for(seed, chosen=5.0 + 0.1 * (-1) ** seed, oracle=4.98, regressor=5.0, baseline=7.0))
               for seed in (0, 1, 2)]
    rows = {row.claim.split(" ")[0]: row for row in evaluate([group_of(entries)])}
    assert rows["diffusion"].verdict == NOT_SHOWN
    assert "seeds needed for 80% power:" in rows["diffusion"].interval
    assert "between-seed variance" in rows["diffusion"].interval
    decided = [row for row in rows.values() if row.verdict != NOT_SHOWN]
    assert decided and not any("seeds needed" in row.interval for row in decided)


def latency_group(rounds_per_seed: list[list[float] | None], medians: list[float]) -> list:
    errors = [0.1 * layer for layer in LAYERS]
    entries = []
    for seed, (rounds, median) in enumerate(zip(rounds_per_seed, medians)):
        methods = methods_for(seed, chosen=5.0, oracle=4.98, regressor=5.2, baseline=7.0)
        methods["dihal-chosen"]["latency"] = {"batch1_ratio_to_backbone": median,
                                              **({"batch1_ratio_per_round": rounds} if rounds else {})}
        entries.append(entry(seed, [-e for e in errors], errors, methods))
    return [row for row in evaluate([group_of(entries)]) if row.claim.startswith("DiHAL is slower")]


def test_latency_is_decided_by_an_interval_over_seeds_of_their_rounds():
    (slower,) = latency_group([[1.10, 1.12, 1.08, 1.15, 1.11], [1.06, 1.09, 1.12, 1.07, 1.10],
                               [1.13, 1.10, 1.12, 1.16, 1.11]], [1.11, 1.09, 1.12])
    assert slower.verdict == REPRODUCED and "t interval over seeds" in slower.interval and "5 rounds" in slower.measurement
    (mixed,) = latency_group([[1.2, 1.1, 1.3, 1.2, 1.25], [0.85, 0.9, 0.8, 0.95, 0.9]], [1.2, 0.9])
    assert mixed.verdict == NOT_SHOWN and "seeds needed" in mixed.interval
    # one seed: the interval is over its rounds, conditional on that seed
    (one,) = latency_group([[0.91, 0.93, 0.9, 0.92, 0.94]], [0.92])
    assert one.verdict == NOT_REPRODUCED and "rounds of one seed" in one.interval
    # a record from before rounds were kept: one median, no spread to decide on
    (median_only,) = latency_group([None], [0.89])
    assert median_only.verdict == NOT_SHOWN and "no spread" in median_only.interval


def test_a_correlation_that_is_not_shown_says_how_many_seeds_would_decide_it():
    errors = [0.1 * layer for layer in LAYERS]
    # five swept layers a seed, S(ℓ) ranking them nearly as the error does on one seed (ρ = 0.9) and
    # loosely on the other (ρ = 0.3): neither significantly above 0 nor below 0.91 with so few layers
    scores = ([-0.1, -0.3, -0.2, -0.4, -0.5], [-0.3, -0.5, -0.1, -0.2, -0.4])
    entries = []
    for seed, score in enumerate(scores):
        short = entry(seed, score + [-1.0] * 7, errors, {})
        short["sweep"]["layers"] = short["sweep"]["layers"][:5]
        entries.append(short)
    (row,) = [r for r in evaluate([group_of(entries)]) if r.claim.startswith("S(ℓ)")]
    assert row.verdict == NOT_SHOWN
    assert "seeds needed for 80% power" in row.interval and "Fisher z of ρ against 0" in row.interval


def test_a_paired_claim_states_what_matched_leaves_out_the_training_compute():
    table = render(claims_of(ROOT / "results", warn=lambda message: None))
    rival = next(line for line in table.splitlines() if "fine-tuned autoregressively with LoRA" in line)
    # ar-lora trains the whole backbone's passes; DiHAL a 2.6M-parameter bridge over stored states
    ratio = float(rival.split("training compute ÷ DiHAL's: ar-lora ")[1].split("×")[0])
    assert 20 < ratio < 60
