"""Exact mathematics with no model in it: rank statistics and the known-answer Markov chain.
Imports only `dihal_bench.errors`."""
