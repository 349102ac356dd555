"""Dependency-free helpers: atomic file IO and checksums, memory-mapped tensors, the cache folder,
provenance, suite value parsing and a one-entry memo. Imports only `dihal_bench.errors`."""
