"""``dihal-local``: an lm-eval task built from a corpus split, so that perplexity needs no download."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dihal_bench.api.corpus import canonical_split
from dihal_bench.base.cache import cache_root
from dihal_bench.base.files import write_text_atomic
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import load_corpus

#: the task name that `run_lm_eval` replaces with `local_task_config(corpus)`
LOCAL_TASK = "dihal-local"
#: metric -> lm-eval aggregation (lower is better for all three)
LOCAL_METRICS = {
    "word_perplexity": "weighted_perplexity",
    "byte_perplexity": "weighted_perplexity",
    "bits_per_byte": "bits_per_byte",
}
def data_dir() -> Path:
    """Where the local task's documents are written: ``lm-eval`` under the tool's cache root."""
    return cache_root() / "lm-eval"


def local_task_config(corpus_spec: str, split: str = "test", max_documents: int | None = None) -> dict:
    """An inline lm-eval task (``tasks=[config]``) scoring the rolling log-likelihood of each
    document of a corpus split: word and byte perplexity and bits per byte, as lm-eval's
    ``wikitext`` task does.

    The documents are written to a JSON-lines file named by its content hash under
    `data_dir` and referenced by absolute path (lm-eval resolves relative data paths against
    the working directory), so the task needs no download.
    """
    corpus = load_corpus(corpus_spec)
    split = canonical_split(split)
    documents = corpus.split(split)[:max_documents]
    if not documents:
        raise DihalError(f"corpus {corpus.name!r} has no documents in its {split} split")
    lines = "".join(json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) + "\n" for d in documents)
    directory = data_dir()
    data = directory / f"{hashlib.sha256(lines.encode('utf-8')).hexdigest()[:16]}.jsonl"
    if not data.is_file():
        write_text_atomic(data, lines)
    return {
        "task": LOCAL_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}, "cache_dir": str((directory / "datasets").resolve())},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",  # a field name: the raw text, not a Jinja template
        "metric_list": [{"metric": metric, "aggregation": aggregation, "higher_is_better": False}
                        for metric, aggregation in LOCAL_METRICS.items()],
        "metadata": {"version": 1.0, "corpus": corpus.name, "split": split, "documents": len(documents)},
    }
