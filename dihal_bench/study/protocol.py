"""One path from a resolved suite to what a training command needs: the budget of a section
(``budget`` or ``sweep.budget``) for a seed, the bridge spec, and the matched parameter allowance.

``dihal-bench run`` and every single-stage command (``sweep``, ``bridge train``, ``baseline
train``) go through these functions, so a suite means the same protocol everywhere.
"""

from __future__ import annotations

import copy

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.hybrid.training import BridgeSpec
from dihal_bench.registry.plugins import get_registry
from dihal_bench.training.budget import Budget


def section_budget(config: SuiteConfig, section: str, seed: int) -> Budget:
    """The Budget of ``section`` ("budget" or "sweep.budget") of a resolved suite, for ``seed``."""
    return Budget.from_dict({**config.budget_table(section), "seed": seed}, section=section)


def bridge_spec(config: SuiteConfig, section: str, seed: int) -> BridgeSpec:
    """The suite's bridge (name, options, sampling) trained under the budget of ``section``."""
    bridge = config.bridge
    # the options as a plain dict: they go into job specs, which are hashed as JSON
    return BridgeSpec(name=bridge.name, options=copy.deepcopy(dict(bridge.options)),
                      budget=section_budget(config, section, seed),
                      sample_steps=bridge.sample_steps, sink_passthrough=bridge.sink_passthrough)


def matched_budget(config: SuiteConfig, seed: int, width: int) -> Budget:
    """The one budget every method trains under: the suite's ``budget`` whose parameter
    allowance, unless the suite sets one, is the size of the suite's DiHAL bridge at ``width``."""
    budget = section_budget(config, "budget", seed)
    if budget.param_allowance is None:
        budget = budget.replace(param_allowance=bridge_spec(config, "budget", seed).parameter_count(width))
    return budget


def baseline_options(config: SuiteConfig, name: str) -> dict:
    """The suite's sampling settings baseline ``name`` takes: ``sampling.diffusion_steps`` for its
    diffusion steps option, ``sampling.temperature`` and ``top_p`` for its token sampler."""
    cls, sampling = get_registry().get("baseline", name).obj, config.sampling
    steps = {cls.steps_option: sampling.diffusion_steps} if cls.steps_option else {}
    return {**steps, **{option: getattr(sampling, option) for option in cls.token_sampling_options}}
