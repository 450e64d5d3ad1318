"""Merge a table run's export into a serving table: every entry of NEW replaces the BASE entry of the
same GPU model, family, shape, dtype, quant, blocksize and batch bucket; the rest of BASE stays.

Usage: python3 ci/merge_table.py BASE.json NEW.json -o OUT.json
(the H200 session merges its M = 1 table run into tuner/serve/tuned_configs.json this way, so that the
as-served benchmark and the decode read the table that will be committed)
"""

import argparse
import json
import sys

sys.path.insert(0, __file__.rsplit("/ci/", 1)[0])

from tuner._files import atomic_write  # noqa: E402
from tuner.serve.table import TABLE_FORMAT, ConfigTable  # noqa: E402


def _keys(table: dict, origin: str) -> list:
    """The (GPU model, problem) of each entry, parsed as the runtime parses a table (ValueError for a
    bad entry)."""
    if table.get("format") not in (1, TABLE_FORMAT) or not isinstance(table.get("entries"), list):
        raise ValueError(f"{origin} is not a table written by `nf4-tune export` (format 1 or {TABLE_FORMAT})")
    return [(e.gpu, e.problem) for e in ConfigTable(table["entries"], origin).entries]


def merge(base: dict, new: dict) -> tuple:
    """(merged table, entries replaced, entries added)"""
    if base.get("format") != new.get("format"):
        raise ValueError(f"table formats differ: {base.get('format')!r} against {new.get('format')!r}")
    fresh = dict(zip(_keys(new, "the new table"), new["entries"]))
    entries, replaced = [], 0
    for k, e in zip(_keys(base, "the base table"), base["entries"]):
        if k in fresh:
            entries.append(fresh.pop(k))
            replaced += 1
        else:
            entries.append(e)
    entries.extend(fresh.values())
    # one form for every config (keys sorted, as `nf4-tune export` writes them), so a merge's diff shows only
    # the entries it changed
    entries = [dict(e, config=dict(sorted(e["config"].items()))) for e in entries]
    return dict(base, entries=entries), replaced, len(fresh)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    try:
        with open(a.base) as f:
            base = json.load(f)
        with open(a.new) as f:
            new = json.load(f)
        merged, replaced, added = merge(base, new)
        atomic_write(a.output, json.dumps(merged, indent=2) + "\n")
    except (OSError, ValueError, KeyError) as e:
        print(f"merge_table: {e}", file=sys.stderr)
        return 1
    print(f"{a.output}: {replaced} entries replaced, {added} added, {len(merged['entries'])} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
