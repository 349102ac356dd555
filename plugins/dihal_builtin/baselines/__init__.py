"""The baselines: continuous-diffusion text generators trained under the matched budget (docs/method.md#baselines)."""
