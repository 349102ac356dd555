"""Locate's cost: the geometry proxies on every candidate layer, against the forward passes
that extract the hidden states they read.

(a) ``extract_sampled``: N sampled tokens' hidden states at every layer, from the backbone's
    forward passes over validation sequences;
(b) ``evaluate_proxies`` on the L−1 candidate layers (preprocessing and every proxy).

Target: (b)/(a) ≤ 1.5, i.e. scoring the layers costs about as much as the forward passes.
"""

from __future__ import annotations

import functools
import time

import common
from tabulate import tabulate

from dihal_bench.api.corpus import pack, tokenize_documents
from dihal_bench.locate.defaults import DIHAL_PROXIES
from dihal_bench.locate.geometry import evaluate_proxies
from dihal_bench.locate.hidden_states import extract_sampled, sample_positions
from dihal_bench.locate.pipeline import resolve_proxies
from dihal_bench.registry.resolve import load_backbone, load_corpus

TARGET_RATIO = 1.5


def with_timers(proxies: dict) -> tuple[dict, dict[str, float]]:
    """The proxies wrapped so that each one's total seconds over all layers accumulate in
    the returned dict. ``functools.wraps`` keeps their signatures, which ``evaluate_proxies``
    reads for their default parameters."""
    seconds = {name: 0.0 for name in proxies}

    def timer(name, fn):
        @functools.wraps(fn)
        def timed_fn(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started
        return timed_fn

    return {name: (timer(name, fn), better) for name, (fn, better) in proxies.items()}, seconds


def measure_extraction(backbone, sequences, positions, batch_size: int):
    """(a): hidden states (L+1, N, d) of the sampled tokens, and the seconds they took."""
    return common.timed(extract_sampled, backbone, sequences, positions, batch_size, progress=False)


def measure_proxies(states, layers: list[int], proxy_names: list[str], seed: int) -> tuple[float, dict[str, float]]:
    """(b): seconds for every proxy on every candidate layer (trace preprocessing, as locate),
    and each proxy's share of them."""
    proxies, per_proxy = with_timers(resolve_proxies(proxy_names))
    _, seconds = common.timed(evaluate_proxies, {layer: states[layer] for layer in layers}, proxies, {},
                              "trace", seed)
    return seconds, per_proxy


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--tokens", type=int, help="N sampled tokens (default 4096; --quick: 256)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--proxies", nargs="+", default=list(DIHAL_PROXIES),
                        help="proxy names, or 'all' for every registered proxy (default: the three DiHAL proxies)")
    args = parser.parse_args()
    tokens = args.tokens or (256 if args.quick else 4096)

    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    sequences = pack(tokenize_documents(corpus.split("validation"), backbone.tokenizer), args.seq_len,
                     split_name="validation")
    positions = sample_positions(len(sequences), args.seq_len, tokens, args.seed)
    layers = list(range(1, backbone.num_layers))  # locate's candidates: every layer below the last

    states, extract_seconds = measure_extraction(backbone, sequences, positions, args.batch_size)
    proxy_seconds, per_proxy = measure_proxies(states, layers, args.proxies, args.seed)
    ratio = proxy_seconds / extract_seconds
    sequences_read = len(positions[:, 0].unique())

    rows = [["(a) extract_sampled", f"{sequences_read} seqs x {args.seq_len}", extract_seconds, 1.0],
            ["(b) proxies, all candidate layers", f"{len(layers)} layers", proxy_seconds, ratio]]
    rows += [[f"· {name}", f"{len(layers)} layers", seconds, seconds / extract_seconds]
             for name, seconds in per_proxy.items()]
    preprocessing = proxy_seconds - sum(per_proxy.values())
    rows.append(["· preprocessing and checks", f"{len(layers)} layers", preprocessing, preprocessing / extract_seconds])
    print(f"locate on {backbone.name}: N={tokens} tokens, seq_len {args.seq_len}, proxies {', '.join(per_proxy)}")
    print(tabulate(rows, headers=["stage", "work", "seconds", "x (a)"], floatfmt=".3f"))
    print(f"(b)/(a) = {ratio:.2f} (target <= {TARGET_RATIO}): {common.verdict(ratio, TARGET_RATIO)}")

    common.report("locate_bench", {
        "extract_seconds": extract_seconds,
        "proxy_seconds": proxy_seconds,
        "proxy_seconds_by_name": per_proxy,
        "preprocessing_seconds": preprocessing,
        "ratio_proxies_to_extract": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "sequences_read": sequences_read,
    }, {"backbone": backbone.name, "corpus": corpus.name, "tokens": tokens, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "proxies": list(per_proxy), "layers": layers, "seed": args.seed,
        "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
