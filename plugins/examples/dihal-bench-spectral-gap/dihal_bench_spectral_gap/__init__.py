"""An example third-party dihal-bench plugin contributing one geometry proxy.

Install it next to dihal-bench with ``pip install -e plugins/examples/dihal-bench-spectral-gap``
and it shows up in ``dihal-bench plugins`` and in ``dihal-bench locate --proxies all``.
"""

import torch

from dihal_bench import hookimpl


def spectral_gap(hidden: torch.Tensor, *, top: int = 1) -> float:
    """λ_top / λ_(top+1) of the covariance of the (N, d) hidden states.

    A large gap means the variation concentrates in the leading ``top`` directions, a
    low-dimensional structure that (like a low effective rank) we count as diffusion-friendly.
    """
    x = hidden.double() - hidden.double().mean(0)
    eigenvalues = torch.linalg.eigvalsh(x.T @ x / x.shape[0]).flip(0)
    return float(eigenvalues[top - 1] / eigenvalues[top].clamp_min(1e-12))


@hookimpl
def register_proxies(register):
    register("spectral_gap", spectral_gap, higher_is_better=True,
             description="ratio of the leading covariance eigenvalues (a large gap: low-dimensional)")
