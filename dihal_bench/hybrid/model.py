"""The DiHAL hybrid LM (docs/method.md#hybrid): bridge → layers ℓ+1..L → final norm → LM head.

The bridge stands in for the backbone's layers 1..ℓ: from the embedding output h_0 it
predicts ĥ_ℓ, and the frozen backbone resumes from there. Because the bridge is causal in
positions, the hybrid is an ordinary next-token model: it has teacher-forced logits and can
generate autoregressively, keeping a key/value cache for the upper layers and, where the
bridge samples incrementally (``HiddenStateBridge.new_sample_cache``), the bridge's own
cache, so that each new token costs the bridge one position, not the whole prefix.

Position 0 needs no bridge: under causal attention its hidden state depends on its own token
only, so running the lower layers on that single token gives h_ℓ[0] exactly ("sink
passthrough"; the first position is the attention sink whose huge activations a bridge
would otherwise have to learn). The bridge is given that exact state too, to condition the
other positions on, as it was in training (``HiddenStateBridge.sample``'s ``sink``).

Generation starts from one token, :func:`start_token_id`, the same for every autoregressive
method; the bridge's training windows start with it too (``bridge_training.bridge_windows``).

A bridge whose sampler draws noise (``HybridLM(sampler=...)``, docs/method.md#bridge) is
given a generator seeded with ``noise_seed``: the teacher-forced logits are then a function of
the token ids, and in generation each batch of sequences gets a noise seed of its own, drawn
from the run's seed. Such a bridge keys its noise by position, so the cached and the uncached
decode see the same noise.

Controls use the same class with a stand-in bridge: :class:`SkipBridge` feeds h_0 straight
to the upper layers (layers 1..ℓ deleted), and at ℓ = 0 it gives the intact backbone with
the same cached decode loop; :class:`OracleBridge` feeds the backbone's true h_ℓ, so the
hybrid must reproduce the backbone (a test of the plumbing, not a method).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.bridge import HiddenStateBridge, SampleCache, hold_sink
from dihal_bench.api.sampling import check_sampling, sample_next_token, special_ids
from dihal_bench.errors import DihalError


def start_token_id(tokenizer) -> int:
    """The token every autoregressive method starts from: BOS, else EOS."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise DihalError("the tokenizer has neither a BOS nor an EOS token to start from")
    return start


class LowerStack(Protocol):
    """What stands in for layers 1..ℓ: maps h_0 (n, T, d) to ĥ_ℓ (n, T, d), causally, given
    the exact h_ℓ at position 0 as ``sink`` (n, 1, d) with sink passthrough, else None.
    Every :class:`HiddenStateBridge` is one.

    It may also sample incrementally, with ``new_sample_cache(steps, sink)`` and
    ``sample_step(cond_new, cache)`` as in :class:`HiddenStateBridge`; one without them (or
    whose ``new_sample_cache`` returns None) is re-sampled over the whole prefix per token.
    Only a :class:`HiddenStateBridge` is also given ``generator`` (and ``sampler``, where the
    hybrid has one): :meth:`HybridLM.sampling_options`.
    """

    def sample(self, cond: Tensor, steps: int | None = None, *, sink: Tensor | None = None) -> Tensor: ...


class SkipBridge:
    """The 'skip' control: ĥ_ℓ := h_0, as if layers 1..ℓ were simply deleted (the sink, where
    given, is put at position 0 by the hybrid)."""

    def sample(self, cond: Tensor, steps: int | None = None, *, sink: Tensor | None = None) -> Tensor:
        return cond

    def new_sample_cache(self, steps: int | None = None, sink: Tensor | None = None) -> SampleCache:
        return SampleCache(steps=0, sink=sink)

    def sample_step(self, cond_new: Tensor, cache: SampleCache) -> Tensor:
        cache.advance(cond_new.shape[1])
        return cond_new


class OracleBridge:
    """ĥ_ℓ := the backbone's own h_ℓ, so that the hybrid reproduces the backbone.

    The condition carries no token ids, so they are recovered by finding each h_0 vector's
    row in the table of all embedding outputs; that lookup is exact only where the rows are
    distinct, which is checked.
    """

    def __init__(self, backbone: Backbone, layer: int):
        self.backbone, self.layer = backbone, layer
        vocabulary = torch.arange(backbone.vocab_size, device=backbone.device)
        self.table = backbone.embed(vocabulary[None])[0]  # (V, d)

    def sample(self, cond: Tensor, steps: int | None = None, *, sink: Tensor | None = None) -> Tensor:
        flat = cond.reshape(-1, cond.shape[-1]).to(self.table.device, self.table.dtype)
        ids = torch.cdist(flat, self.table).argmin(-1)
        if not torch.equal(self.table[ids], flat):
            raise DihalError(f"{self.backbone.name}: the oracle bridge cannot recover token ids from embeddings")
        return self.backbone.hidden_states(ids.view(cond.shape[:-1]))[self.layer]


class HybridLM:
    """Next-token model ``lower stack → backbone layers layer+1..L → norm → head``.

    ``steps`` and ``sampler`` override the bridge's default number of sampling steps and its
    update rule (a ``sampler`` is passed on only when given: bridges other than DiHAL's may
    have none); ``noise_seed`` seeds a :class:`HiddenStateBridge`'s sampling noise. A bridge
    that is a module is put in eval mode. Inputs are token ids (B, T) without left padding: the
    bridge sees no attention mask, and a causal bridge is unaffected by padding on the right only.
    """

    def __init__(
        self,
        backbone: Backbone,
        bridge: LowerStack,
        layer: int,
        *,
        sink_passthrough: bool = True,
        steps: int | None = None,
        sampler: str | None = None,
        noise_seed: int = 0,
    ):
        if layer != 0:  # layer 0 with SkipBridge is the intact backbone (see intact_control)
            backbone.check_layer(layer)
        if isinstance(bridge, torch.nn.Module):
            bridge.eval()
        self.backbone, self.bridge, self.layer = backbone, bridge, layer
        self.sink_passthrough, self.steps = sink_passthrough, steps
        self.sampler, self.noise_seed = sampler, noise_seed

    # -- teacher forcing ----------------------------------------------------------------------
    @torch.no_grad()
    def condition(self, input_ids: Tensor) -> Tensor:
        """The bridge's condition h_0 (B, T, d), on the bridge's device and in its dtype."""
        return self._for_bridge(self.backbone.embed(input_ids))

    @torch.no_grad()
    def sink_state(self, input_ids: Tensor) -> Tensor:
        """The exact h_ℓ at position 0, (B, 1, d): layers 1..ℓ (only) run on the first token alone."""
        return self.backbone.hidden_states(input_ids[:, :1], up_to=self.layer)[self.layer]

    @torch.no_grad()
    def bridge_sink(self, input_ids: Tensor) -> Tensor | None:
        """What the bridge is given at position 0: with sink passthrough the exact
        :meth:`sink_state`, on the bridge's device and in its dtype; without, None."""
        return self._for_bridge(self.sink_state(input_ids)) if self.sink_passthrough else None

    @torch.no_grad()
    def bridged_states(self, input_ids: Tensor, sink: Tensor | None = None, *,
                       noise_seed: int | None = None) -> Tensor:
        """The bridge's ĥ_ℓ at every position, (B, T, d), in the bridge's dtype; with sink
        passthrough conditioned on the exact position-0 state, ``sink`` where the caller has
        :meth:`bridge_sink` already; sampling noise seeded with ``noise_seed`` (None: the hybrid's)."""
        if sink is None:
            sink = self.bridge_sink(input_ids)
        return self.bridge.sample(self.condition(input_ids), self.steps, sink=sink,
                                  **self.sampling_options(noise_seed))

    @torch.no_grad()
    def lower_states(self, input_ids: Tensor, *, noise_seed: int | None = None) -> Tensor:
        """ĥ_ℓ (B, T, d) that the upper layers receive: the bridge's, with position 0 exact
        when sink passthrough is on."""
        sink = self.bridge_sink(input_ids)
        states = self.bridged_states(input_ids, sink, noise_seed=noise_seed)
        return states if sink is None else hold_sink(states, sink.to(states))

    def sampling_options(self, noise_seed: int | None = None) -> dict:
        """What the bridge's ``sample`` and ``new_sample_cache`` are given beyond steps and sink:
        for a :class:`HiddenStateBridge` a generator seeded with ``noise_seed`` (None: the
        hybrid's), and the hybrid's ``sampler`` where it has one."""
        if not isinstance(self.bridge, HiddenStateBridge):
            return {}
        seed = self.noise_seed if noise_seed is None else noise_seed
        options = {"generator": torch.Generator().manual_seed(seed)}
        return options if self.sampler is None else {**options, "sampler": self.sampler}

    def _for_bridge(self, states: Tensor) -> Tensor:
        if isinstance(self.bridge, HiddenStateBridge):  # bridges keep their own dtype and device
            return states.to(self.bridge.target_mean.device, self.bridge.target_mean.dtype)
        return states

    @torch.no_grad()
    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
               noise_seed: int | None = None) -> Tensor:
        """Next-token logits (B, T, V) at every position (bridge noise seeded with
        ``noise_seed``; None: the hybrid's)."""
        return self.backbone.resume(self.lower_states(input_ids, noise_seed=noise_seed), self.layer, attention_mask)

    def decoder(self, *, use_cache: bool = True, noise_seed: int | None = None) -> IncrementalDecoder:
        """A fresh :class:`IncrementalDecoder`: next-token logits for sequences fed a few
        tokens at a time, the bridge's noise seeded with ``noise_seed`` (None: the hybrid's)."""
        return IncrementalDecoder(self, use_cache=use_cache, noise_seed=noise_seed)

    # -- generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        n: int,
        max_new_tokens: int,
        *,
        prompt_ids: Tensor | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        batch_size: int = 16,
        progress: bool = False,
        use_cache: bool = True,
    ) -> Tensor:
        """``n`` continuations of ``max_new_tokens`` tokens each, (n, max_new_tokens) on the CPU.

        Without ``prompt_ids`` every sample starts from the tokenizer's BOS token (EOS where
        there is none), which is not returned. ``prompt_ids`` is one prompt (P,) shared by all
        samples or one per sample (n, P). ``temperature`` 0 is greedy decoding; ``top_p`` < 1
        is nucleus sampling. No special token (BOS, EOS, padding...) is drawn: every method's
        samples are ``max_new_tokens`` tokens of text, as the diffusion baselines' are. One
        generator seeded with ``seed`` draws every token, and another one each batch's bridge
        noise seed, so the same seed and batch size give the same tokens. ``use_cache=False`` recomputes the full
        logits of the prefix at every step (a reference for the cached decode).
        """
        check_sampling(temperature, top_p)
        if max_new_tokens < 1:
            raise DihalError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        context = self.start_ids(n, prompt_ids)
        generator = torch.Generator(device=self.backbone.device).manual_seed(seed)
        # apart from the token generator, so that a noiseless bridge draws the tokens it always drew
        noise_seeds = torch.Generator().manual_seed(seed)
        banned = special_ids(self.backbone.tokenizer)
        samples = []
        for start in tqdm(range(0, n, batch_size), desc="hybrid generate", disable=not progress, leave=False):
            noise_seed = int(torch.randint(0, 2**62, (), generator=noise_seeds))
            decoder = self.decoder(use_cache=use_cache, noise_seed=noise_seed)
            logits = decoder.append(context[start : start + batch_size])[:, -1]
            tokens = [sample_next_token(logits, temperature, top_p, generator, banned=banned)]
            for _ in range(max_new_tokens - 1):
                logits = decoder.append(tokens[-1][:, None])[:, -1]
                tokens.append(sample_next_token(logits, temperature, top_p, generator, banned=banned))
            samples.append(torch.stack(tokens, dim=1).cpu())
        return torch.cat(samples)

    def start_ids(self, n: int, prompt_ids: Tensor | None = None) -> Tensor:
        """The token ids generation continues from, (n, P) on the backbone's device."""
        if prompt_ids is None:
            try:
                start = start_token_id(self.backbone.tokenizer)
            except DihalError as exc:
                raise DihalError(f"{self.backbone.name}: {exc}") from None
            return torch.full((n, 1), start, dtype=torch.long, device=self.backbone.device)
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.backbone.device)
        if prompt.dim() == 1:
            prompt = prompt.expand(n, -1)
        if prompt.dim() != 2 or prompt.shape[0] != n or prompt.shape[1] == 0:
            raise DihalError(f"prompt_ids must be (P,) or ({n}, P) with P ≥ 1, got shape {tuple(prompt.shape)}")
        return prompt


class IncrementalDecoder:
    """Next-token logits of one batch of sequences that grows a few tokens at a time, as in
    generation: :meth:`append` takes the new tokens and gives the logits at their positions.

    Cached (the default): the upper layers keep their key/value cache, and the bridge its
    sample cache where it has one; the sink state (sink passthrough) is computed once, from
    the first token, through layers 1..ℓ only, and the bridge's cache is made then, with it.
    A bridge without a sample cache is re-sampled over the whole prefix, which gives the same
    states at a cost that grows with it.
    Uncached (``use_cache=False``): the teacher-forced :meth:`HybridLM.logits` of the whole
    prefix at every call, the reference the cached path must equal up to float rounding.
    Both seed the bridge's noise with ``noise_seed`` (None: the hybrid's).
    """

    def __init__(self, hybrid: HybridLM, *, use_cache: bool = True, noise_seed: int | None = None):
        self.hybrid, self.use_cache = hybrid, use_cache
        self.noise_seed = hybrid.noise_seed if noise_seed is None else noise_seed
        self.length = 0  # tokens appended so far
        self.batch: int | None = None
        self.prefix: Tensor | None = None  # the tokens so far, where anything is recomputed from them
        self.upper_cache = hybrid.backbone.new_cache() if use_cache else None
        self.sink: Tensor | None = None  # the bridge's sink (sink passthrough), from the first token
        self.bridge_cache: SampleCache | None = None

    @torch.no_grad()
    def append(self, input_ids: Tensor) -> Tensor:
        """Logits (B, T_new, V) at the positions of ``input_ids`` (B, T_new), which follow
        the tokens appended before (same B every call)."""
        shape = tuple(input_ids.shape)
        if len(shape) != 2 or shape[1] == 0 or self.batch not in (None, shape[0]):
            raise DihalError(f"append takes token ids of shape ({self.batch or 'B'}, T) with T ≥ 1, got {shape}")
        hybrid, new = self.hybrid, input_ids.shape[1]
        input_ids = input_ids.to(hybrid.backbone.device)
        self.batch = input_ids.shape[0]
        if self.use_cache and self.length == 0:
            self._start(input_ids)
        if not self.use_cache or self.bridge_cache is None:
            self.prefix = input_ids if self.prefix is None else torch.cat([self.prefix, input_ids], dim=1)
        if not self.use_cache:
            self.length += new
            return hybrid.logits(self.prefix, noise_seed=self.noise_seed)[:, -new:]

        if self.bridge_cache is None:
            states = hybrid.bridged_states(self.prefix, self.sink, noise_seed=self.noise_seed)[:, -new:]
        else:
            states = hybrid.bridge.sample_step(hybrid.condition(input_ids), self.bridge_cache)
        if self.length == 0 and self.sink is not None:
            states = hold_sink(states, self.sink.to(states))
        logits = hybrid.backbone.resume(states, hybrid.layer, cache=self.upper_cache, position_offset=self.length)
        self.length += new
        return logits

    def _start(self, input_ids: Tensor) -> None:
        """At the first tokens: the sink state (with sink passthrough) and the bridge's sample
        cache, which holds it (None where the bridge samples whole sequences only)."""
        hybrid = self.hybrid
        self.sink = hybrid.bridge_sink(input_ids)
        new_sample_cache = getattr(hybrid.bridge, "new_sample_cache", None)
        self.bridge_cache = (new_sample_cache(hybrid.steps, self.sink, **hybrid.sampling_options(self.noise_seed))
                             if new_sample_cache else None)


def skip_control(backbone: Backbone, layer: int, *, sink_passthrough: bool = True) -> HybridLM:
    """The 'skip' control at ``layer``: the upper stack fed h_0 directly, no bridge. Sink
    passthrough defaults on, as for DiHAL, so that the two differ in the bridge alone."""
    return HybridLM(backbone, SkipBridge(), layer, sink_passthrough=sink_passthrough)


def intact_control(backbone: Backbone) -> HybridLM:
    """The intact backbone, resumed from h_0 through all L layers, with the same sampling
    and cached decode loop as the hybrids (for matched generation and latency)."""
    return HybridLM(backbone, SkipBridge(), 0, sink_passthrough=False)
