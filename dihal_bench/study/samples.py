"""A method's samples: drawn from a hybrid as every autoregressive method draws them, stored as
one JSON line per sample (text and token ids), read back for metrics and the record's examples."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dihal_bench.base.files import write_text_atomic
from dihal_bench.hybrid.model import HybridLM
from dihal_bench.study.run import Run

#: sample texts per method kept in the record, for pages that show a few without the job store
EXAMPLES = 5

def draw_samples(run: Run, model: HybridLM, seed: int) -> torch.Tensor:
    """The suite's samples from a hybrid (DiHAL, a control), drawn as every AR method draws them."""
    sampling = run.config.sampling
    return model.generate(sampling.samples, sampling.seq_len, temperature=sampling.temperature,
                          top_p=sampling.top_p, seed=seed, batch_size=sampling.batch_size, progress=run.progress)

def write_samples(run: Run, folder: Path, ids: torch.Tensor) -> dict:
    texts = run.backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)
    path = folder / "samples.jsonl"
    write_text_atomic(path, "".join(json.dumps({"text": t, "token_ids": i}) + "\n" for t, i in zip(texts, ids.tolist(), strict=True)))
    return {"path": run.store.relative(path), "count": len(texts)}

def read_samples(path: Path) -> tuple[list[str], list[list[int]]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return [r["text"] for r in rows], [r["token_ids"] for r in rows]
