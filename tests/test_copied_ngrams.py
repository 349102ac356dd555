"""copied_8grams: the share of the samples' word 8-grams found in the corpus's training split, on
tiny in-process corpora whose answers are counted by hand."""

from __future__ import annotations

import dihal_builtin.metrics as builtin
import pytest

from test_corpus import ListCorpus

from dihal_bench.api.corpus import Document, split_of
from dihal_bench.api.metrics import MetricContext, SampleSet, metric_value_problem
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry

#: everything trains unless a test says otherwise
ALL_TRAIN = (1.0, 0.0, 0.0)
#: 20 distinct words, the training text of `corpus_a`
TRAIN_WORDS = [f"w{i}" for i in range(20)]
#: words that no corpus here holds
NOVEL_WORDS = [f"novel{i}" for i in range(20)]


def corpus_of(*texts: str, fractions=ALL_TRAIN) -> ListCorpus:
    return ListCorpus([Document(f"doc-{i}", text) for i, text in enumerate(texts)], split_fractions=fractions)


def samples(*texts: str) -> SampleSet:
    return SampleSet(method="m", texts=list(texts), token_ids=[[0] * len(text.split()) for text in texts])


def context(corpus: Corpus | None) -> MetricContext:
    return MetricContext(evaluator=None, references=[], seed=0, corpus=corpus)


def copied(sample_set: SampleSet, corpus: Corpus | None) -> dict:
    result = get_registry().get("metric", "copied_8grams").obj(sample_set, context(corpus))
    assert metric_value_problem("copied_8grams", result, len(sample_set.texts)) is None
    return result


def test_registered_as_a_non_default_metric_without_a_direction():
    registration = get_registry().get("metric", "copied_8grams")
    assert registration.obj is builtin._copied_metric
    assert registration.meta["display_name"] == "copied 8-grams"
    assert registration.meta["higher_is_better"] is None
    assert registration.meta["default"] is False
    assert "memorisation of the training split" in registration.meta["description"]
    assert "copied_8grams" not in get_registry().default_metrics()


def test_verbatim_training_text_is_all_copied():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    # 20 words: 13 8-grams; 10 words: 3; every one a run of the training text
    result = copied(samples(" ".join(TRAIN_WORDS), " ".join(TRAIN_WORDS[5:15])), corpus)
    assert result == {"copied_8grams": 1.0, "copied_8grams_n": 13 + 3, "n_valid": 2, "n_invalid": 0}


def test_words_never_in_the_corpus_are_not_copied():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    result = copied(samples(" ".join(NOVEL_WORDS), " ".join(NOVEL_WORDS[:9])), corpus)
    assert result == {"copied_8grams": 0.0, "copied_8grams_n": 13 + 2, "n_valid": 2, "n_invalid": 0}


def test_copied_first_half_and_novel_second_half():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    # 10 training words then 10 novel ones: 20 words, 13 8-grams. Those starting at words 0-2 lie in
    # the copied half (w0..w7, w1..w8, w2..w9); the other 10 hold a novel word, and the training
    # text's next word after w9 is w10, not novel0, so none of the straddling ones occurs there.
    text = " ".join(TRAIN_WORDS[:10] + NOVEL_WORDS[:10])
    result = copied(samples(text), corpus)
    assert result["copied_8grams"] == pytest.approx(3 / 13)
    assert result["copied_8grams_n"] == 13


def test_a_straddling_8gram_that_occurs_in_training_counts_as_copied():
    # the join itself is training text here: the 8-gram w6..w9 novel0..novel3 is in the second document
    corpus = corpus_of(" ".join(TRAIN_WORDS), " ".join(TRAIN_WORDS[6:10] + NOVEL_WORDS[:4]))
    text = " ".join(TRAIN_WORDS[:10] + NOVEL_WORDS[:10])
    assert copied(samples(text), corpus)["copied_8grams"] == pytest.approx(4 / 13)


def test_8grams_do_not_run_across_training_documents():
    # w0..w3 ends one document and w4..w7 starts the next: no training text holds w0..w7
    corpus = corpus_of(" ".join(TRAIN_WORDS[:4]), " ".join(TRAIN_WORDS[4:8]))
    assert copied(samples(" ".join(TRAIN_WORDS[:8])), corpus)["copied_8grams"] == 0.0


def test_repeats_count_every_time_and_whitespace_is_split_as_diversity_splits_it():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    verbatim = "  ".join(TRAIN_WORDS[:8]).replace("w3  ", "w3\n")  # 1 8-gram, copied
    novel = " ".join(NOVEL_WORDS[:8])  # 1 8-gram, novel
    result = copied(samples(verbatim, verbatim, verbatim, novel), corpus)
    assert (result["copied_8grams"], result["copied_8grams_n"]) == (pytest.approx(3 / 4), 4)


def test_only_the_training_split_counts():
    fractions = (0.5, 0.25, 0.25)
    ids = {split: next(f"doc-{i}" for i in range(100) if split_of(f"doc-{i}", fractions) == split)
           for split in ("train", "test")}
    corpus = ListCorpus([Document(ids["train"], " ".join(TRAIN_WORDS)),
                         Document(ids["test"], " ".join(NOVEL_WORDS))], split_fractions=fractions)
    result = copied(samples(" ".join(TRAIN_WORDS[:8]), " ".join(NOVEL_WORDS[:8])), corpus)
    assert result["copied_8grams"] == pytest.approx(1 / 2)


def test_invalid_samples_are_left_out():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    # "x" is 9 of 17 words, over half: degenerate, so its 10 novel 8-grams do not count
    degenerate = " ".join(["x", "novel0"] * 8 + ["x"])
    result = copied(samples(" ".join(TRAIN_WORDS[:8]), degenerate, ""), corpus)
    assert result == {"copied_8grams": 1.0, "copied_8grams_n": 1, "n_valid": 1, "n_invalid": 2}


def test_no_8gram_gives_none_and_a_warning():
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    result = copied(samples(" ".join(TRAIN_WORDS[:7]), ""), corpus)
    assert result["copied_8grams"] is None and result["copied_8grams_n"] == 0
    assert result["warning"] == "no valid sample has 8 or more words"  # recorded as copied_8grams_warning


def test_no_corpus_is_an_error_naming_it():
    with pytest.raises(DihalError, match="copied_8grams.*no corpus") as error:
        copied(samples(" ".join(TRAIN_WORDS)), None)
    assert "\n" not in str(error.value)


def test_the_cache_holds_one_corpus_by_identity_and_does_not_leak():
    text = " ".join(TRAIN_WORDS)
    first, second = corpus_of(text), corpus_of(" ".join(NOVEL_WORDS))
    assert copied(samples(text), first)["copied_8grams"] == 1.0
    # the other corpus: its own training text, not the first's cached 8-grams
    assert copied(samples(text), second)["copied_8grams"] == 0.0
    assert copied(samples(" ".join(NOVEL_WORDS)), second)["copied_8grams"] == 1.0
    # and back: the first corpus again, recomputed or cached, gives its own answer
    assert copied(samples(text), first)["copied_8grams"] == 1.0
    # a corpus of the same class, name and document ids is another corpus: read afresh
    assert copied(samples(text), corpus_of(" ".join(NOVEL_WORDS)))["copied_8grams"] == 0.0


def test_the_training_text_is_read_once_per_corpus(monkeypatch):
    calls = []
    corpus = corpus_of(" ".join(TRAIN_WORDS))
    split = corpus.split
    monkeypatch.setattr(corpus, "split", lambda name: calls.append(name) or split(name))
    for _ in range(3):
        copied(samples(" ".join(TRAIN_WORDS)), corpus)
    assert calls == ["train"]
