"""Conformance check for backbone plugins: can the layer stack be entered at every index, and
does a truncated pass (``hidden_states(..., up_to=ℓ)``) give what the full pass gives? And the
cheap check every loaded backbone gets (`check_states`): one pass of a few tokens, whose hidden
states must be what the contract says, before anything is computed or stored from them."""

from __future__ import annotations

from pydoc_data.topics import topics

import torch

from dihal_bench.api.backbone import Backbone
from dihal_bench.errors import DihalError

#: relative to the largest |logit|, in float32
DEFAULT_TOLERANCE = 1e-4


def probe_batch(backbone: Backbone, min_tokens: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """Two texts of different lengths, right-padded, so masks and padding are exercised.

    The long one exceeds the sliding window (when the model has one) so that local
    attention layers are checked beyond their window too.
    """
    long_len = max(min_tokens, (backbone.sliding_window or 0) + 32)
    text = " ".join(topics[key] for key in sorted(topics))
    tokenizer = backbone.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:long_len]
    short = ids[: max(8, long_len // 3)]
    pad = tokenizer.pad_token_id
    input_ids = torch.full((2, long_len), pad, dtype=torch.long)
    mask = torch.zeros((2, long_len), dtype=torch.long)
    for row, seq in enumerate((ids, short)):
        input_ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return input_ids, mask


@torch.no_grad()
def check_backbone(backbone: Backbone, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """Max |logits(full) - logits(resumed from hidden state ℓ)| for every ℓ in 0..L, and max
    |h_ℓ(truncated at ℓ) - h_ℓ(full)| relative to max |h_ℓ|."""
    input_ids, mask = probe_batch(backbone)
    real = mask.bool().to(backbone.device)
    full = backbone.logits(input_ids, mask).float()
    scale = full[real].abs().max().item()
    states = backbone.hidden_states(input_ids, mask)
    diffs = []
    for layer, hidden in enumerate(states):
        resumed = backbone.resume(hidden, layer, mask).float()
        diffs.append((resumed - full)[real].abs().max().item())
    truncated = []
    for layer, hidden in enumerate(states):
        prefix = backbone.hidden_states(input_ids, mask, up_to=layer)
        if len(prefix) != layer + 1:
            raise DihalError(f"{backbone.name}: hidden_states(up_to={layer}) returned {len(prefix)} states, "
                             f"not {layer + 1}")
        reference = hidden[real].float()
        truncated.append(((prefix[layer][real].float() - reference).abs().max() / reference.abs().max()).item())
    worst = max(diffs)
    return {
        **backbone.describe(),
        "probe_tokens": int(mask.sum()),
        "logit_scale": scale,
        "tolerance": tolerance,
        "max_abs_diff": diffs,
        "worst_relative": worst / scale,
        "truncated_relative_diff": truncated,
        "passed": worst <= tolerance * scale and max(truncated) <= tolerance,
    }


#: tokens in the probe that `check_states` runs: enough for a (B, T, d) shape to be unambiguous
STATE_PROBE_TOKENS = 5


@torch.no_grad()
def check_states(backbone: Backbone, source: str) -> None:
    """DihalError naming the plugin (``source``) unless ``backbone.hidden_states`` of a 2-row
    probe gives ``num_layers + 1`` tensors of shape (2, T, width), each of the backbone's floating
    dtype and finite: a plugin whose states are off would otherwise train bridges and fill records
    with numbers of the wrong thing."""
    rows, length = 2, STATE_PROBE_TOKENS
    name = getattr(backbone, "name", type(backbone).__name__)
    try:
        layers, width, vocab = int(backbone.num_layers), int(backbone.width), int(backbone.vocab_size)
        ids = (torch.arange(rows * length).reshape(rows, length) % max(vocab, 1)).to(backbone.device)
        states = backbone.hidden_states(ids, torch.ones_like(ids))
    except DihalError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plugin's code: one line naming it
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DihalError(f"backbone {name!r} from {source}: hidden_states failed on a "
                         f"{rows}x{length} probe: {type(exc).__name__}: {first}".rstrip(": ")) from None
    problem = _states_problem(states, layers, (rows, length, width), getattr(backbone, "dtype", None))
    if problem:
        raise DihalError(f"backbone {name!r} from {source}: hidden_states {problem}; the plugin breaks "
                         "the backbone contract (dihal_bench.api.backbone): fix it or use another backbone")


def _states_problem(states, layers: int, shape: tuple[int, int, int], dtype) -> str | None:
    if not isinstance(states, (list, tuple)):
        return f"returned a {type(states).__name__}, not a list of tensors"
    if len(states) != layers + 1:
        return f"returned {len(states)} states for {layers} layers (expected {layers + 1}: h_0..h_{layers})"
    for index, state in enumerate(states):
        if not isinstance(state, torch.Tensor):
            return f"state {index} is a {type(state).__name__}, not a tensor"
        if tuple(state.shape) != shape:
            return f"state {index} has shape {tuple(state.shape)}, expected (batch, tokens, width) = {shape}"
        if not state.dtype.is_floating_point or (isinstance(dtype, torch.dtype) and state.dtype != dtype):
            return f"state {index} has dtype {state.dtype}, expected the backbone's {dtype}"
        if not bool(torch.isfinite(state).all()):
            return f"state {index} holds NaN or infinite values"
    return None
