"""The DiHAL bridge's sampling-steps curve under each sampler: one bridge at layer 3, trained once,
sampled with the posterior-mean, DDIM and ancestral updates at K = 1, 2, 4, 8, 16 side by side.

- training: the diagnostic suite's DiHAL bridge under its matched budget (600 steps of 16×64,
  lr 1e-3; ``--steps`` shortens it), on a seeded subset of stdlib-docs' training windows;
- bridgeability on every validation window (``evaluation.bridge_reconstruction``, the sink
  given, as in the sweep): standardised MSE, the MSE in ``trace`` metric and R², per sampler
  and K, noise seed 0; at the largest K the samplers that draw noise also at the other
  ``--noise-seeds``, for the spread the noise alone makes;
- the hybrid's teacher-forced perplexity and KL to the backbone on a seeded subset of the
  validation windows (``--eval-sequences``), per sampler and K, noise seed 0;
- where x_t goes, on the first ``--path-windows`` validation windows: at K = 16, for each
  sampler, at every step t < 1 the noise scale of x_t against the true x₀, rms(x_t − (1−t)·x₀ − t·c)/(σ·√(t(1−t))) over positions ≥ 1, which is 1 on
  the training marginal, and the denoiser's x̂₀ MSE there; beside them the denoiser's MSE on
  x_t drawn from the training marginal itself (what training saw) at the same t;
- how much of a noisy sampler's error is its own spread, on the same windows: at the largest K
  two noise seeds give samples a and b of ĥ_ℓ; v = ½·mean (a − b)² estimates the variance of a
  sample given the condition, so MSE ≈ bias² + v, and the mean of a and b has MSE ≈ bias² + v/2.
  A sampler that draws from p(h_ℓ | c) pays v on top of the posterior mean's error, which is
  what K = 1 (the denoiser's x̂₀ at the condition itself) estimates.

No target: the figures explain the K curve (docs/method.md#bridge).
"""

from __future__ import annotations

import math
from pathlib import Path

import common
import torch
from dihal_builtin.bridge import SAMPLER_STEPS, PositionNoise, reverse_bridge
from tabulate import tabulate

from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, save_bridge_checkpoint
from dihal_bench.hybrid.evaluation import bridge_reconstruction, hybrid_against_backbone
from dihal_bench.hybrid.model import HybridLM
from dihal_bench.hybrid.training import (
    packed_split,
    train_bridge,
    training_subset,
    validation_subset,
    with_states,
)
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget

DEFAULT_LAYER = 3
#: the samplers whose result depends on the noise seed
NOISY = ("ddim", "ancestral")
#: the K of the path diagnostic
PATH_STEPS = 16


def train(backbone, corpus, spec, layer: int, checkpoint_dir: Path | None) -> tuple[object, dict]:
    budget = spec.budget
    sequences = training_subset(packed_split(backbone, corpus, "train", budget.seq_len), [budget], budget.seed)
    train_data = with_states(backbone, sequences, [layer], progress=False)
    bridge, stats = train_bridge(backbone, spec, layer, train_data, checkpoint_dir, progress=checkpoint_dir is not None)
    return bridge, {"train_sequences": len(sequences), **stats}


def measure_bridgeability(bridge, valid, layer: int, samplers: list[str], k_values: list[int],
                          noise_seeds: list[int]) -> list[dict]:
    rows = []
    for sampler in samplers:
        for k in k_values:
            for seed in noise_seeds if sampler in NOISY and k == max(k_values) else noise_seeds[:1]:
                measured = bridge_reconstruction(bridge, valid.states[0], valid.states[layer], valid.mask, k,
                                                 sampler=sampler, seed=seed)
                rows.append({"sampler": sampler, "steps": k, "noise_seed": seed,
                             **{key: measured[key] for key in ("mse", "mse_trace", "r2")}})
    return rows


def measure_hybrid(backbone, bridge, windows, layer: int, samplers: list[str], k_values: list[int]) -> list[dict]:
    rows = []
    for sampler in samplers:
        for k in k_values:
            hybrid = HybridLM(backbone, bridge, layer, steps=k, sampler=sampler)
            scored = hybrid_against_backbone(backbone, hybrid, windows)
            rows.append({"sampler": sampler, "steps": k, "hybrid_ppl": scored["ppl"], "kl_to_backbone": scored["kl"]})
    return rows


@torch.no_grad()
def measure_path(bridge, valid, layer: int, samplers: list[str], steps: int, seed: int = 0) -> dict:
    """Per sampler, at each t_k < 1 of a ``steps``-step walk: the noise scale of x_t against the
    true x₀ and the denoiser's x̂₀ MSE; and the x̂₀ MSE on the training marginal at each t_k."""
    device, dtype = bridge.target_mean.device, bridge.target_mean.dtype
    c = bridge.standardize_cond(valid.states[0].to(device, dtype))
    x0 = bridge.standardize_target(valid.states[layer].to(device, dtype))
    held, sigma = x0[:, :1], bridge.sigma

    def stats(x_t: torch.Tensor, x0_hat: torch.Tensor, t: float) -> tuple[float, float]:
        residual = (x_t - (1 - t) * x0 - t * c)[:, 1:]
        scale = residual.pow(2).mean().sqrt().item() / (sigma * math.sqrt(t * (1 - t))) if t < 1 else 0.0
        return scale, (x0_hat - x0)[:, 1:].pow(2).mean().item()

    path = {}
    for sampler in samplers:
        noise = PositionNoise(seed)
        seen = []

        def denoise(k: int, x_t: torch.Tensor) -> torch.Tensor:
            t = k / steps
            x0_hat = bridge.denoise(x_t, torch.full(c.shape[:1], t, device=device, dtype=dtype), c)
            seen.append((t, *stats(x_t, x0_hat, t)))
            return x0_hat

        reverse_bridge(c, steps, denoise, SAMPLER_STEPS[sampler], sigma, lambda k: noise(k, 0, c), held)
        path[sampler] = [{"t": t, "noise_scale": scale, "x0_mse": mse} for t, scale, mse in seen]
    generator = torch.Generator().manual_seed(seed)
    marginal = []
    for k in range(steps, 0, -1):
        t = k / steps
        epsilon = torch.randn(x0.shape, generator=generator).to(device, dtype)
        x_t = (1 - t) * x0 + t * c + sigma * math.sqrt(t * (1 - t)) * epsilon
        x_t[:, :1] = held
        x0_hat = bridge.denoise(x_t, torch.full(c.shape[:1], t, device=device, dtype=dtype), c)
        marginal.append({"t": t, "noise_scale": stats(x_t, x0_hat, t)[0], "x0_mse": stats(x_t, x0_hat, t)[1]})
    path["training marginal"] = marginal
    return path


@torch.no_grad()
def measure_spread(bridge, valid, layer: int, samplers: list[str], steps: int, seeds: tuple[int, int] = (0, 1),
                   batch_size: int = 64) -> dict:
    """Per noisy sampler at ``steps``: the MSE of each of two noise seeds' samples, v = ½·mean (a − b)²
    and the MSE of (a + b)/2, standardised, over positions ≥ 1 (the sink given, as in the sweep)."""
    device, dtype = bridge.target_mean.device, bridge.target_mean.dtype
    truth = bridge.standardize_target(valid.states[layer].to(device, dtype))[:, 1:]
    spread = {}
    for sampler in samplers:
        if sampler not in NOISY:
            continue
        drawn = []
        for seed in seeds:
            generator = torch.Generator().manual_seed(seed)
            batches = [bridge.sample(valid.states[0][rows].to(device, dtype), steps, generator=generator,
                                     sink=valid.states[layer][rows, :1].to(device, dtype), sampler=sampler)
                       for rows in (slice(start, start + batch_size) for start in range(0, len(truth), batch_size))]
            drawn.append(bridge.standardize_target(torch.cat(batches))[:, 1:])
        a, b = drawn
        spread[sampler] = {"mse_seeds": [(x - truth).pow(2).mean().item() for x in drawn],
                           "variance": 0.5 * (a - b).pow(2).mean().item(),
                           "mse_of_mean": ((a + b) / 2 - truth).pow(2).mean().item()}
    return spread


def by_seed(rows: list[dict], key: str) -> dict[tuple[str, int], list[float]]:
    """(sampler, K) -> ``key`` at each noise seed measured there, seed 0 first."""
    grouped: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        grouped.setdefault((row["sampler"], row["steps"]), []).append(row[key])
    return grouped


def print_tables(bridgeability: list[dict], hybrid: list[dict], path: dict, samplers: list[str],
                 k_values: list[int], noise_seeds: list[int], eval_sequences: int) -> None:
    for key, label in (("mse", "bridge MSE"), ("r2", "bridge R²"), ("mse_trace", "bridge MSE (trace metric)")):
        table = by_seed(bridgeability, key)
        print(tabulate([[k, *(" / ".join(f"{value:.4f}" for value in table[s, k]) for s in samplers)]
                        for k in k_values], headers=[f"K ({label})", *samplers]))
        print()
    print(f"(noise seed 0; at K = {max(k_values)} the noisy samplers at noise seeds {noise_seeds}, in that order)")
    print()
    by_point = {(row["sampler"], row["steps"]): row for row in hybrid}
    print(tabulate([[k, *(by_point[s, k][key] for s in samplers for key in ("hybrid_ppl", "kl_to_backbone"))]
                    for k in k_values],
                   headers=["K", *(f"{s} {label}" for s in samplers for label in ("PPL", "KL"))], floatfmt=".3f"))
    print(f"(hybrid teacher-forced on {eval_sequences} validation windows, noise seed 0)")
    print()
    names = list(path)
    rows = [[f"{entry['t']:.4f}", *(value for name in names for value in
                                    (path[name][i]["noise_scale"], path[name][i]["x0_mse"]))]
            for i, entry in enumerate(path[names[0]])]
    print(tabulate(rows, headers=["t", *(f"{name} {label}" for name in names for label in ("noise", "x̂₀ MSE"))],
                   floatfmt=".3f"))
    print(f"(K = {len(rows)}: noise = rms(x_t − (1−t)x₀ − t·c)/(σ√(t(1−t))), 1 on the training marginal; "
          "x̂₀ MSE of the denoiser's prediction at that step)")
    print()


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--layer", type=int, help=f"ℓ (default {DEFAULT_LAYER}; with --checkpoint: the checkpoint's)")
    parser.add_argument("--steps", type=int, help="training steps (default: the diagnostic matched budget's, 600; "
                                                  "--quick: 5)")
    parser.add_argument("--checkpoint", type=Path, metavar="DIR", help="a trained bridge to use instead of training")
    parser.add_argument("--save", type=Path, metavar="DIR", help="save the trained bridge there")
    parser.add_argument("--resume-dir", type=Path, metavar="DIR",
                        help="training checkpoints every 25 steps there, resumed from on the next run (bitwise the "
                             "same bridge), so that training can span runs on a busy machine; shows progress")
    parser.add_argument("--k-values", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLER_STEPS), choices=list(SAMPLER_STEPS))
    parser.add_argument("--noise-seeds", type=int, nargs="+", help="noise seeds of ddim and ancestral "
                                                                   "(default 0 1; --quick: 0)")
    parser.add_argument("--eval-sequences", type=int, help="validation windows for the hybrid's PPL and KL "
                                                           "(default 16; --quick: 2)")
    parser.add_argument("--path-windows", type=int, default=32, help="validation windows of the x_t path diagnostic")
    args = parser.parse_args()
    noise_seeds = args.noise_seeds or ([0] if args.quick else [0, 1])
    eval_sequences = args.eval_sequences or (2 if args.quick else 16)

    suite = common.diagnostic_suite()
    budget = Budget.from_dict({**suite.budget, "seed": args.seed})
    if args.steps or args.quick:
        budget = budget.replace(steps=args.steps or 5)
    if args.resume_dir:
        budget = budget.replace(checkpoint_every=25)  # not part of the result: a resume matches without it
    spec = common.bridge_spec(suite, budget)
    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    if args.checkpoint:
        bridge, layer = load_bridge_checkpoint(args.checkpoint, backbone, layer=args.layer)
        training, train_seconds = None, 0.0
    else:
        layer = backbone.check_layer(args.layer or DEFAULT_LAYER)
        (bridge, training), train_seconds = common.timed(train, backbone, corpus, spec, layer, args.resume_dir)
        if args.save:
            save_bridge_checkpoint(bridge, spec.name, layer, backbone.name, args.save)
    bridge.eval()

    windows = packed_split(backbone, corpus, "validation", budget.seq_len)
    if args.quick:
        windows = windows[:8]
    valid = with_states(backbone, windows, [layer], progress=False)
    (bridgeability, hybrid, path, spread), eval_seconds = common.timed(lambda: (
        measure_bridgeability(bridge, valid, layer, args.samplers, args.k_values, noise_seeds),
        measure_hybrid(backbone, bridge, validation_subset(valid.sequences, eval_sequences), layer,
                       args.samplers, args.k_values),
        measure_path(bridge, valid.head(args.path_windows), layer, args.samplers, PATH_STEPS),
        measure_spread(bridge, valid.head(args.path_windows), layer, args.samplers, max(args.k_values))))

    print(f"DiHAL bridge on {backbone.name} at ℓ={layer}, σ={bridge.sigma}: "
          + (f"trained {training['steps']} steps, final loss {training['final_loss']:.4f}, {train_seconds:.0f} s"
             if training else f"loaded from {args.checkpoint}")
          + f"; {len(windows)} validation windows of {budget.seq_len}; evaluation {eval_seconds:.0f} s")
    print()
    print_tables(bridgeability, hybrid, path, args.samplers, args.k_values, noise_seeds, eval_sequences)
    print(tabulate([[name, *values["mse_seeds"], values["variance"], values["mse_of_mean"]]
                    for name, values in spread.items()],
                   headers=["sampler", "MSE seed 0", "MSE seed 1", "v = ½ mean (a−b)²", "MSE of (a+b)/2"],
                   floatfmt=".4f"))
    print(f"(K = {max(args.k_values)} on the first {min(args.path_windows, len(windows))} validation windows)")
    print()

    common.report("bridge_steps_bench", {
        "training": training, "train_seconds": train_seconds, "eval_seconds": eval_seconds,
        "bridgeability": bridgeability, "hybrid": hybrid, "path": path, "spread": spread,
    }, {"backbone": backbone.name, "corpus": corpus.name, "layer": layer, "bridge": spec.name,
        "bridge_config": bridge.config(), "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "budget": None if args.checkpoint else budget.to_dict(), "k_values": args.k_values,
        "samplers": args.samplers, "noise_seeds": noise_seeds, "validation_windows": len(windows),
        "eval_sequences": eval_sequences, "path_steps": PATH_STEPS, "path_windows": min(args.path_windows, len(windows)),
        "seed": args.seed, "quick": args.quick},
        args.json)


if __name__ == "__main__":
    main()
