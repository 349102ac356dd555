"""Stage 2: the bridge targets, one job per (seed, training sequence length)."""

from __future__ import annotations

from pathlib import Path

from dihal_bench.base.files import write_safetensors_atomic
from dihal_bench.hybrid.training import (
    BRIDGE_PROTOCOL,
    packed_split,
    training_subset,
    with_states,
)
from dihal_bench.study.run import Run
from dihal_bench.training.budget import Budget


def bridge_targets(run: Run, seed: int, layers: list[int], same_length: list[Budget]) -> dict:
    """The bridge-targets job of one sequence length: every budget of that length draws a prefix of
    one seeded subset of the training split; its hidden states at ``layers`` (and the embedding
    output) are computed once and stored as safetensors, so a killed run does not redo them. The
    result is the seed's ``targets[length]``, which :meth:`Run.train_states` reads."""
    length = same_length[0].seq_len
    spec = {**run.identity(), "seq_len": length, "layers": sorted(layers), "seed": seed,
            "budgets": [b.to_dict() for b in same_length], "windows": BRIDGE_PROTOCOL}

    def work(folder: Path) -> dict:
        packed = packed_split(run.backbone, run.corpus, "train", length)
        sequences = training_subset(packed, same_length, seed)
        states = with_states(run.backbone, sequences, layers, run.progress)
        write_safetensors_atomic(folder / "sequences.safetensors", {"sequences": states.sequences.contiguous()})
        files = {}
        for layer, tensor in states.states.items():
            write_safetensors_atomic(folder / f"layer-{layer}.safetensors", {"states": tensor.contiguous()})
            files[str(layer)] = run.store.relative(folder / f"layer-{layer}.safetensors")
        return {"sequences": run.store.relative(folder / "sequences.safetensors"), "layers": files,
                "count": len(sequences)}

    return run.store.run("bridge-targets", spec, work)
