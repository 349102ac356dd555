"""A synthetic Markov language whose true distribution is known exactly, and the exact
posteriors of its tokens under Gaussian emissions (docs/known-answers.md).

The chain: V states, transition matrix P = Σₖ wₖ·Πₖ over K permutation matrices whose images
differ in every row. Each row of P is then a rearrangement of w, and each column too, so P is
doubly stochastic: the uniform law is stationary, a chain started uniformly is uniform at every
position, and the entropy rate is exactly H(w) = −Σₖ wₖ log wₖ, against a unigram floor of
log V. V − K of the V successors of every state are forbidden (P = 0).

Everything is float64, so the known answers hold to ~1e-12, far below any statistical
tolerance a test states.

The posterior: when each position i emits x_i ~ N(scale·e_{s_i} + offset_i, std²·I) from a
table row e_v, the exact marginals γ_i(v) = p(s_i = v | x_1..x_L) follow by forward–backward
(:meth:`MarkovChain.posterior`), and the clean row's posterior mean E[e_{s_i} | x] = Σ_v γ_i(v)·e_v
(:func:`oracle_x0`). One emission form covers a DDPM-style forward process (scale √ᾱ, no
offset, std √(1 − ᾱ)) and DiHAL's Brownian bridge (scale 1 − t, offset t·c, std
σ√(t(1 − t))): that is how the oracle denoisers of tests/test_oracle_samplers.py are built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from dihal_bench.errors import DihalError

#: the state of a word outside the chain's vocabulary: every transition into or out of it is forbidden
UNKNOWN = -1
#: ε of the smoothed chain P_ε = (1 − ε)·P + ε/V that scores samples: a forbidden transition
#: costs log(V/ε) nats (11.1 at V = 64), finite, so one stray word does not make a text's NLL infinite
DEFAULT_SMOOTHING = 1e-3
#: how far the weights may sum from 1 before they are refused (rounding in a typed "0.3/0.7" is far below)
WEIGHT_SUM_TOLERANCE = 1e-6


class MarkovChain:
    """The chain P = Σₖ wₖ·Πₖ on ``states`` states from ``len(weights)`` seeded permutations
    whose images differ in every row (module docstring; docs/known-answers.md#the-chain).

    The permutations are Πₖ(v) = β((α(v) + oₖ) mod V) for two seeded permutations α, β of the
    states and K distinct seeded offsets oₖ: for a fixed v the K images differ because the
    offsets do, and each Πₖ is a bijection as a composition of bijections.
    """

    def __init__(self, states: int, weights: Sequence[float], seed: int):
        self.states = _check_states_count(states)
        self.weights = _check_weights(weights, self.states)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DihalError(f"markov chain: seed must be an integer, got {seed!r}")
        self.seed = seed
        generator = torch.Generator().manual_seed(seed)
        relabel_in = torch.randperm(self.states, generator=generator)
        relabel_out = torch.randperm(self.states, generator=generator)
        offsets = torch.randperm(self.states, generator=generator)[: len(self.weights)]
        #: images[k, v] = Πₖ(v), (K, V) long
        self.images = relabel_out[(relabel_in[None, :] + offsets[:, None]) % self.states]
        rows = torch.arange(self.states).expand_as(self.images)
        self.transition = torch.zeros(self.states, self.states, dtype=torch.float64)
        self.transition[rows, self.images] = self.weights[:, None].expand_as(self.images)
        self.log_transition = self.transition.log()  # −inf where forbidden

    @property
    def entropy_rate(self) -> float:
        """H(w) in nats per token: the NLL per transition of the chain's own samples under P."""
        return float(-(self.weights * self.weights.log()).sum())

    @property
    def unigram_entropy(self) -> float:
        """log V, nats: the entropy of the stationary (uniform) law, what i.i.d. unigram text costs per token."""
        return math.log(self.states)

    # -- the chain's own samples ----------------------------------------------------------------
    def sample(self, n: int, length: int, generator: torch.Generator) -> Tensor:
        """(n, length) long states: the first uniform, each next one Π_k(previous) with k ~ w.

        Which permutation a step takes is independent of the state (every row of P is w
        rearranged), so the K choices of all steps are drawn at once and only the walk is a loop.
        """
        for name, value in (("n", n), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DihalError(f"markov sample: {name} must be a positive integer, got {value!r}")
        first = torch.randint(self.states, (n,), generator=generator)
        if length == 1:
            return first[:, None]
        choices = torch.multinomial(self.weights, n * (length - 1), replacement=True, generator=generator)
        return self.walk(first, choices.view(n, length - 1))

    def walk(self, first: Tensor, choices: Tensor) -> Tensor:
        """(n, m + 1) long: the walks from states ``first`` (n,) that take permutation
        ``choices[:, i]`` (n, m) at step i."""
        walk = torch.empty(len(first), choices.shape[1] + 1, dtype=torch.long)
        walk[:, 0] = first
        for i in range(choices.shape[1]):
            walk[:, i + 1] = self.images[choices[:, i], walk[:, i]]
        return walk

    # -- exact scores of any state sequence -----------------------------------------------------
    def transition_costs(self, states: Tensor, smoothing: float = DEFAULT_SMOOTHING) -> Tensor:
        """(n, L − 1) float64: −log P_ε(s_{i+1} | s_i) of each transition under the smoothed chain
        P_ε = (1 − ε)·P + ε/V; a transition touching an ``UNKNOWN`` state costs log(V/ε)."""
        states = self._check_state_sequences(states)
        _check_smoothing(smoothing)
        smoothed = (1 - smoothing) * self.transition + smoothing / self.states
        source, target = states[:, :-1], states[:, 1:]
        known = (source != UNKNOWN) & (target != UNKNOWN)
        costs = torch.full(source.shape, math.log(self.states / smoothing), dtype=torch.float64)
        costs[known] = -smoothed[source[known], target[known]].log()
        return costs

    def nll_per_token(self, states: Tensor, smoothing: float = DEFAULT_SMOOTHING) -> Tensor:
        """(n,) float64: each sequence's mean NLL per transition under P_ε (the first state, log V
        for any known one, is left out, so the chain's own samples average the entropy rate)."""
        return self.transition_costs(states, smoothing).mean(dim=1)

    def expected_nll(self, smoothing: float = DEFAULT_SMOOTHING) -> float:
        """E[NLL per transition] of the chain's own samples under P_ε: Σₖ wₖ·−log((1 − ε)wₖ + ε/V),
        → H(w) as ε → 0."""
        _check_smoothing(smoothing)
        return float(-(self.weights * ((1 - smoothing) * self.weights + smoothing / self.states).log()).sum())

    def expected_unigram_nll(self, smoothing: float = DEFAULT_SMOOTHING) -> float:
        """E[NLL per transition] of i.i.d. uniform states under P_ε: each successor is one of the K
        allowed ones with probability 1/V each, else forbidden."""
        _check_smoothing(smoothing)
        allowed = -((1 - smoothing) * self.weights + smoothing / self.states).log().sum()
        forbidden = (self.states - len(self.weights)) * math.log(self.states / smoothing)
        return float((allowed + forbidden) / self.states)

    def forbidden_rate(self, states: Tensor) -> float:
        """The share of all transitions (over every sequence) with P = 0 or an ``UNKNOWN`` end:
        0 for the chain's own samples, 1 − K/V in expectation for i.i.d. uniform ones."""
        source, target = self._transitions(states)
        known = (source != UNKNOWN) & (target != UNKNOWN)
        allowed = torch.zeros_like(known)
        allowed[known] = self.transition[source[known], target[known]] > 0
        return float(1 - allowed.double().mean())

    def bigram_tv(self, states: Tensor) -> float:
        """Total variation ½·Σ_{a,b} |f(a, b) − π(a)P(a, b)| between the empirical frequencies f of
        all transitions and the chain's stationary bigram law π⊗P (π uniform). Transitions
        touching an ``UNKNOWN`` state fall in one extra cell where π⊗P has no mass."""
        source, target = self._transitions(states)
        outside = self.states  # the cell of every transition with an unknown end
        cell = torch.where((source == UNKNOWN) | (target == UNKNOWN), outside * (self.states + 1) + outside,
                           source * (self.states + 1) + target)
        width = self.states + 1
        frequencies = torch.bincount(cell.flatten(), minlength=width * width).double() / cell.numel()
        law = torch.zeros(width, width, dtype=torch.float64)
        law[: self.states, : self.states] = self.transition / self.states
        return float(0.5 * (frequencies - law.flatten()).abs().sum())

    # -- the exact posterior ----------------------------------------------------------------------
    def posterior(self, log_likelihood: Tensor) -> Tensor:
        """(n, L, V) float64 marginals γ_i(v) = p(s_i = v | x) of a chain started uniformly, given
        per-position emission log-likelihoods log p(x_i | s_i = v) (n, L, V), each known up to
        a constant per (sequence, position). Forward–backward in log space, each message
        renormalised so that long sequences keep their precision."""
        if log_likelihood.dim() != 3 or log_likelihood.shape[-1] != self.states:
            raise DihalError(f"markov posterior: log-likelihoods must have shape (n, L, {self.states}), "
                             f"got {tuple(log_likelihood.shape)}")
        evidence = log_likelihood.to(torch.float64)
        if torch.isnan(evidence).any() or torch.isposinf(evidence).any():
            raise DihalError("markov posterior: the log-likelihoods hold NaN or +inf")
        length, log_transition = evidence.shape[1], self.log_transition.to(evidence.device)
        forward = [torch.log_softmax(evidence[:, 0], dim=-1)]  # the uniform prior is a constant
        for i in range(1, length):
            message = torch.logsumexp(forward[-1][:, :, None] + log_transition[None], dim=1)
            forward.append(torch.log_softmax(message + evidence[:, i], dim=-1))
        backward = [torch.zeros_like(forward[0])]
        for i in range(length - 2, -1, -1):
            message = torch.logsumexp(log_transition[None] + (evidence[:, i + 1] + backward[0])[:, None, :], dim=2)
            backward.insert(0, message - torch.logsumexp(message, dim=-1, keepdim=True))
        return torch.softmax(torch.stack(forward, dim=1) + torch.stack(backward, dim=1), dim=-1)

    # -- checks -----------------------------------------------------------------------------------
    def _check_state_sequences(self, states: Tensor) -> Tensor:
        if not isinstance(states, Tensor) or states.dim() != 2 or states.dtype not in (torch.int32, torch.int64):
            raise DihalError("markov chain: states must be an (n, L) integer tensor")
        if states.shape[1] < 2 or states.shape[0] < 1:
            raise DihalError(f"markov chain: need at least one sequence of 2 or more states, "
                             f"got shape {tuple(states.shape)}")
        states = states.long().cpu()
        if states.min() < UNKNOWN or states.max() >= self.states:
            raise DihalError(f"markov chain: states must lie in 0..{self.states - 1} (or {UNKNOWN} for unknown), "
                             f"got {int(states.min())}..{int(states.max())}")
        return states

    def _transitions(self, states: Tensor) -> tuple[Tensor, Tensor]:
        states = self._check_state_sequences(states)
        return states[:, :-1], states[:, 1:]


def _check_states_count(states: int) -> int:
    if isinstance(states, bool) or not isinstance(states, int) or states < 2:
        raise DihalError(f"markov chain: states must be an integer >= 2, got {states!r}")
    return states


def _check_weights(weights: Sequence[float], states: int) -> Tensor:
    try:
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise DihalError(f"markov chain: weights must be a sequence of numbers, got {weights!r}") from None
    if not 1 <= len(values) <= states:
        raise DihalError(f"markov chain: needs 1 to {states} weights (one per permutation), got {len(values)}")
    if not all(math.isfinite(w) and w > 0 for w in values):
        raise DihalError(f"markov chain: every weight must be positive and finite, got {values}")
    if abs(sum(values) - 1) > WEIGHT_SUM_TOLERANCE:
        raise DihalError(f"markov chain: weights must sum to 1, got {values} (sum {sum(values):.6g})")
    tensor = torch.tensor(values, dtype=torch.float64)
    return tensor / tensor.sum()  # rows of P then sum to 1 to float64 rounding


def _check_smoothing(smoothing: float) -> None:
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 < smoothing < 1:
        raise DihalError(f"markov chain: smoothing must be a number in (0, 1), got {smoothing!r}")


# -- Gaussian emissions and the oracle denoiser --------------------------------------------------


def gaussian_log_likelihood(x: Tensor, table: Tensor, scale: float | Tensor, offset: Tensor | None,
                            std: float | Tensor) -> Tensor:
    """(n, L, V) float64: log N(x_i; scale·e_v + offset_i, std²·I) for each row e_v of ``table``
    (V, d), up to a constant per (sequence, position), which the posterior ignores.

    Expanding the square leaves (scale/std²)·(x_i − offset_i)·e_v − ½(scale²/std²)·‖e_v‖².
    ``x`` is (n, L, d); ``scale`` and ``std`` are numbers or (n,) tensors (one time per
    sequence); ``offset`` is None or (n, L, d). Where scale = 0 the observation says nothing
    about the token (DiHAL's bridge at t = 1 sits on its condition) and the log-likelihood is
    0 whatever std is; std = 0 with scale ≠ 0 is a point mass and refused.
    """
    if x.dim() != 3 or table.dim() != 2 or x.shape[-1] != table.shape[-1]:
        raise DihalError(f"gaussian log-likelihood: x must be (n, L, d) and table (V, d), "
                         f"got {tuple(x.shape)} and {tuple(table.shape)}")
    n = x.shape[0]
    scale, std = _per_sequence(scale, n, "scale", x.device), _per_sequence(std, n, "std", x.device)
    if (std < 0).any() or ((std == 0) & (scale != 0)).any():
        raise DihalError("gaussian log-likelihood: std must be positive wherever scale is not 0")
    informative = scale != 0
    safe_std = torch.where(informative, std, torch.ones_like(std))
    gain = torch.where(informative, scale / safe_std**2, torch.zeros_like(scale))[:, None, None]
    observed = x.to(torch.float64)
    if offset is not None:
        if offset.shape != x.shape:
            raise DihalError(f"gaussian log-likelihood: offset must have x's shape {tuple(x.shape)}, "
                             f"got {tuple(offset.shape)}")
        observed = observed - offset.to(torch.float64)
    rows = table.to(torch.float64)
    return gain * (observed @ rows.T) - 0.5 * gain * scale[:, None, None] * rows.pow(2).sum(-1)


def oracle_x0(chain: MarkovChain, table: Tensor, x: Tensor, scale: float | Tensor, offset: Tensor | None,
              std: float | Tensor) -> Tensor:
    """E[e_{s_i} | x] = Σ_v γ_i(v)·e_v, (n, L, d) in x's dtype: the exact x₀-prediction of a
    denoiser whose data are the chain's sequences written as rows of ``table``, observed through
    the emission of :func:`gaussian_log_likelihood`."""
    gamma = chain.posterior(gaussian_log_likelihood(x, table, scale, offset, std))
    return (gamma @ table.to(torch.float64)).to(x.dtype)


def ddpm_oracle(chain: MarkovChain, table: Tensor,
                alpha_bar: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``predict_x0(x_t, t, previous)`` for ``schedules.reverse_chain``: the oracle under
    x_t = √ᾱ(t)·e_s + √(1 − ᾱ(t))·ε; the previous estimate (self-conditioning) is not needed."""

    def predict_x0(x_t: Tensor, t: Tensor, previous: Tensor) -> Tensor:
        alpha = alpha_bar(t).to(torch.float64)
        return oracle_x0(chain, table, x_t, alpha.sqrt(), None, (1 - alpha).sqrt())

    return predict_x0


def bridge_oracle(chain: MarkovChain, table: Tensor, sigma: float) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``denoise(x_t, t, c)`` with the signature of ``DihalBridge.denoise``: the oracle under
    DiHAL's Brownian bridge x_t = (1 − t)·e_s + t·c + σ√(t(1 − t))·ε (docs/method.md#bridge),
    x₀ the chain's rows and c the (standardised) condition. Setting a bridge's ``denoise`` to it
    runs that bridge's own sampler with the exact x̂₀."""
    if not (isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and sigma > 0):
        raise DihalError(f"bridge oracle: sigma must be a positive number, got {sigma!r}")

    def denoise(x_t: Tensor, t: Tensor, c: Tensor) -> Tensor:
        t = t.to(torch.float64)
        return oracle_x0(chain, table, x_t, 1 - t, t[:, None, None] * c.to(torch.float64),
                         sigma * (t * (1 - t)).sqrt())

    return denoise


def _per_sequence(value: float | Tensor, n: int, name: str, device: torch.device) -> Tensor:
    """A number or an (n,) tensor as an (n,) float64 tensor on ``device``."""
    tensor = torch.as_tensor(value, dtype=torch.float64).to(device)
    if tensor.dim() == 0:
        return tensor.expand(n).clone()
    if tensor.shape != (n,):
        raise DihalError(f"gaussian log-likelihood: {name} must be a number or have shape ({n},), "
                         f"got {tuple(tensor.shape)}")
    return tensor
