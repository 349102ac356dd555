"""The training budget every method trains under, the one training loop, and data parallelism
across processes. Below the contracts, so a baseline can train through it."""
