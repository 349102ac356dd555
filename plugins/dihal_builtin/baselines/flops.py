"""The built-in baselines' FLOP accounts (``Baseline.flop_account``), in the dense-transformer
count of ``dihal_bench.api.flops`` (docs/method.md#counting-compute).

Each account rebuilds the width a baseline chose from the parameters the run recorded (it sized
its width to the allowance), and counts what its ``loss`` and ``sample`` run: the matmuls of
every module a step passes through and attention over the keys each call sees. Attention is
counted over every key a call computes scores for (a bidirectional or masked call computes all of
them), a cached decoder over the keys it has so far.
"""

from __future__ import annotations

import dataclasses

from dihal_bench.api.flops import (
    FROZEN_THROUGH,
    TRAINED,
    BackboneFlops,
    FlopAccount,
    MethodWork,
    attention,
    width_for,
)


def settings(options_class, work: MethodWork):
    """The method's options: its defaults, overridden by those the work names."""
    known = {f.name for f in dataclasses.fields(options_class)}
    return options_class(**{k: v for k, v in work.options.items() if k in known})


def vocabulary(work: MethodWork) -> int:
    return int(work.sampling.get("vocabulary_size") or work.backbone.vocab or 0)


# -- the modules' shapes -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stack:
    """A transformer stack's per-position matmul weights (``matmul``), the weights run once per
    call whatever its length (``per_call``), its depth and width."""

    matmul: float
    layers: int
    width: int
    per_call: float = 0.0

    def call(self, positions: float, keys: float) -> float:
        """Forward FLOPs of one call over ``positions`` positions, each attending ``keys`` keys."""
        return positions * (2.0 * self.matmul + attention(self.layers, self.width, keys)) + 2.0 * self.per_call


def denoiser(total: int, d_in: int, d_out: int, layers: int, max_len: int, learned_positions: bool = True) -> Stack:
    """``common.Denoiser`` of ``total`` parameters: in and out projections and the blocks per
    position, the time MLP once per sequence."""

    def parameters(d: int) -> int:
        return (d_in * d + d + 2 * (d * d + d) + (max_len * d if learned_positions else 0)
                + layers * (12 * d * d + 13 * d) + 2 * d + d * d_out + d_out)

    d = width_for(total, parameters)
    return Stack(d_in * d + layers * 12 * d * d + d * d_out, layers, d, per_call=2 * d * d)


def token_decoder_call(d: int, layers: int, width: int, memory: int, memory_dim: int, positions: int) -> float:
    """One ``common.TokenDecoder`` forward over ``positions`` positions (the start vector and the
    previous tokens, all of them computed) against a memory of ``memory`` vectors: the token
    projection, self- and cross-attention blocks, the memory's projection and keys/values."""
    per_position = width * d + layers * 14 * d * d
    per_memory = memory_dim * d + layers * 2 * d * d
    scores = attention(layers, d, positions) + attention(layers, d, memory)
    return positions * (2.0 * per_position + scores) + 2.0 * memory * per_memory


def sampled_softmax(d: int, width: int, vocab: int, work: MethodWork) -> float:
    """``common.sampled_cross_entropy`` in a step, forward: the scored rows (the batch's distinct
    targets, at most all of them, plus ``negatives``) projected by out_proj, and each position's
    logits over them."""
    rows = min(vocab, work.batch_size * work.seq_len + work.sampling.get("negatives", 1024))
    return 2.0 * rows * width * d + 2.0 * work.batch_size * work.seq_len * rows * d


def decoder_generation(d: int, layers: int, width: int, memory: int, memory_dim: int, vocab: int,
                       length: int, batch: int) -> float:
    """``TokenDecoder.generate`` per generated token: the whole prefix re-run at each position (no
    cache), the last position's logits over the vocabulary, and out_proj of the table once a batch."""
    calls = sum(token_decoder_call(d, layers, width, memory, memory_dim, k) for k in range(1, length + 1))
    return (calls + length * 2.0 * d * vocab + 2.0 * vocab * width * d / batch) / length


# -- the accounts ----------------------------------------------------------------------------------


def ar_backbone(work: MethodWork) -> dict:
    backbone, T = work.backbone, work.sample_len
    return {"train": 0.0, "inference": backbone.forward((T + 1) / 2),
            "counted": "nothing trained; sampling: one cached backbone forward per token"}


def lora_train_token(backbone: BackboneFlops, adapters: int, positions_per_token: float, keys: float,
                     head_share: float) -> float:
    """Per trained token of a LoRA rival: the frozen layers forward and their input gradients, the
    attention scores forward and backward, the adapters trained, the frozen head on ``head_share``
    of the positions forward and input-gradient."""
    layers = FROZEN_THROUGH * 2.0 * backbone.layers * backbone.layer
    scores = TRAINED * attention(backbone.layers, backbone.width, keys)
    head = head_share * FROZEN_THROUGH * backbone.head_forward()
    return positions_per_token * (layers + scores + TRAINED * 2.0 * adapters) + head


def ar_lora(work: MethodWork) -> dict:
    backbone, T, adapters = work.backbone, work.sample_len, sum(work.parameters.values())
    train = work.tokens * lora_train_token(backbone, adapters, 1.0, work.seq_len, 1.0)
    return {"train": train, "inference": backbone.forward((T + 1) / 2) + 2.0 * adapters,
            "counted": "training: every token through the frozen backbone forward and back to the adapters "
                       "(input gradients of frozen matmuls, 2x forward), adapters 3x; sampling: cached, one "
                       "backbone forward with adapters per token"}


def ar2diff_lora(work: MethodWork) -> dict:
    backbone, adapters = work.backbone, sum(work.parameters.values())
    T, L = work.seq_len, work.sample_len
    # the start token is a position too; the head reads the masked positions only (half, on average)
    train = work.tokens * lora_train_token(backbone, adapters, (T + 1) / T, T + 1, 0.5)
    steps = int(work.sampling.get("steps", 50))
    calls = len({L * k // steps for k in range(1, steps + 1)} - {0})
    per_call = (L + 1) * (backbone.layers_forward(backbone.layers, L + 1) + 2.0 * adapters)
    return {"train": train, "inference": (calls * per_call + L * backbone.head_forward()) / L,
            "counted": f"training as ar-lora over T+1 positions, the head on the masked half; sampling: "
                       f"{calls} uncached backbone passes over T+1 positions per sample, the head once a token"}


def ar_scratch(work: MethodWork, options) -> dict:
    V, T = vocabulary(work), work.sample_len
    max_len = options.max_len or work.seq_len
    layers = options.layers

    def parameters(d: int) -> int:
        return V * d + d + max_len * d + layers * (12 * d * d + 13 * d) + 2 * d

    d = width_for(work.parameters.get("decoder", 0), parameters)
    stack = Stack(layers * 12 * d * d + V * d, layers, d)  # the tied head is a matmul
    return {"train": TRAINED * work.tokens * stack.call(1, work.seq_len),
            "inference": stack.call(1, (T + 1) / 2),
            "counted": "training 3x forward over T positions; sampling: cached, one position per token"}


def mdlm(work: MethodWork, options, t_min: float, batch: int) -> dict:
    V, T = vocabulary(work), work.sample_len
    rotary = options.positions == "rotary"
    max_len = options.max_len or work.seq_len

    def parameters(d: int) -> int:
        return (V + 1) * d + (0 if rotary else max_len * d) + options.layers * (12 * d * d + 13 * d) + 2 * d

    d = width_for(work.parameters.get("denoiser", 0), parameters)
    stack = Stack(options.layers * 12 * d * d + V * d, options.layers, d)
    steps = int(work.sampling.get("steps", options.steps))
    # the denoiser runs in a step where any of the batch's positions unmasks (caching), and once more
    # where any is still masked at the end
    positions = batch * T
    share = (1.0 - t_min) / steps
    calls = steps * (1.0 - (1.0 - share) ** positions) + 1.0 - (1.0 - t_min) ** positions
    return {"train": TRAINED * work.tokens * stack.call(1, work.seq_len),
            "inference": calls * stack.call(1, T),
            "counted": f"training 3x forward; sampling: {calls:.1f} expected denoiser calls over the whole "
                       f"sequence (a call only where a position of the batch of {batch} unmasks)"}


def continuous(work: MethodWork, options, *, d_in_factor: int, table_role: str, self_condition: float,
               readout_trained: int, clamp_steps: bool) -> dict:
    """Diffusion-LM and SED: a denoiser over every position, the rounding/readout cross-entropy on
    ``rounding_tokens`` positions a step, the readout (and clamping) over the compact table."""
    V, T, e = vocabulary(work), work.sample_len, options.embed_dim
    max_len = options.max_len or work.seq_len
    stack = denoiser(work.parameters.get("denoiser", 0), d_in_factor * e, e, options.layers, max_len,
                     options.positions != "rotary")
    per_sequence = stack.call(work.seq_len, work.seq_len)
    sequences = work.steps * work.batch_size
    readout = work.steps * options.rounding_tokens * 2.0 * V * e
    train = sequences * (TRAINED + self_condition) * per_sequence + readout_trained * readout
    steps = int(work.sampling.get("steps", options.steps))
    per_sample = steps * (stack.call(T, T) + (T * 2.0 * V * e if clamp_steps else 0.0)) + T * 2.0 * V * e
    return {"train": train, "inference": per_sample / T,
            "counted": f"training 3x forward of the denoiser (+{self_condition:g} no-grad self-conditioning pass), "
                       f"the {table_role} cross-entropy on {options.rounding_tokens} positions a step; sampling: "
                       f"{steps} denoiser calls over the sequence" + (", each clamped to the table" if clamp_steps else "")
                       + ", the readout once"}


def codar(work: MethodWork, options, noise_input: bool) -> dict:
    V, T, e, width = vocabulary(work), work.sample_len, options.embed_dim, work.backbone.width
    max_len = options.max_len or work.seq_len
    stack = denoiser(work.parameters.get("denoiser", 0), e, e, options.denoiser_layers, max_len)

    def decoder_parameters(d: int) -> int:
        block = 16 * d * d + 19 * d  # self and cross attention, the MLP, three norms
        return width * d + d + d + max_len * d + e * d + d + max_len * d + options.decoder_layers * block + 2 * d + width * d

    d = width_for(work.parameters.get("decoder", 0), decoder_parameters)
    sequences = work.steps * work.batch_size
    decoder_step = (work.batch_size * token_decoder_call(d, options.decoder_layers, width, max_len, e, work.seq_len)
                    + sampled_softmax(d, width, V, work.replace(sampling={**work.sampling, "negatives": options.negatives})))
    train = TRAINED * (sequences * stack.call(work.seq_len, work.seq_len) + work.steps * decoder_step)
    steps = 0 if noise_input else int(work.sampling.get("steps", options.steps))
    batch = int(work.sampling.get("batch_size", 32))
    inference = (steps * stack.call(T, T) / T
                 + decoder_generation(d, options.decoder_layers, width, T, e, V, T, batch))
    return {"train": train, "inference": inference,
            "counted": f"training 3x forward of denoiser and decoder (sampled softmax included); sampling: {steps} "
                       "denoiser calls over the sequence, then the decoder re-run over the prefix at each token"}


def ld4lg(work: MethodWork, options, noise_input: bool) -> dict:
    backbone, V, T, width = work.backbone, vocabulary(work), work.sample_len, work.backbone.width
    M, ld = options.latents, options.latent_dim
    max_len = options.max_len or work.seq_len
    total = sum(work.parameters.values())

    def parameters(d: int) -> int:
        compressor = (width * d + d + max_len * d + M * d + options.compressor_layers * (16 * d * d + 19 * d)
                      + 2 * d + d * ld + ld)
        decoder = (width * d + 2 * d + max_len * d + ld * d + d + M * d + options.decoder_layers * (16 * d * d + 19 * d)
                   + 2 * d + width * d)
        den = (2 * ld * d + d + 2 * (d * d + d) + max_len * d + options.denoiser_layers * (12 * d * d + 13 * d)
               + 2 * d + d * ld + ld)
        return compressor + decoder + den

    d = width_for(total, parameters)
    den = Stack(2 * ld * d + options.denoiser_layers * 12 * d * d + d * ld, options.denoiser_layers, d, per_call=2 * d * d)
    # the compressor: features in per position, the latent queries through cross-attending blocks
    compress = (work.seq_len * (2.0 * width * d + options.compressor_layers * 2.0 * 2 * d * d)
                + M * (options.compressor_layers * (2.0 * 14 * d * d + attention(1, d, M) + attention(1, d, work.seq_len))
                       + 2.0 * d * ld))
    layer = options.feature_layer
    features = work.distinct_tokens * (backbone.layers_forward(backbone.layers if layer is None else layer, work.seq_len))
    first = min(max(round(options.autoencoder_fraction * work.steps), 1), work.steps - 1)
    second = work.steps - first
    decoder_step = (work.batch_size * token_decoder_call(d, options.decoder_layers, width, M, ld, work.seq_len)
                    + sampled_softmax(d, width, V, work.replace(sampling={**work.sampling, "negatives": options.negatives})))
    train = (features + TRAINED * first * (work.batch_size * compress + decoder_step)
             + second * work.batch_size * (compress + (TRAINED + 1) * den.call(M, M)))
    steps = 0 if noise_input else int(work.sampling.get("steps", options.steps))
    batch = int(work.sampling.get("batch_size", 32))
    inference = steps * den.call(M, M) / T + decoder_generation(d, options.decoder_layers, width, M, ld, V, T, batch)
    return {"train": train, "inference": inference,
            "counted": "training: the frozen backbone's features of every distinct window once, the autoencoder "
                       "3x on its share of the steps, the latents encoded and the denoiser 3x (+1 self-conditioning "
                       f"pass) on the rest; sampling: {steps} denoiser calls over {M} latents, then the decoder "
                       "re-run over the prefix at each token"}


def account(parts: dict) -> FlopAccount:
    return FlopAccount(parts["train"], parts["inference"], parts["counted"])
