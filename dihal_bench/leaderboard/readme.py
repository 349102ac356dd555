"""The generated blocks of the README and of docs/results.md: result tables and the claims table,
made from the run records as the leaderboard pools them, so that no table in a text can drift from
the records or miss a seed when one lands.

A block ``<!-- results:FOLDER:start -->`` … ``<!-- results:FOLDER:end -->`` holds the compact methods
table of the leaderboard group whose folder is FOLDER (``leaderboards/FOLDER/``): Gen.PPL, entropy,
pooled diversity, MAUVE with its per-seed interval and the latency ratio, each cell as the
leaderboard's (mean ± std over the pooled seeds). ``results:FOLDER/TABLE`` holds another of the
group's tables whole (``steps``: the sampling-steps axis; ``layers``; ``budget``: each scaled row
through its budget scales; ``scales`` and ``scales_nll``: its Gen.PPL or test NLL folded to one line
per row, a column per scale; ``frontier``; ``stages``). ``<!-- claims:start -->`` …
``<!-- claims:end -->`` holds the claims table, ``<!-- claims:summary:start -->`` …
``<!-- claims:summary:end -->`` its claims and verdicts alone. ``dihal-bench leaderboard --readme
FILE`` (once per file) rewrites every block of every file named; the prose around them is the author's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.aggregate import (
    Table,
    budget_table,
    frontier_table,
    layer_table,
    method_table,
    steps_table,
)
from dihal_bench.leaderboard.claims import START_MARKER, SUMMARY_START, Claim, claim_blocks, embed, evaluate
from dihal_bench.leaderboard.read import Group
from dihal_bench.leaderboard.render import markdown_body, seeds_note
from dihal_bench.leaderboard.scales import scales_table
from dihal_bench.leaderboard.stages import stage_table

#: the project's texts that hold generated blocks, relative to the repository root: the publish
#: step names each (tests/test_readme_tables.py checks that no other text holds one)
PUBLISHED_TEXTS = ("README.md", "docs/results.md")
#: the publish step: the committed tables, the page and every generated block, from results/
PUBLISH_COMMAND = ("dihal-bench leaderboard --results results --out leaderboards "
                   + " ".join(f"--readme {path}" for path in PUBLISHED_TEXTS))

#: the methods table's columns a README table shows, in this order (those a group lacks are left out:
#: a group on the markov corpus has its chain's scores where the others have Gen.PPL and MAUVE)
COLUMNS = ("name", "budget", "degenerate", "markov_nll", "markov_forbidden", "markov_bigram_tv", "gen_ppl",
           "entropy", "diversity_pooled", "mauve", "mauve_intervals", "test_nll", "test_nll_kind", "latency_ratio")

BLOCK = re.compile(r"(<!-- results:(?P<name>(?P<folder>[\w.-]+)(?:/(?P<table>\w+))?):start -->\n).*?"
                   r"(<!-- results:(?P=name):end -->)", re.S)


def results_table(group: Group) -> str:
    """The group's compact methods table, after the line that says what its cells are."""
    table = method_table(group)
    by_key = {column.key: column for column in table.columns}
    columns = [by_key[key] for key in COLUMNS if key in by_key]
    return f"{seeds_note(table)}\n\n{markdown_body(table, columns)}"


#: the tables a ``results:FOLDER/TABLE`` block can hold whole: name -> (the kind of the group's rows it is
#: made of, its builder, which returns None where the rows make no such table)
WHOLE_TABLES = {"steps": ("steps", steps_table), "layers": ("layers", layer_table),
                "budget": ("methods", budget_table), "frontier": ("frontier", frontier_table),
                "stages": ("stages", stage_table),
                "scales": ("methods", scales_table),
                "scales_nll": ("methods", lambda group: scales_table(group, "test_nll"))}


def whole_table(group: Group, name: str) -> Table | None:
    """The group's table ``name``, or None where the group has none."""
    rows, build = WHOLE_TABLES.get(name, (None, None))
    return build(group) if build is not None and group.rows[rows] else None


def group_table(group: Group, name: str) -> str:
    """The group's table ``name`` whole, after the line that says what its cells are."""
    table = whole_table(group, name)
    if table is None:
        have = [other for other in WHOLE_TABLES if whole_table(group, other) is not None]
        raise DihalError(f"README block results:{group.folder}/{name}: that group has no {name!r} table "
                         f"(a block can hold: {', '.join(have) or 'none'})")
    return f"{seeds_note(table)}\n\n{markdown_body(table)}"


def has_blocks(text: str) -> bool:
    """Whether ``text`` holds a generated block of either kind."""
    return bool(claim_blocks(text)) or BLOCK.search(text) is not None


def embed_results(readme: str, groups: list[Group], claims: list[Claim] | None = None) -> str:
    """``readme`` with every results block filled from its group, and its claims blocks (if it has
    any) from ``claims``, the claims of all the groups (evaluated here when not given)."""
    by_folder = {group.folder: group for group in groups}

    def fill(block: re.Match) -> str:
        folder = block["folder"]
        if folder not in by_folder:
            raise DihalError(f"README block results:{folder}: no run record makes that leaderboard group "
                             f"(groups: {', '.join(sorted(by_folder)) or 'none'})")
        group = by_folder[folder]
        table = results_table(group) if block["table"] is None else group_table(group, block["table"])
        return f"{block[1]}{table}\n{block[5]}"

    filled = BLOCK.sub(fill, readme)
    if not claim_blocks(readme):
        return filled
    return embed(filled, evaluate(groups) if claims is None else claims)


def embed_texts(texts: Mapping[str, str], groups: list[Group]) -> dict[str, str]:
    """Each named text with its blocks filled (`embed_results`), the claims evaluated once for
    all. A text without any block is refused: its name is probably a slip, and nothing would change."""
    empty = [name for name, text in texts.items() if not has_blocks(text)]
    if empty:
        raise DihalError(f"--readme {empty[0]}: it holds no generated block (<!-- results:GROUP:start -->, "
                         f"{START_MARKER} or {SUMMARY_START})")
    claims = evaluate(groups) if any(claim_blocks(text) for text in texts.values()) else None
    return {name: embed_results(text, groups, claims) for name, text in texts.items()}
