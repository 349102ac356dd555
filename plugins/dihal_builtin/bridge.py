"""DiHAL's conditional diffusion bridge from token embeddings to a layer's hidden state, and
the same network trained as a one-step regressor (the non-diffusion control).

Our reading of DiHAL (arXiv 2605.14368; docs/method.md#bridge, the paper does not publish the
bridge): a Brownian bridge between the standardised target x₀ = h_ℓ (at t=0) and the
standardised condition c = h_0 (at t=1),

    x_t = (1−t)·x₀ + t·c + σ·√(t(1−t))·ε,   ε ~ N(0, I),

with a causal transformer denoiser f(x_t, t, c) ≈ x₀ trained by MSE. Sampling starts at
x_1 = c and walks the uniform grid t_k = k/K down to 0, one of three update rules per step
(the ``sampler`` option; docs/method.md#bridge):

- ``mean``: x_s = x̂₀ + (s/t)·(x_t − x̂₀), the mean of a Brownian bridge pinned at x̂₀ and
  x_t, observed at s. It adds no noise, so x_t drifts off the training marginal.
- ``ancestral``: the same mean plus the posterior's spread σ·√(s(t−s)/t)·z: a draw from
  q(x_s | x_t, x₀ = x̂₀), which keeps x_t on the marginal when x̂₀ is right.
- ``ddim``: x_s = (1−s)·x̂₀ + s·c + σ·√(s(1−s))·ε̂, the marginal at s with the noise ε̂
  inferred from x_t, deterministic after the first step. At t = 1, x_1 = c holds no noise to
  infer, so the first step draws ε̂ ~ N(0, I) (the "booting noise" of diffusion bridge
  implicit models, Zheng et al. 2024, arXiv 2405.15885), which makes it the ancestral step.

Noise is a function of (seed, sampling step, absolute position): every position's noise is
drawn from a generator of its own, so a position's ĥ does not change when later positions are
added, whole-sequence and incremental sampling agree, and the same seed gives the same numbers.

Position 0 (the attention sink) is held at its exact state in x_t, at every t, both in
training (its clean target) and in sampling (the ``sink`` the caller computes): every other
position attends to it, so it must look the same in both, and nothing there is learned (its
loss is left out). Sampling from one's own estimate of it instead made more sampling steps
worse (validation MSE at layer 3 of SmolLM2: 0.630 with 1 step, 0.680 with 8, 0.762 with 32).

The denoiser has one addition of ours: a linear path from the condition straight to the
output (zero at initialisation), x̂₀ = transformer(x_t, t, c) + W·c. Much of h_ℓ at shallow
layers is a per-token function of the embedding (a per-token linear map from h_0 explains
R² ≈ 0.65 of h_1 and 0.38 of h_3 on SmolLM2-135M); through the transformer's 256-wide
bottleneck alone, a short CPU budget learned under half of that (R² 0.21 vs 0.38 at layer
3 after 150 steps, measured side by side), with the path it matched it.

Incremental sampling (``sample_step``) serves the hybrid's token-by-token decoding. The K
denoiser calls see x_t at K fixed times t_k, and a position's x_t at t_k depends only on
the positions up to it (and on its own noise, keyed by its position), so each of the K calls
is an ordinary causal transformer pass over a growing sequence: one key/value cache per
sampling step and block lets a new position attend to the earlier ones without recomputing
them. Everything else is per position: the standardiser, the linear condition path, the
learned position (indexed by absolute position), the time embedding (one per step, shared
by all positions), the noise and the held sink (position 0 of the first call).

The regressor control (``RegressorBridge``) is the same network trained at t = 1 only, where
the bridge sits exactly on the condition (x_1 = c, no noise), and sampled in the one step
from there: f(c, 1, c) regressed on x₀ by the same MSE, under the same budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dihal_bench import hookimpl
from dihal_bench.api.bridge import HiddenStateBridge, SampleCache, hold_sink
from dihal_bench.errors import DihalError

from .layers import Block, timestep_embedding

#: draws standard normal noise shaped like the state it is added to, only when a step needs it
NoiseDraw = Callable[[], Tensor]


def posterior_mean_step(x_t: Tensor, x0_hat: Tensor, c: Tensor, t: float, s: float, sigma: float,
                        draw: NoiseDraw) -> Tensor:
    """``mean``: x_s = x̂₀ + (s/t)·(x_t − x̂₀), the bridge posterior's mean; no noise."""
    return x0_hat + (s / t) * (x_t - x0_hat)


def ancestral_step(x_t: Tensor, x0_hat: Tensor, c: Tensor, t: float, s: float, sigma: float,
                   draw: NoiseDraw) -> Tensor:
    """``ancestral``: a draw from q(x_s | x_t, x₀ = x̂₀) = N(x̂₀ + (s/t)·(x_t − x̂₀), σ²·s(t−s)/t)."""
    mean = posterior_mean_step(x_t, x0_hat, c, t, s, sigma, draw)
    return mean + sigma * math.sqrt(s * (t - s) / t) * draw() if s > 0 else mean


def implicit_step(x_t: Tensor, x0_hat: Tensor, c: Tensor, t: float, s: float, sigma: float,
                  draw: NoiseDraw) -> Tensor:
    """``ddim``: x_s = (1−s)·x̂₀ + s·c + σ·√(s(1−s))·ε̂ with ε̂ = (x_t − (1−t)·x̂₀ − t·c)/(σ·√(t(1−t))),
    written without the division by σ (which cancels); at t = 1 ε̂ is drawn (booting noise)."""
    if s == 0:
        return x0_hat
    on_marginal = (1 - s) * x0_hat + s * c
    if t == 1:  # x_1 = c: no noise to infer
        return on_marginal + sigma * math.sqrt(s * (1 - s)) * draw()
    return on_marginal + math.sqrt(s * (1 - s) / (t * (1 - t))) * (x_t - (1 - t) * x0_hat - t * c)


#: the bridge's update rules from t to s < t, by the name the ``sampler`` option takes
SAMPLER_STEPS: dict[str, Callable[..., Tensor]] = {
    "mean": posterior_mean_step,
    "ddim": implicit_step,
    "ancestral": ancestral_step,
}


def check_sampler(name: str) -> str:
    if name not in SAMPLER_STEPS:
        raise DihalError(f"unknown bridge sampler {name!r}: choose one of {', '.join(SAMPLER_STEPS)}")
    return name


def reverse_bridge(c: Tensor, steps: int, denoise: Callable[[int, Tensor], Tensor], step: Callable[..., Tensor],
                   sigma: float, noise: Callable[[int], Tensor], held: Tensor | None = None) -> Tensor:
    """The standardised x̂₀ of the last of ``steps`` updates ``step`` from x_1 = c on the grid
    t_k = k/steps; ``denoise(k, x_t)`` is x̂₀ at t = k/steps (the network, or an exact posterior
    in tests) and ``noise(k)`` the standard normal noise of step k, drawn only if the step uses
    it. ``held`` (n, 1, width), the standardised sink, stays at position 0 of x_t and x̂₀
    throughout, as in training."""
    hold = (lambda x: x) if held is None else (lambda x: hold_sink(x, held))
    x_t = hold(c)  # x_1 = c: at t=1 the bridge sits exactly on the condition
    for k in range(steps, 0, -1):
        t, s = k / steps, (k - 1) / steps
        x0_hat = hold(denoise(k, x_t))
        x_t = hold(step(x_t, x0_hat, c, t, s, sigma, lambda k=k: noise(k)))
    return x0_hat


class PositionNoise:
    """Standard normal noise keyed by (seed, sampling step, absolute position): position p's
    noise at step k, (n, width) for a batch of n, is drawn from a generator seeded with a
    hash of (seed, k, p), so it is the same whichever positions are sampled with it.
    Generators run on the tensors' device: the same seed gives the same noise on one kind
    of device, not across kinds."""

    def __init__(self, seed: int):
        self.seed = seed

    @classmethod
    def from_generator(cls, generator: torch.Generator | None) -> PositionNoise:
        """Noise whose seed is one draw from ``generator`` (seed 0 without one)."""
        if generator is None:
            return cls(0)
        return cls(int(torch.randint(0, 2**62, (), generator=generator, device=generator.device)))

    def __call__(self, step: int, start: int, like: Tensor) -> Tensor:
        """Noise shaped like ``like`` (n, T, width) for positions start..start+T−1 at ``step``."""
        n, length, width = like.shape
        rows = []
        for position in range(start, start + length):
            generator = torch.Generator(device=like.device).manual_seed(_mix(self.seed, step, position))
            rows.append(torch.randn(n, width, generator=generator, device=like.device, dtype=like.dtype))
        return torch.stack(rows, dim=1)


def _mix(*values: int) -> int:
    """A 63-bit hash of non-negative integers (SplitMix64's finaliser over each in turn), so that
    nearby (seed, step, position) triples seed unrelated generator streams."""
    mask = 2**64 - 1
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ value) * 0xBF58476D1CE4E5B9 & mask
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & mask
        state ^= state >> 31
    return state >> 1


class DihalBridge(HiddenStateBridge):
    """Brownian-bridge diffusion with an x₀-predicting causal transformer denoiser.

    ``steps`` and ``sampler`` are the sampling defaults (K and the update rule, one of
    :data:`SAMPLER_STEPS`); ``sample``, ``new_sample_cache`` and the hybrid can override both.
    """

    def __init__(
        self,
        width: int,
        d_model: int = 256,
        layers: int = 2,
        heads: int = 4,
        sigma: float = 0.5,
        steps: int = 8,
        dropout: float = 0.0,
        max_len: int = 512,
        sampler: str = "mean",
    ):
        super().__init__(width)
        self.sampler = sampler
        if d_model % heads:
            raise DihalError(f"bridge d_model {d_model} is not divisible by heads {heads}")
        self.d_model, self.layers, self.heads = d_model, layers, heads
        self.sigma, self.steps, self.dropout, self.max_len = sigma, steps, dropout, max_len

        self.in_proj = nn.Linear(2 * width, d_model)  # reads concat[x_t, c]
        self.time_mlp = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        self.position = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, causal=True) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, width)
        self.cond_skip = nn.Linear(width, width)
        nn.init.zeros_(self.cond_skip.weight)
        nn.init.zeros_(self.cond_skip.bias)

    def config(self) -> dict:
        return {
            "width": self.width,
            "d_model": self.d_model,
            "layers": self.layers,
            "heads": self.heads,
            "sigma": self.sigma,
            "steps": self.steps,
            "dropout": self.dropout,
            "max_len": self.max_len,
            "sampler": self.sampler,
        }

    @property
    def sampler(self) -> str:
        """The default update rule, a name of :data:`SAMPLER_STEPS`: a sampling setting, not a
        weight, so a trained bridge may be sampled with another (the runner's steps axis)."""
        return self._sampler_name

    @sampler.setter
    def sampler(self, name: str) -> None:
        self._sampler_name = check_sampler(name)

    def denoise(self, x_t: Tensor, t: Tensor, c: Tensor) -> Tensor:
        """f(x_t, t, c): the standardised x₀ predicted from (n, T, width) x_t and c and (n,) t."""
        length = x_t.shape[1]
        if length > self.max_len:
            raise DihalError(f"sequence of {length} tokens exceeds the bridge's max_len {self.max_len}")
        h = self.in_proj(torch.cat([x_t, c], dim=-1))
        h = h + self.time_mlp(timestep_embedding(t, self.d_model))[:, None, :]
        h = h + self.position(torch.arange(length, device=h.device))
        for block in self.blocks:
            h = block(h)
        return self.out_proj(self.final_norm(h)) + self.cond_skip(c)

    def loss(self, cond: Tensor, target: Tensor, mask: Tensor, generator: torch.Generator) -> Tensor:
        """MSE between f's x̂₀ and x₀ (standardised), averaged over the masked tokens at
        positions ≥ 1, at one t per sequence (:meth:`training_times`); position 0 of x_t is
        its clean target, as sampling holds it at the given sink."""
        c, x0 = self.standardize_cond(cond), self.standardize_target(target)
        t = self.training_times(x0.shape[0], generator, x0)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        tt = t[:, None, None]
        x_t = hold_sink((1 - tt) * x0 + tt * c + self.sigma * torch.sqrt(tt * (1 - tt)) * noise, x0[:, :1])
        per_token = (self.denoise(x_t, t, c) - x0).pow(2).mean(-1)
        weights = mask.to(per_token.dtype, copy=True)
        weights[:, 0] = 0  # the sink is given, never predicted
        if not weights.any():
            raise DihalError("bridge loss: the mask selects no token after position 0")
        return (per_token * weights).sum() / weights.sum()

    def training_times(self, n: int, generator: torch.Generator, like: Tensor) -> Tensor:
        """The (n,) diffusion times of one training batch: t ~ U(0, 1) per sequence."""
        return torch.rand(n, generator=generator, device=like.device, dtype=like.dtype)

    @torch.no_grad()
    def sample(
        self,
        cond: Tensor,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
        sink: Tensor | None = None,
        sampler: str | None = None,
    ) -> Tensor:
        """As :meth:`HiddenStateBridge.sample`, with the update rule ``sampler`` (None: the
        bridge's; ``stochastic`` asks for ``ancestral``). A sampler that adds noise draws its
        seed from ``generator`` (seed 0 without one; :class:`PositionNoise`)."""
        steps = self._check_steps(steps)
        step = SAMPLER_STEPS[self._sampler(sampler, stochastic)]
        c = self.standardize_cond(cond)
        self._check_sink(sink, c.shape[0])
        noise = PositionNoise.from_generator(generator)

        def denoise(k: int, x_t: Tensor) -> Tensor:
            return self.denoise(x_t, torch.full(c.shape[:1], k / steps, device=c.device, dtype=c.dtype), c)

        x0_hat = reverse_bridge(c, steps, denoise, step, self.sigma, lambda k: noise(k, 0, c), self._held(sink))
        return self._output(x0_hat, sink)

    def new_sample_cache(self, steps: int | None = None, sink: Tensor | None = None,
                         generator: torch.Generator | None = None, sampler: str | None = None) -> BridgeSampleCache:
        """The cache of :meth:`sample_step`: ``steps``, ``sink``, ``generator`` and ``sampler``
        as in :meth:`sample`, so that the same arguments sample the same numbers."""
        if sink is not None:
            self._check_sink(sink, sink.shape[0])
        return BridgeSampleCache(self._check_steps(steps), self.layers, self.max_len, sink,
                                 sampler=self._sampler(sampler), noise=PositionNoise.from_generator(generator))

    @torch.no_grad()
    def sample_step(self, cond_new: Tensor, cache: BridgeSampleCache) -> Tensor:
        n, length = cond_new.shape[:2]
        if cache.batch not in (None, n):
            raise DihalError(f"this bridge sample cache is for batches of {cache.batch} sequences, got {n}")
        self._check_sink(cache.sink, n)
        start = cache.advance(length, self.max_len)
        cache.batch = n
        c = self.standardize_cond(cond_new)
        # constant over the K steps: computed once per call (the same operations as in denoise)
        position = self.position(torch.arange(start, start + length, device=c.device))
        skip = self.cond_skip(c)
        if cache.time is None:
            cache.time = {k: self.time_mlp(timestep_embedding(
                torch.full((n,), k / cache.steps, device=c.device, dtype=c.dtype), self.d_model))[:, None, :]
                for k in range(1, cache.steps + 1)}

        def denoise(k: int, x_t: Tensor) -> Tensor:
            h = self.in_proj(torch.cat([x_t, c], dim=-1)) + cache.time[k] + position
            for block, keys_values in zip(self.blocks, cache.keys_values[k], strict=True):
                h = cached_block(block, h, keys_values, start)
            return self.out_proj(self.final_norm(h)) + skip

        sink = cache.sink if start == 0 else None  # position 0 is in this call
        x0_hat = reverse_bridge(c, cache.steps, denoise, SAMPLER_STEPS[cache.sampler], self.sigma,
                                lambda k: cache.noise(k, start, c), self._held(sink))
        return self._output(x0_hat, sink)

    def _sampler(self, sampler: str | None, stochastic: bool = False) -> str:
        if stochastic:
            if sampler not in (None, "ancestral"):
                raise DihalError(f"stochastic sampling is the ancestral sampler, not {sampler!r}")
            return "ancestral"
        return self.sampler if sampler is None else check_sampler(sampler)

    def _check_steps(self, steps: int | None) -> int:
        steps = self.steps if steps is None else steps
        if steps < 1:
            raise DihalError(f"bridge sampling needs at least 1 step, got {steps}")
        return steps

    def _check_sink(self, sink: Tensor | None, n: int) -> None:
        if sink is not None and tuple(sink.shape) != (n, 1, self.width):
            raise DihalError(f"the sink state must have shape ({n}, 1, {self.width}), got {tuple(sink.shape)}")

    def _held(self, sink: Tensor | None) -> Tensor | None:
        return None if sink is None else self.standardize_target(sink.to(self.target_mean))

    def _output(self, x0_hat: Tensor, sink: Tensor | None) -> Tensor:
        """De-standardised x̂₀, with the given sink itself at position 0 (de-standardising its
        standardised copy would round it)."""
        states = self.destandardize_target(x0_hat)
        return states if sink is None else hold_sink(states, sink.to(states))


class RegressorBridge(DihalBridge):
    """The non-diffusion control: DiHAL's network trained at t = 1 only, where x_1 = c exactly,
    and sampled in one step, x̂₀ = f(c, 1, c) (docs/method.md#bridge).

    ``sigma``, ``steps`` and ``sampler`` are DiHAL's diffusion options, accepted so that one
    suite's bridge options build both bridges; a regressor has no noise and takes one step from
    t = 1 to 0, where every sampler returns x̂₀, so they are not kept (``config`` omits them).
    """

    def __init__(
        self,
        width: int,
        d_model: int = 256,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
        max_len: int = 512,
        sigma: float | None = None,
        steps: int | None = None,
        sampler: str | None = None,
    ):
        super().__init__(width, d_model=d_model, layers=layers, heads=heads, sigma=0.0, steps=1,
                         dropout=dropout, max_len=max_len)

    def config(self) -> dict:
        return {key: value for key, value in super().config().items() if key not in ("sigma", "steps", "sampler")}

    def training_times(self, n: int, generator: torch.Generator, like: Tensor) -> Tensor:
        return torch.ones(n, device=like.device, dtype=like.dtype)

    def _check_steps(self, steps: int | None) -> int:
        if steps not in (None, 1):
            raise DihalError(f"the regressor bridge samples in one step, got steps={steps}")
        return 1


class BridgeSampleCache(SampleCache):
    """The DiHAL bridge's incremental-sampling state: per sampling step k (1..K) and block,
    the attention keys and values of the positions seen so far; per step, the time
    embedding (computed on the first call, for the batch it fixes); the update rule and the
    position-keyed noise, fixed when the cache is made."""

    def __init__(self, steps: int, layers: int, max_len: int, sink: Tensor | None = None, *,
                 sampler: str = "mean", noise: PositionNoise | None = None):
        super().__init__(steps, sink)
        self.sampler, self.noise = sampler, noise or PositionNoise(0)
        self.keys_values = {k: [KeyValues(max_len) for _ in range(layers)] for k in range(1, steps + 1)}
        self.time: dict[int, Tensor] | None = None
        self.batch: int | None = None


class KeyValues:
    """One attention layer's keys and values, (n, heads, T, head_dim) each, for the positions
    seen so far. The storage doubles when full (up to ``max_len`` positions), so appending a
    position copies O(1) entries on average, not the whole prefix as a concatenation would."""

    def __init__(self, max_len: int):
        self.max_len, self.length = max_len, 0
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def extend(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append (n, heads, T_new, head_dim) keys and values; all of them so far, as views."""
        end = self.length + keys.shape[2]
        if self.keys is None or end > self.keys.shape[2]:
            capacity = max(end, min(2 * self.length, self.max_len))
            self.keys, self.values = (self._grown(old, new, capacity)
                                      for old, new in ((self.keys, keys), (self.values, values)))
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _grown(self, old: Tensor | None, like: Tensor, capacity: int) -> Tensor:
        storage = like.new_empty(*like.shape[:2], capacity, like.shape[3])
        if old is not None:
            storage[:, :, : self.length] = old[:, :, : self.length]
        return storage


def cached_block(block: Block, h: Tensor, keys_values: KeyValues, start: int) -> Tensor:
    """``block(h)`` for the positions start.. of a sequence whose earlier positions' keys and
    values ``keys_values`` holds (and is extended with the new ones): the same operations as
    ``Block.forward`` without cross-attention, with causal attention offset by ``start``."""
    n, length, d_model = h.shape
    heads = block.heads
    q, k, v = block.qkv(block.attn_norm(h)).split(d_model, dim=-1)
    q, k, v = (x.reshape(n, length, heads, d_model // heads).transpose(1, 2) for x in (q, k, v))
    keys, values = keys_values.extend(k, v)
    dropout = block.dropout if block.training else 0.0
    if start == 0:  # no earlier positions: exactly the uncached call
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, dropout_p=dropout)
    else:  # new query i sits at position start + i and sees keys 0..start + i; a single query sees all
        mask = (None if length == 1
                else torch.ones(length, start + length, dtype=torch.bool, device=h.device).tril(start))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout)
    h = h + block.resid_dropout(block.attn_out(out.transpose(1, 2).reshape(n, length, d_model)))
    return h + block.mlp(block.mlp_norm(h))


@hookimpl
def register_bridges(register):
    register(
        "dihal-bridge",
        DihalBridge,
        description="DiHAL Brownian bridge from token embeddings to h_l, causal transformer x0-denoiser",
    )
    register(
        "regressor",
        RegressorBridge,
        description="the dihal-bridge network trained as a one-step regressor h_0 -> h_l (no diffusion control)",
    )
