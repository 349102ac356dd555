"""The paper suite's first stages on a real Hugging Face checkpoint on one GPU in bfloat16, for
whoever has one: about ten minutes on a datacentre GPU with an 8B model.

Stages, each timed, with the GPU's peak memory after it: load the backbone; locate (the paper
suite's N = 4096 tokens of 512, every layer, the three DiHAL proxies, ℓ*); a sweep of
``--layers`` (default 1, 2, 3) under the paper suite's sweep protocol cut to ``--steps`` steps,
with streamed bridge targets (h_ℓ computed per batch from layers 1..ℓ, so host memory stays
bounded by the batch), each bridge measured on the corpus's validation windows. It reports
seconds per stage, bridge training tokens per second, and ℓ*.

The model is the paper suite's backbone (``meta-llama/Llama-3.1-8B-Instruct``, gated on the Hub:
log in first) unless ``--model`` names another hub id or a local checkpoint directory; the corpus
is the embedded ``stdlib-docs`` (no download) unless ``--corpus`` names another. ``--quick`` runs
the same stages on the embedded SmolLM2-135M on the CPU in float32 with tiny sizes, a check that
the script works, not a measurement.
"""

from __future__ import annotations

import dataclasses
import time

import common
import torch
from tabulate import tabulate

from dihal_bench.config.suite import resolve_suite
from dihal_bench.hybrid.sweep import run_sweep
from dihal_bench.locate.pipeline import LocateConfig, locate
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget


def peak_gib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    return torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--model", help="hub id or local directory (default: the paper suite's backbone)")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--layers", default="1,2,3", help="comma-separated layers to sweep")
    parser.add_argument("--steps", type=int, default=100, help="bridge training steps per layer")
    parser.add_argument("--eval-sequences", type=int, default=64,
                        help="validation windows for the hybrid's perplexity and KL")
    args = parser.parse_args()
    _, paper = resolve_suite("paper")
    model = "smollm2-135m" if args.quick else (args.model or paper.backbone)
    device, dtype = ("cpu", "float32") if args.quick else ("cuda", paper.dtype)
    layers = [1, 2] if args.quick else [int(layer) for layer in args.layers.split(",")]
    steps = 2 if args.quick else args.steps
    spec = common.bridge_spec(paper, Budget.from_dict({**paper.sweep.budget, "steps": steps, "seed": args.seed}))
    if args.quick:  # a bridge and windows small enough for a CPU in seconds
        spec = dataclasses.replace(spec, options={"d_model": 32, "layers": 1, "heads": 2},
                                   budget=dataclasses.replace(spec.budget, batch_size=4, seq_len=32))
    locate_config = LocateConfig(tokens=256 if args.quick else paper.locate.tokens,
                                 seq_len=64 if args.quick else paper.locate.seq_len, seed=args.seed)

    rows, figures = [], {}

    def stage(name: str, fn):
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
        memory = peak_gib(device)
        rows.append([name, f"{seconds:.1f}", "-" if memory is None else f"{memory:.1f}"])
        figures[name] = {"seconds": seconds, "peak_gib": memory}
        return result

    backbone = stage("load backbone", lambda: load_backbone(model, device=device, dtype=dtype))
    corpus = load_corpus(args.corpus)
    located = stage("locate", lambda: locate(backbone, corpus, locate_config, progress=False))
    swept = stage(f"sweep of layers {layers}, streamed targets",
                  lambda: run_sweep(backbone, corpus, layers, spec, eval_sequences=4 if args.quick else args.eval_sequences,
                                    progress=False, stream_targets=True))
    train_seconds = sum(row["train_seconds"] for row in swept["layers"])
    tokens_per_second = len(layers) * steps * spec.budget.tokens_per_step / train_seconds

    print(tabulate(rows, headers=["stage", "seconds", "peak GPU GiB"]))
    print(f"ℓ* = {located['chosen_layer']} of {backbone.num_layers}; bridge training {tokens_per_second:,.0f} tokens/s")
    print(tabulate([[row["layer"], f"{row['bridge_mse']:.3f}", f"{row['hybrid_ppl']:.1f}"] for row in swept["layers"]],
                   headers=["layer", "bridge MSE", "hybrid PPL"]))
    figures.update(chosen_layer=located["chosen_layer"], bridge_tokens_per_second=tokens_per_second,
                   layers=[{key: row[key] for key in ("layer", "bridge_mse", "hybrid_ppl", "train_seconds")}
                           for row in swept["layers"]])
    common.report("paper_gpu_bench", figures, {"model": model, "corpus": args.corpus, "device": device, "dtype": dtype,
                                               "layers": layers, "steps": steps, "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
