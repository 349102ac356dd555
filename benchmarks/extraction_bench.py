"""Hidden-state extraction that reads only what is needed: forward passes that stop at the
deepest layer asked for, and locate's tokens drawn from as few sequences as hold them.

(a) bridge targets (``extract_layers`` at layers 0 and ℓ, as ``with_states`` asks for a
    bridge at ℓ) for ℓ = 1, 3, 12, 29 against the full pass (ℓ = L, which every ℓ cost
    before passes could stop early), on the same training sequences, median of repeats after
    a warm-up. Target: time proportional to ℓ, i.e. t(ℓ)/t(L) ≤ ℓ/L + 0.1 for every ℓ (the
    0.1 of a full pass covers what does not scale with depth: the embedding and copying the
    two layers out).
(b) locate's extraction (``extract_sampled``, every layer) of N sampled validation tokens,
    N = 256 and 4096: positions drawn from the whole split (the sampler before this change)
    against positions drawn from the fewest sequences that hold them (``sample_positions``).
    No target: it reports the sequences each reads and the seconds.
"""

from __future__ import annotations

import math
import statistics

import common
import torch
from tabulate import tabulate

from dihal_bench.api.corpus import pack, tokenize_documents
from dihal_bench.hybrid.training import packed_split
from dihal_bench.locate.hidden_states import (
    extract_layers,
    extract_sampled,
    sample_positions,
)
from dihal_bench.registry.resolve import load_backbone, load_corpus

LAYERS = [1, 3, 12, 29]
SLACK = 0.1  # share of a full pass allowed for the depth-independent work


def whole_split_positions(n_sequences: int, seq_len: int, n_tokens: int, seed: int) -> torch.Tensor:
    """The sampler before this change: N positions uniformly over every sequence of the split,
    which touches nearly all of them once N is comparable to the number of sequences."""
    generator = torch.Generator().manual_seed(seed)
    flat = torch.randperm(n_sequences * (seq_len - 1), generator=generator)[:n_tokens].sort().values
    return torch.stack([flat // (seq_len - 1), flat % (seq_len - 1) + 1], dim=1)


def measure_targets(backbone, sequences: torch.Tensor, layers: list[int], batch_size: int,
                    repeats: int) -> dict[int, float]:
    """(a): median seconds of the bridge targets at each layer. The layers take turns within
    each round, so that a change in the machine's load between rounds hits all of them alike."""
    def run(layer):
        return extract_layers(backbone, sequences, [0, layer], batch_size, progress=False)

    run(max(layers))  # warm-up: lazy initialisation, caches
    seconds = {layer: [] for layer in layers}
    for _ in range(repeats):
        for layer in layers:
            seconds[layer].append(common.timed(run, layer)[1])
    return {layer: statistics.median(times) for layer, times in seconds.items()}


def measure_locate(backbone, sequences: torch.Tensor, seq_len: int, token_counts: list[int], batch_size: int,
                   seed: int) -> list[dict]:
    """(b): one timed extraction per sampler and N (each pass is long enough to time once)."""
    rows = []
    for tokens in token_counts:
        for sampler, sample in (("whole split (before)", whole_split_positions),
                                ("fewest sequences (after)", sample_positions)):
            positions = sample(len(sequences), seq_len, tokens, seed)
            _, seconds = common.timed(extract_sampled, backbone, sequences, positions, batch_size, progress=False)
            rows.append({"tokens": tokens, "sampler": sampler, "sequences_read": len(positions[:, 0].unique()),
                         "seconds": seconds})
    return rows


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--sequences", type=int, help="training sequences for (a) (default 64; --quick: 4)")
    parser.add_argument("--seq-len", type=int, help="their length (default: the diagnostic budget's; --quick: 32)")
    parser.add_argument("--layers", type=int, nargs="+", default=LAYERS, help="bridge layers for (a)")
    parser.add_argument("--repeats", type=int, help="timed repeats per layer in (a) (default 3; --quick: 1)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", help="N for (b) (default 256 4096; --quick: 8 16)")
    parser.add_argument("--locate-seq-len", type=int, help="validation sequence length for (b) (default 128, "
                                                           "locate's; --quick: 32)")
    parser.add_argument("--skip-locate", action="store_true", help="measure (a) only")
    args = parser.parse_args()
    quick = args.quick
    n_sequences = args.sequences or (4 if quick else 64)
    seq_len = args.seq_len or (32 if quick else common.diagnostic_suite().budget["seq_len"])
    repeats = args.repeats or (1 if quick else 3)
    token_counts = args.tokens or ([8, 16] if quick else [256, 4096])
    locate_seq_len = args.locate_seq_len or (32 if quick else 128)

    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    top = backbone.num_layers
    layers = [backbone.check_layer(layer) for layer in args.layers]  # bridge layers: 1..L-1
    sequences = packed_split(backbone, corpus, "train", seq_len)[:n_sequences]

    seconds = measure_targets(backbone, sequences, layers + [top], args.batch_size, repeats)
    full = seconds[top]
    limits = {layer: layer / top + SLACK for layer in layers}
    meets = all(seconds[layer] / full <= limits[layer] for layer in layers)
    table = [[layer, seconds[layer], seconds[layer] / full, layer / top, common.verdict(seconds[layer] / full, limits[layer])]
             for layer in layers]
    table.append([f"{top} (full pass)", full, 1.0, 1.0, ""])
    print(f"(a) bridge targets on {backbone.name}: {len(sequences)} sequences x {seq_len} tokens, "
          f"batch {args.batch_size}, median of {repeats}")
    print(tabulate(table, headers=["layer ℓ", "seconds", "t(ℓ)/t(L)", "ℓ/L", f"≤ ℓ/L + {SLACK}"], floatfmt=".3f"))
    print(f"time proportional to ℓ: {'PASS' if meets else 'FAIL'}")

    locate_rows = []
    if not args.skip_locate:
        valid = pack(tokenize_documents(corpus.split("validation"), backbone.tokenizer), locate_seq_len,
                     split_name="validation")
        token_counts = [t for t in token_counts if t <= len(valid) * (locate_seq_len - 1)]
        locate_rows = measure_locate(backbone, valid, locate_seq_len, token_counts, args.batch_size, args.seed)
        print(f"\n(b) locate extraction, every layer: {len(valid)} validation sequences of {locate_seq_len} "
              f"(N needs at least ⌈N/{locate_seq_len - 1}⌉)")
        print(tabulate([[r["tokens"], r["sampler"], r["sequences_read"], r["seconds"]] for r in locate_rows],
                       headers=["N", "positions from", "sequences read", "seconds"], floatfmt=".3f"))
        for tokens in token_counts:
            before, after = (r["seconds"] for r in locate_rows if r["tokens"] == tokens)
            print(f"N={tokens}: {before / after:.1f}x faster (fewest sequences: {math.ceil(tokens / (locate_seq_len - 1))})")

    common.report("extraction_bench", {
        "target_seconds": {str(layer): s for layer, s in seconds.items()},
        "target_ratio_to_full": {str(layer): seconds[layer] / full for layer in layers},
        "target_limit": {str(layer): limits[layer] for layer in layers},
        "meets_target": meets,
        "locate": locate_rows,
    }, {"backbone": backbone.name, "corpus": corpus.name, "sequences": len(sequences), "seq_len": seq_len,
        "layers": layers, "num_layers": top, "repeats": repeats, "batch_size": args.batch_size,
        "tokens": token_counts, "locate_seq_len": locate_seq_len, "seed": args.seed, "quick": quick}, args.json)


if __name__ == "__main__":
    main()
