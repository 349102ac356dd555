"""Corpora: the text a run trains and evaluates on, and how it becomes fixed-length token sequences.

A corpus is a list of documents with stable ids. The train/validation/test split is a
function of each document's id alone (a sha256 hash), so it does not depend on document
order, on the machine, or on Python's per-process string hashing, and adding a document
never moves another one to a different split.

Text becomes model input in two steps: `tokenize_documents` (the backbone's tokenizer,
no special tokens) and `pack` (fixed-length windows of T tokens, each inside one document).
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dihal_bench.errors import DihalError

SPLITS = ("train", "validation", "test")
SPLIT_ALIASES = {"valid": "validation"}
DEFAULT_SPLIT_FRACTIONS = (0.8, 0.1, 0.1)

# Documents per tokenizer call: large enough for the fast tokenizer's parallel batching,
# small enough that one call's intermediate encodings stay modest on big corpora.
TOKENIZE_BATCH = 512


@dataclass(frozen=True)
class Document:
    """One unit of text. `id` is unique within its corpus and decides the document's split."""

    id: str
    text: str


def split_of(document_id: str, fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS) -> str:
    """The split a document id belongs to.

    The first 8 bytes of sha256(id) read as an integer give u in [0, 1); the document goes
    to train if u < f_train, to validation if u < f_train + f_validation, else to test.
    """
    digest = hashlib.sha256(document_id.encode("utf-8")).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    train, validation, _ = fractions
    if u < train:
        return "train"
    if u < train + validation:
        return "validation"
    return "test"


def canonical_split(name: str) -> str:
    """'train', 'validation' (alias 'valid') or 'test'; DihalError for anything else."""
    name = SPLIT_ALIASES.get(name, name)
    if name not in SPLITS:
        raise DihalError(f"unknown split {name!r}; known: {', '.join(SPLITS)} (or 'valid')")
    return name


class Corpus(ABC):
    """A named collection of documents with a deterministic train/validation/test split.

    Subclasses set `name` and `description` and implement `documents()`; the split is
    computed here, once per corpus object.
    """

    name: str
    description: str

    def __init__(self, *, split_fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS) -> None:
        fractions = tuple(float(f) for f in split_fractions)
        if len(fractions) != 3 or min(fractions) < 0 or not math.isclose(sum(fractions), 1.0):
            raise DihalError(
                f"split fractions must be three non-negative numbers (train, validation, test) "
                f"summing to 1, got {list(split_fractions)}"
            )
        self.split_fractions = fractions
        self._splits: dict[str, list[Document]] | None = None

    @abstractmethod
    def documents(self) -> list[Document]:
        """All documents, in a stable order."""

    def split(self, name: str) -> list[Document]:
        """The documents of split `name` ('train', 'validation'/'valid' or 'test'), in corpus order."""
        name = canonical_split(name)
        if self._splits is None:
            documents = self.documents()
            if not documents:
                raise DihalError(f"corpus {self.name!r} has no documents")
            self._splits = {split: [] for split in SPLITS}
            for document in documents:
                self._splits[split_of(document.id, self.split_fractions)].append(document)
        return list(self._splits[name])


def tokenize_documents(documents: Sequence[Document], tokenizer) -> list[list[int]]:
    """Token ids of each document, from a Hugging Face tokenizer, with no special tokens.

    No BOS/EOS is added, so packed windows hold only the document's own tokens.
    `verbose=False` silences the tokenizer's "longer than the maximum sequence length"
    warning: whole documents are expected to exceed it, `pack` cuts them to size.
    """
    token_lists: list[list[int]] = []
    for start in range(0, len(documents), TOKENIZE_BATCH):
        texts = [document.text for document in documents[start : start + TOKENIZE_BATCH]]
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)
        token_lists.extend(list(ids) for ids in encoded["input_ids"])
    return token_lists


def _check_seq_len(seq_len: int) -> None:
    if seq_len < 1:
        raise DihalError(f"sequence length must be at least 1, got {seq_len}")


def pack(token_lists: Sequence[Sequence[int]], seq_len: int, *, split_name: str = "") -> torch.Tensor:
    """Cut each document into consecutive, non-overlapping windows of `seq_len` tokens.

    Returns a LongTensor of shape (n, seq_len), windows in document order. A document of
    k tokens yields k // seq_len windows; its last k % seq_len tokens are dropped.

    Windows never cross a document boundary, unlike the usual concatenate-and-chunk
    packing: every sequence is contiguous text from one document, so a model never
    attends from one document into an unrelated one and hidden states are never computed
    on a seam. The cost is the dropped tails (at most seq_len - 1 tokens per document).
    """
    where = f" in the {split_name} split" if split_name else ""
    _check_seq_len(seq_len)
    if not token_lists:
        raise DihalError(f"no documents{where} to pack into sequences")
    windows = [
        tokens[start : start + seq_len]
        for tokens in token_lists
        for start in range(0, len(tokens) - seq_len + 1, seq_len)
    ]
    if not windows:
        longest = max(len(tokens) for tokens in token_lists)
        raise DihalError(
            f"sequence length {seq_len} exceeds every document{where} (longest: {longest} tokens)"
        )
    return torch.tensor(windows, dtype=torch.long)


def split_stats(corpus: Corpus, tokenizer, seq_len: int) -> dict[str, dict[str, int]]:
    """Per split: documents, characters, tokens, packed sequences and packed tokens.

    The sequence count is what `pack` yields (sum over documents of tokens // seq_len); a
    split too small to pack reports 0 sequences here rather than raising.
    """
    _check_seq_len(seq_len)
    stats = {}
    for name in SPLITS:
        documents = corpus.split(name)
        lengths = [len(tokens) for tokens in tokenize_documents(documents, tokenizer)]
        sequences = sum(length // seq_len for length in lengths)
        stats[name] = {
            "documents": len(documents),
            "characters": sum(len(document.text) for document in documents),
            "tokens": sum(lengths),
            "sequences": sequences,
            "packed_tokens": sequences * seq_len,
        }
    return stats
