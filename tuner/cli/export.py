"""``nf4-tune export``: the best config per (GPU model, problem), as the runtime's table (reads only)."""

from __future__ import annotations

import json

from ._common import CannotRun, add_db_arg, open_repo, output_file


def add_parser(sub):
    p = sub.add_parser("export", help="write the best config per (GPU model, problem) for the runtime (reads only)",
                       description="Write the best stored config of every (GPU model, problem), every family, as a "
                                   "configs.json the runtime serves from (nf4tune.serve.use_configs or "
                                   "$NF4TUNE_CONFIGS). The file is written atomically; only a regular file (or a "
                                   "symlink to one) is replaced, and never a database: FILE is resolved (symlinks "
                                   "followed) and refused when it is the --db file, any SQLite file or a "
                                   "-wal/-shm/-journal file.")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    add_db_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .._files import atomic_write
    from ..measure.record import table_entries
    from ..serve.table import table_document

    output_file(args.output)
    repo = open_repo(args.db, read_only=True)
    entries = table_entries(repo)
    if not entries:
        raise CannotRun(f"no valid measurement stored in {repo.url}: nothing to export")
    atomic_write(args.output, json.dumps(table_document(entries), indent=2))
    print(f"wrote {len(entries)} tuned problem(s) to {args.output}")
    return 0
