"""Stage 1: locate's per-layer geometry and ℓ* (one job per seed)."""

from __future__ import annotations

from dihal_bench.config.settings import LocateSettings
from dihal_bench.locate.pipeline import LocateConfig, locate
from dihal_bench.study.run import Run

#: what the record keeps of locate's output (the per-layer values of every preprocessing, the
#: top-channel shares and the agreement with depth; not the environment, which the record has)
LOCATE_KEYS = ("layers", "score", "chosen_layer", "proxies", "preprocessing", "tokens_sampled", "timings",
               "depth_spearman", "variants", "drop_top", "dropped_channels", "top_channel_share", "top_channel")

def locate_unit(run: Run, seed: int) -> dict:
    """Locate's per-layer geometry and ℓ*."""
    settings = run.config.locate
    # "sampler" names how locate picks its N tokens, so jobs of the older whole-split sampler are not reused
    spec = {**run.identity(), **settings.to_dict(), "seed": seed, "sampler": "fewest-sequences"}
    return run.store.run("locate", spec, lambda _: locate(run.backbone, run.corpus, locate_config(settings, seed),
                                                          run.progress))


def locate_config(settings: LocateSettings, seed: int) -> LocateConfig:
    """Locate's configuration from a suite's ``[locate]`` table."""
    return LocateConfig(tokens=settings.tokens, seq_len=settings.seq_len, seed=seed, proxies=settings.proxies,
                        preprocessing=settings.preprocessing, variants=settings.variants, drop_top=settings.drop_top)
