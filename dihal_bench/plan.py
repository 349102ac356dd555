"""``dihal-bench run --dry-run``: the resolved plan, its jobs, and a rough cost estimate.

Nothing is loaded: the backbone's size is read from its name ("8B", "135m") or from the
table of known models, and time is FLOPs over an assumed sustained throughput, so the
estimate says which jobs dominate and roughly how long and how much memory they need,
not the exact figure.
"""

from __future__ import annotations

import json
import re

from tabulate import tabulate

from dihal_bench.budget import Budget

KNOWN_PARAMETERS = {"smollm2-135m": 134.5e6, "gemma3-270m": 268.1e6}
#: sustained FLOP/s assumed per device kind: a bf16 datacentre GPU at ~35% utilisation, and
#: the 2-core CPU this project is developed on (SmolLM2-135M forward: ~550 tokens/s measured)
THROUGHPUT = {"cuda": 300e12, "cpu": 1.5e11}
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def parameters_from_name(name: str) -> float | None:
    if name in KNOWN_PARAMETERS:
        return KNOWN_PARAMETERS[name]
    match = re.search(r"(\d+(?:\.\d+)?)\s*([bBmM])\b", name.replace("-", " ").replace("_", " "))
    if not match:
        return None
    return float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6)


def jobs(config: dict) -> list[dict]:
    """One entry per job of one seed: kind, what it does, tokens through the backbone, tokens trained."""
    locate, sweep, sampling = config["locate"], config["sweep"], config["sampling"]
    budget = Budget.from_dict(config["budget"])
    sweep_budget = Budget.from_dict(sweep["budget"])
    n_layers = len(sweep["layers"]) if sweep["layers"] != "auto" else sweep["count"]
    plan = [{"job": "locate", "detail": f"N={locate['tokens']} tokens x all layers, {len(locate['proxies'])} proxies",
             "backbone_tokens": locate["tokens"] * 2, "trained_tokens": 0}]
    plan.append({"job": "bridge targets", "detail": "one forward pass over the training split",
                 "backbone_tokens": sweep_budget.sequences_needed // max(sweep_budget.epochs, 1) * sweep_budget.seq_len,
                 "trained_tokens": 0})
    for i in range(n_layers):
        plan.append({"job": f"sweep-layer {i + 1}/{n_layers}", "detail": f"{sweep_budget.steps} steps",
                     "backbone_tokens": sweep["eval_sequences"] * sweep_budget.seq_len * 3,
                     "trained_tokens": sweep_budget.steps * sweep_budget.tokens_per_step})
    for role in config["methods"]["dihal"]:
        plan.append({"job": f"dihal-{role}", "detail": f"{budget.steps} steps + {sampling['samples']} samples",
                     "backbone_tokens": sampling["samples"] * sampling["seq_len"],
                     "trained_tokens": budget.steps * budget.tokens_per_step})
    for name in config["methods"]["baselines"]:
        in_budget = name != "ar-backbone"
        plan.append({"job": name, "detail": f"{budget.steps if in_budget else 0} steps + {sampling['samples']} samples",
                     "backbone_tokens": sampling["samples"] * sampling["seq_len"],
                     "trained_tokens": budget.steps * budget.tokens_per_step if in_budget else 0})
    methods = len(config["methods"]["dihal"]) + len(config["methods"]["baselines"])
    plan.append({"job": "metrics", "detail": f"{methods} methods x {sampling['samples']} samples under the evaluator",
                 "backbone_tokens": methods * sampling["samples"] * sampling["seq_len"] * 2, "trained_tokens": 0})
    return plan


def format_plan(name: str, config: dict) -> str:
    params = parameters_from_name(config["backbone"])
    device = "cuda" if str(config["device"]).startswith("cuda") else "cpu"
    bytes_per = BYTES.get(config["dtype"], 4)
    rows = []
    for job in jobs(config):
        seconds = None
        if params:
            # forward 2·P·tokens through the frozen backbone; training a ~P/100 trainable part
            # on cached targets costs far less, so it is counted as 6·(P/100)·tokens
            flops = 2 * params * job["backbone_tokens"] + 6 * (params / 100) * job["trained_tokens"]
            seconds = flops / THROUGHPUT[device]
        rows.append([job["job"], job["detail"], f"{job['backbone_tokens']:,}", f"{job['trained_tokens']:,}",
                     _duration(seconds)])
    seeds = len(config["seeds"])
    lines = [f"suite {name}: {config['description']}", "", "resolved config:",
             json.dumps(config, indent=2), "",
             f"jobs per seed ({seeds} seed{'s' if seeds > 1 else ''}: {config['seeds']}):",
             tabulate(rows, headers=["job", "what", "backbone tokens", "trained tokens", "est. time"])]
    if params:
        weights = params * bytes_per
        lines.append(f"\nmemory: backbone weights {weights / 2**30:.1f} GiB ({params / 1e9:.2f}B parameters, "
                     f"{config['dtype']}); bridge training targets add n_train x T x d x 4 bytes per swept layer "
                     f"on the host")
        lines.append(f"time: FLOPs / {THROUGHPUT[device]:.1e} FLOP/s assumed sustained on {device}; "
                     "order-of-magnitude only")
    else:
        lines.append("\nmemory and time: unknown (the backbone's size is not in its name)")
    return "\n".join(lines)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
