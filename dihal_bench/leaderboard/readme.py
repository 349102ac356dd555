"""The README's result tables, generated from the run records as the leaderboard pools them, so that
a table in the README cannot drift from the records or miss a seed when one lands.

A block ``<!-- results:FOLDER:start -->`` … ``<!-- results:FOLDER:end -->`` holds the compact methods
table of the leaderboard group whose folder is FOLDER (``leaderboards/FOLDER/``): Gen.PPL, entropy,
pooled diversity, MAUVE with its per-seed interval and the latency ratio, each cell as the
leaderboard's (mean ± std over the pooled seeds). ``results:FOLDER/TABLE`` holds another of the
group's tables whole (``steps``: the sampling-steps axis). ``dihal-bench leaderboard --readme README.md``
rewrites every block and the claims table; the prose around them is the author's.
"""

from __future__ import annotations

import re

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.aggregate import layer_table, method_table, steps_table
from dihal_bench.leaderboard.claims import embed, evaluate, render
from dihal_bench.leaderboard.read import Group
from dihal_bench.leaderboard.render import markdown_body, seeds_note

#: the methods table's columns a README table shows, in this order (those a group lacks are left out)
COLUMNS = ("name", "budget", "gen_ppl", "entropy", "diversity_pooled", "mauve", "mauve_intervals", "latency_ratio")

BLOCK = re.compile(r"(<!-- results:(?P<name>(?P<folder>[\w.-]+)(?:/(?P<table>\w+))?):start -->\n).*?"
                   r"(<!-- results:(?P=name):end -->)", re.S)


def results_table(group: Group) -> str:
    """The group's compact methods table, after the line that says what its cells are."""
    table = method_table(group)
    by_key = {column.key: column for column in table.columns}
    columns = [by_key[key] for key in COLUMNS if key in by_key]
    return f"{seeds_note(table)}\n\n{markdown_body(table, columns)}"


#: the tables a ``results:FOLDER/TABLE`` block can hold whole; each is made of the group's rows of its name
WHOLE_TABLES = {"steps": steps_table, "layers": layer_table}


def group_table(group: Group, name: str) -> str:
    """The group's table ``name`` whole, after the line that says what its cells are."""
    build = WHOLE_TABLES.get(name)
    if build is None or not group.rows[name]:
        have = [table for table in WHOLE_TABLES if group.rows[table]]
        raise DihalError(f"README block results:{group.folder}/{name}: that group has no {name!r} table "
                         f"(a block can hold: {', '.join(have) or 'none'})")
    table = build(group)
    return f"{seeds_note(table)}\n\n{markdown_body(table)}"


def embed_results(readme: str, groups: list[Group]) -> str:
    """``readme`` with every results block filled from its group, and the claims table from all of them."""
    by_folder = {group.folder: group for group in groups}

    def fill(block: re.Match) -> str:
        folder = block["folder"]
        if folder not in by_folder:
            raise DihalError(f"README block results:{folder}: no run record makes that leaderboard group "
                             f"(groups: {', '.join(sorted(by_folder)) or 'none'})")
        group = by_folder[folder]
        table = results_table(group) if block["table"] is None else group_table(group, block["table"])
        return f"{block[1]}{table}\n{block[5]}"

    return embed(BLOCK.sub(fill, readme), render(evaluate(groups)))
