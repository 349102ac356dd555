"""Hybrid engine: training and checkpointing a bridge, the hybrid LM (bridge + upper stack + LM
head), its evaluation, and the layer sweep."""
