"""Locate engine: hidden states from a backbone, the geometry estimators, and the per-layer
score that picks ℓ*."""
