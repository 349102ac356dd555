"""Each method row's held-out likelihood (docs/method.md#test-nll), a job of its own beside the row's
training and sampling jobs, so that a suite that turns it on adds it to rows already trained."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dihal_bench.api.likelihood import HeldOutNLL
from dihal_bench.api.references import held_out_windows
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.training import packed_split
from dihal_bench.study.run import Run
from dihal_bench.training.budget import Budget


def likelihood_windows(run: Run, budget: Budget, seed: int) -> tuple[Tensor, dict]:
    """Up to ``metrics.test_nll_windows`` windows of ``budget.seq_len`` tokens from the test split, a
    seeded subset of those whose every token occurs in the training sequences the budget draws: a
    method over the training split's vocabulary gives any other token no probability, so a window
    holding one would make its NLL infinite and no two rows comparable. With the counts behind them."""
    windows = packed_split(run.backbone, run.corpus, "test", budget.seq_len)
    seen = torch.zeros(run.backbone.vocab_size, dtype=torch.bool)
    seen[run.train_sequences(budget, seed).unique().long()] = True
    covered = windows[seen[windows.long()].all(dim=1)]
    if not len(covered):
        raise DihalError(f"none of the {len(windows)} test windows of {budget.seq_len} tokens holds only tokens "
                         f"of the training sequences: no held-out likelihood can compare the rows; set "
                         f"metrics.test_nll_windows = 0, or shorten budget.seq_len")
    picked = held_out_windows(covered, min(run.config.metrics.test_nll_windows, len(covered)), seed, what="test")
    return picked, {"windows": len(picked), "test_windows": len(windows), "covered_windows": len(covered)}


def test_nll_job(run: Run, model: dict, budget: Budget, seed: int,
                 score: Callable[[Tensor], HeldOutNLL | None]) -> dict | None:
    """The ``test-nll`` job of the model that the job spec ``model`` made: ``score`` of the seed's
    likelihood windows (kind "none" where the method has no likelihood after all), or None where
    the suite computes no likelihoods."""
    count = run.config.metrics.test_nll_windows
    if not count:
        return None
    spec = {**run.identity(), "model": model, "split": "test", "windows": count, "seq_len": budget.seq_len,
            "seed": seed}

    def work(_folder) -> dict:
        windows, counts = likelihood_windows(run, budget, seed)
        scored = score(windows)
        return {**(scored.to_dict() if scored is not None else {"kind": "none"}), **counts}

    return run.store.run("test-nll", spec, work)
