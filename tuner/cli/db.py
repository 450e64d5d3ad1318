"""``nf4-tune db recover DB``: bring a SQLite database a writer left mid-transaction to a clean state."""

from __future__ import annotations

from ._common import EXIT_FAILED, CannotRun, add_lock_timeout_arg


def add_parser(sub):
    p = sub.add_parser("db", help="database upkeep: `db recover DB`",
                       description="Database upkeep. `nf4-tune db recover DB` does what any writing command does "
                                   "first, and nothing else: it rolls back the unfinished transaction of a writer "
                                   "that stopped (a hot DB-journal, which a read-only command cannot roll back), "
                                   "folds the write-ahead log (DB-wal) into the file, and runs SQLite's integrity "
                                   "check. It never creates a database. Exit 0 intact, 1 the integrity check "
                                   "found damage, 2 it could not run.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser("recover", help="roll back a stopped writer's transaction, fold in the log, check",
                           description=p.description)
    r.add_argument("database", metavar="DB", help="a SQLite file (or sqlite:/// URL)")
    add_lock_timeout_arg(r)
    r.set_defaults(func=run_recover)


def run_recover(args) -> int:
    from nf4tune.db._engine import DatabaseError, recover

    try:
        result = recover(args.database)
    except DatabaseError as e:
        raise CannotRun(str(e)) from None
    db = args.database
    if result["rolled_back"]:
        print(f"{db}: rolled back the unfinished transaction of a writer that stopped ({db}-journal)")
    else:
        print(f"{db}: no unfinished transaction")
    if result["wal_frames"]:
        print(f"{db}: folded {result['wal_frames']} write-ahead log frame(s) into the file"
              + (" (a reader keeps the rest for now)" if result["wal_busy"] else ""))
    if result["integrity"] != ["ok"]:
        print(f"{db}: the integrity check found damage:")
        for line in result["integrity"]:
            print(f"    {line}")
        return EXIT_FAILED
    print(f"{db}: integrity check ok")
    return 0
