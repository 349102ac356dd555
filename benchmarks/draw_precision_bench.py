"""Whether drawing next tokens in float32 biases what is drawn, on distributions with a known answer.

Every row that samples autoregressively draws through ``dihal_bench.api.sampling.sample_next_token``:
a float32 softmax and ``torch.multinomial``, which for one draw per row races exponential variables in
the input's dtype. Zheng et al. (arXiv 2409.02908) found that float32 Gumbel-max draws in masked
diffusion under-sample the low-probability tokens and lower the samples' entropy. This measures the
project's sampler against the same draws made in float64, with float32 and float64 Gumbel-max beside
them, on Zipf distributions over SmolLM2's 49,152 tokens at the frontier's temperatures.

The known answer: for draws X from p, the mean surprisal −log p(X) (p in float64) is an unbiased
estimate of the entropy H(p), with standard error std(−log p(X))/√N; a sampler whose draws miss the
tail comes out below H. Also the share of draws from the tail (tokens of probability < 1e-6) against its
exact mass; and, drawing both from one random stream, the share of draws in which the project's float32
sampler picks another token than the same draw in float64. Run:
``python benchmarks/draw_precision_bench.py --json benchmarks/results/draw_precision.json``
(about 4 minutes on 2 cores; ``--quick`` checks that it runs). docs/method.md#sampling cites it.
"""

from __future__ import annotations

import math

import torch
from common import parser, report

from dihal_bench.api.sampling import sample_next_token

VOCABULARY = 49_152  # SmolLM2's
TAIL = 1e-6
#: (Zipf exponent, temperature): the suites' temperature 1 and the frontier's lowest, on a flat and a steep law
CASES = ((1.0, 1.0), (1.0, 0.7), (1.3, 1.0), (1.3, 0.7))
ROWS = 256  # rows per call, as a sampling batch draws them


def gumbel_max(logits: torch.Tensor, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    u = torch.rand(logits.shape, generator=generator, dtype=dtype).clamp_(min=torch.finfo(dtype).tiny)
    return (logits.to(dtype) - torch.log(-torch.log(u))).argmax(-1)


PROJECT, FLOAT64 = "sample_next_token (float32)", "multinomial, float64"
SAMPLERS = {
    PROJECT: lambda logits, g: sample_next_token(logits, 1.0, 1.0, g),
    FLOAT64: lambda logits, g: torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=g)[:, 0],
    "Gumbel-max, float32": lambda logits, g: gumbel_max(logits, g, torch.float32),
    "Gumbel-max, float64": lambda logits, g: gumbel_max(logits, g, torch.float64),
}


def case(exponent: float, temperature: float, draws: int, seed: int) -> dict:
    # the logits a model would hand the sampler: already divided by the temperature
    logits64 = -exponent * torch.log(torch.arange(1, VOCABULARY + 1, dtype=torch.float64)) / temperature
    log_p = torch.log_softmax(logits64, -1)
    entropy = float(-(log_p.exp() * log_p).sum())
    tail = log_p < math.log(TAIL)
    tail_mass = float(log_p[tail].exp().sum())
    batch = logits64.float().expand(ROWS, -1).contiguous()
    row = {"zipf_exponent": exponent, "temperature": temperature, "entropy": entropy, "tail_mass": tail_mass,
           "draws": draws}
    drawn = {}
    for name, draw in SAMPLERS.items():
        generator = torch.Generator().manual_seed(seed)
        drawn[name] = tokens = torch.cat([draw(batch, generator) for _ in range(draws // ROWS)])
        surprisal = -log_p[tokens]
        error = float(surprisal.std()) / math.sqrt(len(tokens))
        row[name] = {"entropy_estimate": float(surprisal.mean()), "standard_error": error,
                     "z": (float(surprisal.mean()) - entropy) / error,
                     "tail_share": float(tail[tokens].double().mean())}
    # the same random stream, the probabilities in float32 or float64: how often the token differs
    row["float32_differs_from_float64"] = float((drawn[PROJECT] != drawn[FLOAT64]).double().mean())
    return row


def main() -> None:
    args = parser(__doc__).parse_args()
    draws = 4 * ROWS if args.quick else 40 * ROWS
    rows = [case(exponent, temperature, draws, args.seed) for exponent, temperature in CASES]
    print(f"{'case':>16}  {'H (nats)':>9}  " + "  ".join(f"{name:>30}" for name in SAMPLERS))
    for row in rows:
        cells = [f"{row[name]['entropy_estimate'] - row['entropy']:+.4f} (z {row[name]['z']:+.1f})"
                 for name in SAMPLERS]
        print(f"s={row['zipf_exponent']}, T={row['temperature']}".rjust(16) + f"  {row['entropy']:9.4f}  "
              + "  ".join(f"{cell:>30}" for cell in cells))
    print("each cell: mean surprisal of the draws − H(p), and its z (a sampler true to p stays within |z| ≲ 3)")
    for row in rows:
        shares = ", ".join(f"{name} {row[name]['tail_share']:.2e}" for name in SAMPLERS)
        print(f"s={row['zipf_exponent']}, T={row['temperature']}: tail mass {row['tail_mass']:.2e}; drawn: {shares}; "
              f"{PROJECT} differs from {FLOAT64} (same stream) in {row['float32_differs_from_float64']:.2e} of draws")
    report("draw_precision", {"cases": rows},
           {"vocabulary": VOCABULARY, "rows_per_call": ROWS, "draws": draws, "tail": TAIL, "quick": args.quick,
            "seed": args.seed}, args.json)


if __name__ == "__main__":
    main()
