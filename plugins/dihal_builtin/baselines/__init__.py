"""The baselines: continuous-diffusion text generators trained under the matched budget (DESIGN.md §4.3)."""
