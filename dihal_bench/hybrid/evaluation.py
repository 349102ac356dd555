"""Teacher-forced evaluation of next-token models and of bridges (docs/method.md#bridge).

All the measures run over fixed-length token sequences (n, T) from the corpus's packed
validation split, in batches without gradients, and accumulate sums in float64 so that the
result does not depend on the batch size beyond float32 rounding of each batch.

A model's next-token predictions are its logits at positions 0..T−2, scored against the
tokens at 1..T−1: each sequence contributes T−1 predicted tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.bridge import HiddenStateBridge
from dihal_bench.api.likelihood import HeldOutNLL, next_token_nll, with_start
from dihal_bench.base.memo import LastResult
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.model import HybridLM, start_token_id

#: token ids (B, T) -> next-token logits (B, T, V), e.g. ``backbone.logits`` or ``hybrid.logits``
LogitsFn = Callable[[Tensor], Tensor]


@torch.no_grad()
def teacher_forced_nll(logits_fn: LogitsFn, sequences: Tensor, batch_size: int = 16, *,
                       progress: bool = False) -> dict:
    """Σ −log p(x_t | x_<t) over t = 1..T−1 of every sequence (``nll_sum``), the number of
    predicted tokens (``tokens``) and the perplexity exp(nll_sum / tokens) (``ppl``)."""
    tokens = _predicted_tokens(sequences)
    nll_sum = torch.zeros((), dtype=torch.float64)
    for batch in _batches(sequences, batch_size, progress, "teacher-forced NLL"):
        logits = logits_fn(batch)[:, :-1].float()
        targets = batch[:, 1:].to(logits.device)
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        nll_sum += nll.double().sum().cpu()
    nll_sum = nll_sum.item()
    return {"nll_sum": nll_sum, "tokens": tokens, "ppl": math.exp(nll_sum / tokens)}


@torch.no_grad()
def hybrid_test_nll(hybrid: HybridLM, windows: Tensor, batch_size: int = 16) -> HeldOutNLL:
    """The hybrid's −log p of held-out ``windows`` (n, T), every token scored, the first from the
    start token that generation starts from (docs/method.md#test-nll). Exact where the bridge's
    ĥ_ℓ does not depend on its noise seed. Where it does, the logits are those of one noise draw
    (the hybrid's ``noise_seed``), while generation draws a seed per batch: the sampled model is the
    mixture over draws, and the NLL under one draw is, in expectation over draws, an upper bound on
    the mixture's (Jensen), so it is labelled a bound."""
    device = hybrid.backbone.device
    start = start_token_id(hybrid.backbone.tokenizer)

    def logits_of(batch: Tensor, noise_seed: int | None = None) -> Tensor:
        return hybrid.logits(with_start(batch.to(device), start), noise_seed=noise_seed)[:, :-1]

    probe = windows[:1]
    noisy = not torch.equal(logits_of(probe, hybrid.noise_seed), logits_of(probe, hybrid.noise_seed + 1))
    return next_token_nll(logits_of, windows, batch_size, bound=noisy)


@torch.no_grad()
def kl_to_backbone(backbone: Backbone, hybrid: HybridLM, sequences: Tensor, batch_size: int = 16, *,
                   progress: bool = False) -> float:
    """Mean over predicted tokens of KL(p_backbone ‖ p_hybrid) = Σ_v p_b(v)·(log p_b(v) − log p_h(v)),
    in nats, both distributions conditioned on the same true prefix."""
    return hybrid_against_backbone(backbone, hybrid, sequences, batch_size, progress=progress)["kl"]


@torch.no_grad()
def hybrid_against_backbone(backbone: Backbone, hybrid: HybridLM, sequences: Tensor, batch_size: int = 16, *,
                            progress: bool = False) -> dict:
    """The hybrid's teacher-forced NLL (``nll_sum``, ``tokens``, ``ppl``, as
    :func:`teacher_forced_nll`) and its KL to the backbone (``kl``, as :func:`kl_to_backbone`)
    from one hybrid pass: the two read the same logits, and a hybrid pass costs the bridge's
    sampling steps on top of the upper layers, so computing them apart would pay it twice."""
    tokens = _predicted_tokens(sequences)
    nll_sum = torch.zeros((), dtype=torch.float64)
    kl_sum = torch.zeros((), dtype=torch.float64)
    reference = backbone_log_probs(backbone, sequences, batch_size)
    for batch, log_p in zip(_batches(sequences, batch_size, progress, "hybrid vs backbone"), reference, strict=True):
        log_q = F.log_softmax(hybrid.logits(batch)[:, :-1].float(), dim=-1)
        log_p = log_p.to(log_q.device)
        # the NLL from log-softmax rows equals cross_entropy's, which computes the same thing
        targets = batch[:, 1:].to(log_q.device)
        nll_sum += -log_q.gather(-1, targets[..., None]).double().sum().cpu()
        kl_sum += (log_p.exp() * (log_p - log_q)).sum(-1).double().sum().cpu()
    return {"nll_sum": nll_sum.item(), "tokens": tokens, "ppl": math.exp(nll_sum.item() / tokens),
            "kl": kl_sum.item() / tokens}


# The backbone's log-probabilities on the last windows scored: a sweep compares every layer's
# hybrid with the same backbone on the same windows, and the full backbone pass cost as much
# as the hybrid's own (≈ 10 s for 64 windows of 64 tokens on 2 cores).
_last_log_probs = LastResult()
#: the most host memory the memo may hold; larger sets (the paper suite's 512 windows of 256 tokens
#: over a 128k vocabulary would be 67 GB) are computed a batch at a time on every call, as before
LOG_PROBS_MEMO_BYTES = 2 * 2**30


def backbone_log_probs(backbone: Backbone, sequences: Tensor, batch_size: int = 16) -> Iterable[Tensor]:
    """The backbone's next-token log-probabilities at positions 0..T−2 of ``sequences``, one
    float32 tensor (b, T−1, V) per batch of ``batch_size`` rows. Memoised (on the CPU) for the
    last backbone and windows when they fit ``LOG_PROBS_MEMO_BYTES``: n·(T−1)·V floats, 0.8 GB
    for 64 windows of 64 tokens over a 49k vocabulary. The batching is in the key because it is
    in the numbers (float rounding)."""
    def passes() -> Iterator[Tensor]:
        with torch.no_grad():
            for batch in _batches(sequences, batch_size, False, "backbone log-probabilities"):
                yield F.log_softmax(backbone.logits(batch)[:, :-1].float(), dim=-1)

    if sequences.shape[0] * (sequences.shape[1] - 1) * backbone.vocab_size * 4 > LOG_PROBS_MEMO_BYTES:
        return passes()
    key = (tuple(sequences.shape), sequences.cpu().numpy().tobytes(), batch_size)
    return _last_log_probs.get(backbone, key, lambda: [log_p.cpu() for log_p in passes()])


@torch.no_grad()
def bridge_reconstruction(bridge: HiddenStateBridge, cond: Tensor, target: Tensor, mask: Tensor,
                          steps: int | None = None, batch_size: int = 64, *, sink: bool = True,
                          sampler: str | None = None, seed: int = 0, progress: bool = False) -> dict:
    """Bridgeability of a layer: how well ``steps``-step sampled ĥ_ℓ matches h_ℓ.

    ``sampler`` overrides the bridge's update rule (DiHAL's: docs/method.md#bridge; None, the
    bridge's own, and the only choice for bridges without one); a sampler's noise comes from
    one generator seeded with ``seed`` and handed to every batch in turn.

    With ``sink`` the bridge is given the exact position-0 state, ``target[:, :1]``, as the
    hybrid gives it with sink passthrough (and as training does); without, it samples
    position 0 too (the no-passthrough ablation).

    Both are standardised with the bridge's target statistics; over the tokens where
    ``mask`` (n, T) is True (the caller leaves out position 0), ``mse`` is the mean squared
    error per dimension and ``r2`` = 1 − SSE/SST, with SST taken around the per-dimension
    mean of the standardised targets over those same tokens. ``tokens`` counts them.

    ``mse_trace`` is the same error in the metric of locate's ``trace`` preprocessing: the
    raw error divided by the single scale √(tr Σ / d), Σ the bridge's target covariance
    (its target std squared, summed), i.e. Σ_j err_j² / Σ_j σ_j² with err_j² the mean
    squared error of dimension j. ``mse`` weighs every dimension alike (Σ_j err_j²/σ_j²,
    over d); ``mse_trace`` weighs each by its variance, as the proxies see it, so a
    channel holding most of the variance dominates it as it dominates them.
    """
    if not mask.any():
        raise DihalError("bridge reconstruction: the mask selects no tokens")
    reference = bridge.target_mean
    sse = torch.zeros((), dtype=torch.float64)
    raw_sse = torch.zeros((), dtype=torch.float64)
    total = torch.zeros(target.shape[-1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    count = 0
    generator = torch.Generator().manual_seed(seed)
    override = {} if sampler is None else {"sampler": sampler}
    for start in tqdm(range(0, cond.shape[0], batch_size), desc="bridge reconstruction",
                      disable=not progress, leave=False):
        rows = slice(start, start + batch_size)
        keep = mask[rows].to(reference.device)
        if not keep.any():
            continue
        exact_sink = target[rows, :1].to(reference.device, reference.dtype) if sink else None
        sampled = bridge.sample(cond[rows].to(reference.device, reference.dtype), steps, generator=generator,
                                sink=exact_sink, **override)
        # float64 inputs make the standardisation itself run in float64 (the buffers promote)
        raw_predicted = sampled[keep].double()
        raw_actual = target[rows].to(reference.device)[keep].double()
        predicted = bridge.standardize_target(raw_predicted)
        actual = bridge.standardize_target(raw_actual)
        sse += (predicted - actual).pow(2).sum().cpu()
        raw_sse += (raw_predicted - raw_actual).pow(2).sum().cpu()
        total += actual.sum(0).cpu()
        squares += actual.pow(2).sum(0).cpu()
        count += int(keep.sum())
    sst = (squares - total.pow(2) / count).sum()
    # tr Σ of the target; the mean drops out of a difference, so centring changes nothing
    trace = bridge.target_std.double().pow(2).sum().cpu()
    return {
        "mse": sse.item() / (count * target.shape[-1]),
        "mse_trace": raw_sse.item() / (count * trace.item()),
        "r2": 1.0 - sse.item() / sst.item() if sst > 0 else float("nan"),
        "tokens": count,
    }


#: the sampling steps :func:`steps_axis` measures by default
STEPS_AXIS = (1, 2, 4, 8, 16)


@torch.no_grad()
def steps_axis(bridge: HiddenStateBridge, cond: Tensor, target: Tensor, mask: Tensor,
               steps: tuple[int, ...] = STEPS_AXIS, batch_size: int = 64, *, sink: bool = True,
               sampler: str | None = None, seed: int = 0, progress: bool = False) -> dict[int, dict]:
    """Bridgeability at each number of sampling steps K in ``steps``, with the same weights and
    ``sampler``: {K: {"mse", "mse_trace", "r2"}} as :func:`bridge_reconstruction` measures them."""
    if not steps or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in steps):
        raise DihalError(f"the steps axis needs sampling steps ≥ 1, got {steps!r}")
    axis = {}
    for k in steps:
        measured = bridge_reconstruction(bridge, cond, target, mask, k, batch_size, sink=sink, sampler=sampler,
                                         seed=seed, progress=progress)
        axis[k] = {key: measured[key] for key in ("mse", "mse_trace", "r2")}
    return axis


def _predicted_tokens(sequences: Tensor) -> int:
    if sequences.dim() != 2 or sequences.shape[1] < 2:
        raise DihalError(f"evaluation needs token sequences (n, T) with T ≥ 2, got shape {tuple(sequences.shape)}")
    return sequences.shape[0] * (sequences.shape[1] - 1)


def _batches(sequences: Tensor, batch_size: int, progress: bool, desc: str) -> Iterator[Tensor]:
    for start in tqdm(range(0, sequences.shape[0], batch_size), desc=desc, disable=not progress, leave=False):
        yield sequences[start : start + batch_size]
