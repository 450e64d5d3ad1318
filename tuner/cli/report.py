"""``nf4-tune report``: a static, offline HTML report of a database (reads only)."""

from __future__ import annotations

from ._common import UserError, add_db_arg, open_repo


def add_parser(sub):
    p = sub.add_parser("report", help="write a static, offline HTML report of the database (reads only)",
                       description="A verdict block first (the latest night's status per GPU x problem, worst "
                                   "first, counts per flag, the best ever against bnb in its own column, a legend), "
                                   "then the nightly flags, a history per problem (dates, x bnb against the baseline "
                                   "band and the threshold), one block per run (command, environment and config "
                                   "diff against its baseline, measurement labels), the search studies and a knob "
                                   "heatmap: index.html with plotly.min.js beside it, and the overview, flags and "
                                   "history as CSV and JSON. The database is only read: a missing one is an error. "
                                   "The files are written into a fresh folder beside DIR and then only they move "
                                   "into DIR (index.html last); one of their names in DIR that is a symlink, a folder "
                                   "or a special file, or a database, is refused before anything is read, and no "
                                   "other file in DIR is touched.")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    add_db_arg(p)
    p.set_defaults(func=run)


def check_report_dir(path) -> None:
    """Refuse, before any work, a DIR the report cannot be published into (see ``--help``)."""
    from nf4tune.reports import report_files

    from .._files import OutputPathError, check_publish_targets

    try:
        check_publish_targets(path, report_files())
    except OutputPathError as e:
        raise UserError(str(e)) from None


def run(args) -> int:
    check_report_dir(args.output)
    from nf4tune.reports import build_report, collect

    repo = open_repo(args.db, read_only=True)
    index = build_report(collect(repo), args.output)
    print(f"wrote {index} (open it in a browser; plotly.min.js lies beside it, no network needed)")
    return 0
