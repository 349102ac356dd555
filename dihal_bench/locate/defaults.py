"""Locate's names, in a torch-free module so that the suite loader and the CLI can show them as
defaults without importing models."""

#: the three proxies of the DiHAL paper, combined as z(m_curv) + z(m_mono) − z(k_eff)
DIHAL_PROXIES = ("local_curvature", "global_monotonicity", "effective_rank")
#: how hidden states are preprocessed before the proxies see them (docs/method.md#preprocessing)
PREPROCESSING_MODES = ("trace", "none", "standardize", "trace-drop-top")
