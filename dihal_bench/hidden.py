"""Hidden-state extraction: one forward pass per batch gives every layer at once.

Position 0 of every sequence is the attention sink (norms ~100x the rest on SmolLM2,
DESIGN.md §3): it is never sampled for statistics, and bridges leave it out of their loss.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from dihal_bench.backbone import Backbone
from dihal_bench.errors import DihalError


def sample_positions(n_sequences: int, seq_len: int, n_tokens: int, seed: int) -> torch.Tensor:
    """``n_tokens`` distinct (sequence, position) pairs with position ≥ 1, drawn without
    replacement from a seeded generator and sorted, as an (N, 2) LongTensor."""
    available = n_sequences * (seq_len - 1)
    if n_tokens > available:
        raise DihalError(f"--tokens {n_tokens} exceeds the {available} token positions available "
                         f"({n_sequences} sequences x {seq_len - 1} positions after the first)")
    generator = torch.Generator().manual_seed(seed)
    flat = torch.randperm(available, generator=generator)[:n_tokens].sort().values
    return torch.stack([flat // (seq_len - 1), flat % (seq_len - 1) + 1], dim=1)


@torch.no_grad()
def extract_sampled(
    backbone: Backbone,
    sequences: torch.Tensor,
    positions: torch.Tensor,
    batch_size: int = 8,
    progress: bool = True,
) -> torch.Tensor:
    """Hidden states of every layer at the sampled positions: (L+1, N, d) float32.

    Streams batch by batch and keeps float32 copies of the sampled tokens only, so memory
    is O(L·N·d), not O(L·n·T·d), even for wide models."""
    out = torch.empty(backbone.num_layers + 1, len(positions), backbone.width, dtype=torch.float32)
    needed = torch.unique(positions[:, 0])
    filled = 0
    for start in tqdm(range(0, len(needed), batch_size), desc="hidden states", unit="batch", disable=not progress):
        rows = needed[start:start + batch_size]
        states = backbone.hidden_states(sequences[rows])
        for local, row in enumerate(rows.tolist()):
            pos = positions[positions[:, 0] == row, 1]
            for layer, hidden in enumerate(states):
                out[layer, filled:filled + len(pos)] = hidden[local, pos.to(hidden.device)].float().cpu()
            filled += len(pos)
    return out


@torch.no_grad()
def extract_layers(
    backbone: Backbone,
    sequences: torch.Tensor,
    layers: list[int],
    batch_size: int = 8,
    progress: bool = True,
) -> dict[int, torch.Tensor]:
    """Full hidden states (n, T, d) float32 of the given layer indices (0 = embeddings),
    from one forward pass per batch for all of them: the bridge targets of a sweep."""
    n, length = sequences.shape
    out = {layer: torch.empty(n, length, backbone.width, dtype=torch.float32) for layer in layers}
    for start in tqdm(range(0, n, batch_size), desc="bridge targets", unit="batch", disable=not progress):
        states = backbone.hidden_states(sequences[start:start + batch_size])
        for layer in layers:
            out[layer][start:start + batch_size] = states[layer].float().cpu()
    return out
