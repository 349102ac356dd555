"""Hidden-state extraction: one forward pass per batch gives every needed layer at once, and
the pass stops at the deepest layer asked for (``Backbone.hidden_states(..., up_to=l)``).

Position 0 of every sequence is the attention sink (norms ~100x the rest on SmolLM2,
docs/method.md#embedded-defaults): it is never sampled for statistics, and bridges leave it out of their loss.
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from dihal_bench.api.backbone import Backbone
from dihal_bench.errors import DihalError


def sample_positions(n_sequences: int, seq_len: int, n_tokens: int, seed: int,
                     sequences: int | None = None) -> torch.Tensor:
    """``n_tokens`` distinct (sequence, position) pairs with position ≥ 1, as an (N, 2)
    LongTensor sorted by sequence, then position.

    The forward passes cost a whole sequence for every sequence that holds a sampled
    position, so the tokens come from few sequences: a seeded permutation picks
    ``sequences`` of them (default: the fewest that hold N tokens, ⌈N / (T−1)⌉), and the N
    positions are drawn without replacement among all their positions. Sampling N positions
    out of the whole split instead touches nearly every sequence once N is comparable to
    the number of sequences, whatever N is.
    """
    per_sequence = seq_len - 1
    available = n_sequences * per_sequence
    if n_tokens < 1:
        raise DihalError(f"--tokens {n_tokens} is too small: sample at least one token")
    if n_tokens > available:
        raise DihalError(f"--tokens {n_tokens} exceeds the {available} token positions available "
                         f"({n_sequences} sequences x {per_sequence} positions after the first)")
    fewest = math.ceil(n_tokens / per_sequence)
    if sequences is None:
        sequences = fewest
    elif not fewest <= sequences <= n_sequences:
        raise DihalError(f"sequences={sequences} is out of range: {n_tokens} tokens need {fewest}..{n_sequences} "
                         f"of the {n_sequences} sequences of {seq_len} tokens")
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(n_sequences, generator=generator)[:sequences]
    flat = torch.randperm(sequences * per_sequence, generator=generator)[:n_tokens]
    rows, columns = chosen[flat // per_sequence], flat % per_sequence + 1
    order = (rows * seq_len + columns).argsort()
    return torch.stack([rows[order], columns[order]], dim=1)


def _forward(backbone: Backbone, input_ids: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """h_0..h_depth of ``input_ids``. A full-depth pass uses the plain call, which every
    backbone implements, also one written before ``up_to`` joined the contract."""
    if depth == backbone.num_layers:
        return backbone.hidden_states(input_ids)
    return backbone.hidden_states(input_ids, up_to=depth)


@torch.no_grad()
def extract_sampled(
    backbone: Backbone,
    sequences: torch.Tensor,
    positions: torch.Tensor,
    batch_size: int = 8,
    progress: bool = True,
    *,
    up_to: int | None = None,
) -> torch.Tensor:
    """Hidden states of layers 0..``up_to`` (default: every layer) at the sampled positions:
    (up_to+1, N, d) float32, row i for ``positions[i]``.

    Only the sequences that hold a sampled position are run, and only up to ``up_to``.
    Streams batch by batch and keeps float32 copies of the sampled tokens only, so memory
    is O(L·N·d), not O(L·n·T·d), even for wide models."""
    depth = backbone.check_up_to(up_to)
    out = torch.empty(depth + 1, len(positions), backbone.width, dtype=torch.float32)
    needed = torch.unique(positions[:, 0])
    for start in tqdm(range(0, len(needed), batch_size), desc="hidden states", unit="batch", disable=not progress):
        rows = needed[start:start + batch_size]
        states = _forward(backbone, sequences[rows], depth)
        wanted = torch.isin(positions[:, 0], rows).nonzero().squeeze(1)
        local = torch.searchsorted(rows, positions[wanted, 0])  # row of the batch; `needed` is sorted
        columns = positions[wanted, 1]
        for layer, hidden in enumerate(states):
            out[layer, wanted] = hidden[local.to(hidden.device), columns.to(hidden.device)].float().cpu()
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
    from one forward pass per batch for all of them that stops at the deepest: the bridge
    targets of a sweep, at a cost proportional to max(layers)."""
    for layer in layers:
        if not 0 <= layer <= backbone.num_layers:
            raise DihalError(f"layer {layer} is out of range for {backbone.name}: choose 0..{backbone.num_layers} "
                             f"({backbone.num_layers} layers)")
    if not layers:
        return {}
    depth = max(layers)
    n, length = sequences.shape
    out = {layer: torch.empty(n, length, backbone.width, dtype=torch.float32) for layer in layers}
    for start in tqdm(range(0, n, batch_size), desc="bridge targets", unit="batch", disable=not progress):
        states = _forward(backbone, sequences[start:start + batch_size], depth)
        for layer in layers:
            out[layer][start:start + batch_size] = states[layer].float().cpu()
    return out
