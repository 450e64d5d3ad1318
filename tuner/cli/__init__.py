"""``nf4-tune``: a thin command line over the tuner library.

One module per subcommand turns its arguments into one library call and prints the result.
Every argument is checked before any GPU or database work; a user error is one line
(``nf4-tune: error: ...``) and exit 2, as argparse's own; see :data:`_common.EXIT_TABLE`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import bench, best, compile, db, export, regress, report, search, space
from ._common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TABLE, EXIT_USAGE, CannotRun, UserError

__all__ = ["main", "build_parser", "UserError", "CannotRun", "EXIT_TABLE"]

SUBCOMMANDS = (space, compile, bench, search, best, export, regress, report, db)


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    p = argparse.ArgumentParser(
        prog="nf4-tune", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_TABLE,
        description="Tune, check and serve fused 4-bit (NF4/FP4) kernels for bitsandbytes' format, per GPU: "
                    "dequantize (bit-identical to bnb) and the decode matmul.")
    p.add_argument("--version", action="version", version=f"nf4-tune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    parsers = list(sub.choices.values())
    while parsers:
        sp = parsers.pop()
        sp.formatter_class = argparse.RawDescriptionHelpFormatter
        sp.epilog = EXIT_TABLE
        for action in sp._actions:                  # `db recover` and any other nested subcommand
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
    return p


def _databases(args) -> list:
    """The SQLite files the command's --db names (the default one when it has --db and none is
    given): no output may land on them."""
    from nf4tune.db._engine import resolve_url, sqlite_path

    if not hasattr(args, "db"):
        return []
    path = sqlite_path(resolve_url(args.db))
    return [path] if path else []


def _database_shown(args) -> str:
    from nf4tune.db._engine import _shown, resolve_url

    return _shown(resolve_url(getattr(args, "db", None) or getattr(args, "database", None)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    from nf4tune.db._engine import DatabaseError

    from .._files import OutputPathError
    from ..kernel.gpu import NoGPUError
    from ..vocabulary import InvalidConfig

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from nf4tune.db._engine import is_database_error, is_lock_error, lock_timeout, lock_timeout_setting, locked_message

    from .._files import protect_databases

    try:
        with lock_timeout_setting(getattr(args, "lock_timeout", None)), protect_databases(_databases(args)):
            return int(args.func(args) or 0)
    except CannotRun as e:
        print(f"nf4-tune: cannot run: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NoGPUError as e:
        print(f"nf4-tune: cannot run: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (UserError, InvalidConfig, OutputPathError) as e:
        print(f"nf4-tune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DatabaseError as e:
        print(f"nf4-tune: cannot run: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("nf4-tune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        # a database that stayed locked, or failed, in the middle of the work: one line, no traceback
        if is_lock_error(e):
            waited = getattr(args, "lock_timeout", None) or lock_timeout()
            print(f"nf4-tune: cannot run: {locked_message(_database_shown(args), waited)}", file=sys.stderr)
            return EXIT_USAGE
        if is_database_error(e):
            line = (str(e).strip().splitlines() or [""])[0]
            print(f"nf4-tune: failed: database error on {_database_shown(args)}: {type(e).__name__}: {line}",
                  file=sys.stderr)
            return EXIT_FAILED
        if isinstance(e, (RuntimeError, ValueError, OSError)):
            print(f"nf4-tune: failed: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_FAILED
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
