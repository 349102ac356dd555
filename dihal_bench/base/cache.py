"""Where dihal-bench keeps what it derives once and reuses across runs (dequantised models,
lm-eval task documents): ``$DIHAL_BENCH_CACHE``, by default ``~/.cache/dihal-bench``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DIHAL_BENCH_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "dihal-bench"))
