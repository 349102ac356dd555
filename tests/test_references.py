"""The training-free reference rows: unigram draws against known frequencies, seeded subsets of
held-out windows."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from dihal_bench.api.references import (
    held_out_windows,
    unigram_distribution,
    unigram_samples,
)
from dihal_bench.errors import DihalError

#: ids 3, 5, 7, 9 with frequencies 1/2, 1/4, 3/20, 1/10 in 20 windows of 20 tokens
FREQUENCIES = {3: 0.5, 5: 0.25, 7: 0.15, 9: 0.1}


def training_windows() -> torch.Tensor:
    ids = torch.cat([torch.full((int(share * 400),), token) for token, share in FREQUENCIES.items()])
    return ids[torch.randperm(400, generator=torch.Generator().manual_seed(0))].view(20, 20)


def chi_square(samples: torch.Tensor, expected_shares: dict[int, float]) -> float:
    counts = torch.bincount(samples.reshape(-1), minlength=10).double()
    expected = {token: share * samples.numel() for token, share in expected_shares.items()}
    return sum(float((counts[token] - e) ** 2 / e) for token, e in expected.items())


def test_unigram_distribution_is_the_training_frequencies():
    probabilities = unigram_distribution(training_windows())
    assert probabilities.shape == (10,)
    expected = torch.zeros(10, dtype=torch.float64)
    expected[list(FREQUENCIES)] = torch.tensor(list(FREQUENCIES.values()), dtype=torch.float64)
    torch.testing.assert_close(probabilities, expected)


def test_ragged_documents_give_the_same_distribution_as_packed_windows():
    rows = training_windows().tolist()
    documents = [rows[0][:3], rows[0][3:], *rows[1:]]  # ragged: lists of 3, 17 and 20 ids
    torch.testing.assert_close(unigram_distribution(documents), unigram_distribution(training_windows()))


def test_unigram_samples_match_the_training_frequencies():
    samples = unigram_samples(training_windows(), n=200, seq_len=100, seed=0)
    assert samples.shape == (200, 100) and samples.dtype == torch.int64
    assert set(samples.unique().tolist()) <= set(FREQUENCIES)  # ids absent from training never drawn
    # 20,000 i.i.d. draws of 4 categories: Pearson's statistic is chi-square with 3 degrees of
    # freedom (mean 3) if the draws follow the source; its 0.999 quantile (16.3) fails a correct
    # sampler 1 seed in 1,000 (this one gives 7.5), while moving one point of share from id 3 to
    # id 9 would add 24 to the statistic's mean.
    assert chi_square(samples, FREQUENCIES) < chi2.ppf(0.999, df=3)


def test_banned_ids_are_never_drawn_and_the_rest_keep_their_proportions():
    samples = unigram_samples(training_windows(), n=200, seq_len=100, seed=1, banned=[3, 42])
    assert 3 not in samples.unique().tolist()
    renormalised = {token: share / 0.5 for token, share in FREQUENCIES.items() if token != 3}
    assert chi_square(samples, renormalised) < chi2.ppf(0.999, df=2)  # as above, 3 categories


def test_unigram_samples_are_reproducible_for_a_seed():
    first = unigram_samples(training_windows(), n=8, seq_len=16, seed=5)
    assert torch.equal(first, unigram_samples(training_windows(), n=8, seq_len=16, seed=5))
    assert not torch.equal(first, unigram_samples(training_windows(), n=8, seq_len=16, seed=6))


@pytest.mark.parametrize(
    "train, options, match",
    [
        (torch.tensor([[3, 3], [5, 5]]), {"banned": [3, 5]}, "every training token is banned"),
        (torch.zeros((0, 4), dtype=torch.long), {}, "no tokens"),
        ([[1, 2], [-1]], {}, ">= 0"),
        (torch.ones(2, 2), {}, "integers"),
        (torch.tensor([[1, 2]]), {"n": 0}, "n must be a positive integer"),
        (torch.tensor([[1, 2]]), {"seq_len": 2.0}, "seq_len must be a positive integer"),
    ],
)
def test_bad_unigram_input_is_refused(train, options, match):
    arguments = {"n": 2, "seq_len": 3, "seed": 0, **options}
    with pytest.raises(DihalError, match=match):
        unigram_samples(train, **arguments)


def numbered_windows(count: int, width: int = 4) -> torch.Tensor:
    """Window i holds 100·i, 100·i + 1, ...: its first id names it."""
    return torch.arange(count)[:, None] * 100 + torch.arange(width)


def test_held_out_windows_are_a_seeded_subset_of_whole_windows():
    windows = numbered_windows(40)
    picked = held_out_windows(windows, 20, seed=3)
    names = picked[:, 0].tolist()
    assert len(set(names)) == 20  # without replacement
    assert all(torch.equal(row, windows[row[0] // 100]) for row in picked)  # whole windows, unchanged
    assert torch.equal(picked, held_out_windows(windows, 20, seed=3))
    assert not torch.equal(picked, held_out_windows(windows, 20, seed=4))


def test_a_smaller_count_takes_a_prefix_of_a_larger_ones_windows():
    windows = numbered_windows(30)
    assert torch.equal(held_out_windows(windows, 5, seed=2), held_out_windows(windows, 12, seed=2)[:5])


def test_held_out_windows_cover_the_split_not_its_head():
    # 10 of 100 windows: the first N would all come from the split's first tenth
    picked = held_out_windows(numbered_windows(100), 10, seed=0)[:, 0] // 100
    assert int(picked.max()) >= 10


def test_asking_for_more_windows_than_the_split_holds_is_refused():
    with pytest.raises(DihalError, match="human windows: asked for 12, but the split has 11"):
        held_out_windows(numbered_windows(11), 12, seed=0, what="human")
    with pytest.raises(DihalError, match="2-D tensor"):
        held_out_windows(torch.arange(10), 2, seed=0)
    with pytest.raises(DihalError, match="n must be a positive integer"):
        held_out_windows(numbered_windows(5), 0, seed=0)
