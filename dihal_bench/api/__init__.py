"""Contracts: what a backbone, corpus, bridge, baseline and metric are (abstract classes and the
helpers that act on them alone). May import `training`, `base`, `numerics` and `errors`, nothing above."""
