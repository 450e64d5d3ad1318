"""``nf4-tune export``: the best config per (GPU model, problem), as the runtime's table (reads only)."""

from __future__ import annotations

import json

from ._common import CannotRun, UserError, add_db_arg, open_repo, output_file


def add_parser(sub):
    p = sub.add_parser("export", help="write the best config per (GPU model, problem) for the runtime (reads only)",
                       description="Write the best stored config of every (GPU model, problem), every family, as a "
                                   "configs.json the runtime serves from (nf4tune.serve.use_configs or "
                                   "$NF4TUNE_CONFIGS). The file is written atomically; only a regular file (or a "
                                   "symlink to one) is replaced, and never a database: FILE is resolved (symlinks "
                                   "followed) and refused when it is the --db file, any SQLite file or a "
                                   "-wal/-shm/-journal file.")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--over", metavar="TABLE",
                   help="lay the database's entries over this table file (one written by export, such as the "
                        "packaged tuner/serve/tuned_configs.json): its entries for a (GPU model, problem) the "
                        "database holds are replaced, the others kept as they are. -o may name the same file")
    p.add_argument("--default-space", action="store_true",
                   help="export only configs of each family's default space (no experimental knob value): the "
                        "fastest such config stored for a problem, and no entry where none is stored. The "
                        "packaged table is exported this way, so that a search without --experimental can find "
                        "every config it serves")
    add_db_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .._files import atomic_write
    from ..measure.record import table_entries
    from ..serve.table import entry_key, table_document

    output_file(args.output)
    base = _base_entries(args.over) if args.over else []
    repo = open_repo(args.db, read_only=True)
    entries = table_entries(repo, default_space=args.default_space)
    if not entries:
        raise CannotRun(f"no valid measurement stored in {repo.url}: nothing to export")
    mine = {entry_key(e) for e in entries}
    kept = [e for e in base if entry_key(e) not in mine]
    atomic_write(args.output, json.dumps(table_document(entries + kept), indent=2))
    over = f" over {args.over} ({len(base) - len(kept)} of its {len(base)} entries replaced)" if args.over else ""
    print(f"wrote {len(entries)} tuned problem(s){over} to {args.output}")
    return 0


def _base_entries(path) -> list:
    """The entries of the table file ``path`` as written (checked by the runtime's own reader)."""
    from ..serve.table import read_table_entries

    try:
        return read_table_entries(path)
    except ValueError as e:
        raise UserError(f"--over: {e}") from None
