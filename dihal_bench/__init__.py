"""dihal-bench: where should diffusion enter a pretrained language model?"""

import pluggy

__version__ = "0.1.0"

#: Decorate plugin functions with this, e.g. ``@hookimpl def register_proxies(register): ...``
hookimpl = pluggy.HookimplMarker("dihal_bench")
