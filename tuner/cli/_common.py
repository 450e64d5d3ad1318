"""What the subcommands share: the exit codes, the one user-error type, argument helpers
(problems, the database, configs) and progress printers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..families import FAMILIES, get as get_family
from ..vocabulary import BLOCKSIZES, DTYPES, M_BUCKETS, QUANTS, InvalidConfig, Problem

#: the exit codes of every subcommand (also in --help and README)
EXIT_OK = 0
EXIT_FAILED = 1        # the work ran and found a failure: a regression, a broken kernel, compile failures
EXIT_USAGE = 2         # nothing was done: bad arguments or input, no GPU, no database, nothing tuned
EXIT_INTERRUPTED = 130

EXIT_TABLE = """exit codes:
  0    success (regress: a clean night)
  1    the work ran and found a failure: a regression, regression-vs-bnb or broken kernel
       (regress), compile failures (compile), an error while measuring, a database error
       in the middle of the work
  2    nothing was done: bad arguments or input (usage), no GPU, a missing or unreadable
       database, a database locked by another process for longer than --lock-timeout,
       a database a writer left in the middle of a transaction (a read-only command says
       so; `nf4-tune db recover DB` or any writing command rolls it back), an output that
       would land on a database, nothing tuned for this GPU (regress)
  130  interrupted

outputs: a path is resolved (symlinks followed) before anything is written, and refused
when it is the --db file, any SQLite file or a -wal/-shm/-journal file; files are replaced
atomically and only where they are regular files. A report is written into a fresh folder
beside DIR, then only its own files (index.html, plotly.min.js, the .csv and .json tables)
move into DIR: one of them there as a symlink, a folder or a special file is refused, and
no other file in DIR is touched."""


class UserError(Exception):
    """Bad input or an environment the command cannot run in: one line, exit 2, nothing done."""


class CannotRun(UserError):
    """The command cannot run here (no GPU, no database, nothing tuned)."""


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{v} must be greater than 0")
    return v


def shape_arg(text: str) -> tuple:
    try:
        return Problem.parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_DB_HELP = "database URL (default: $NF4TUNE_DB or ./nf4tune.db; a path means a SQLite file)"


def add_db_arg(parser, help: str = _DB_HELP) -> None:
    parser.add_argument("--db", default=None, metavar="URL", help=help)
    add_lock_timeout_arg(parser)


def add_lock_timeout_arg(parser) -> None:
    parser.add_argument("--lock-timeout", type=positive_float, default=None, metavar="S",
                        help="seconds to wait while another process locks the database (default: "
                             "$NF4TUNE_LOCK_TIMEOUT, else 30); a line on stderr after 2 s, exit 2 when it runs out")


def add_family_arg(parser) -> None:
    parser.add_argument("--family", default="dequant", choices=list(FAMILIES),
                        help="kernel family (default dequant): " +
                             "; ".join(f"{f.name}: {f.title}" for f in FAMILIES.values()))


def add_problem_args(parser, shape_required: bool = False, many_dtypes: bool = False) -> None:
    parser.add_argument("--shape", action="append", default=[], type=shape_arg, metavar="RxC", required=shape_required,
                        help="weight shape (rows x columns; for matmul N x K = out x in features), repeatable")
    if many_dtypes:
        parser.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable (default bf16)")
    else:
        parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--quant", default="nf4", choices=QUANTS)
    parser.add_argument("--blocksize", type=int, default=64, choices=BLOCKSIZES)
    add_family_arg(parser)
    parser.add_argument("--m", action="append", type=int, choices=M_BUCKETS, metavar="M",
                        help=f"matmul family: batch rows of A, one of {', '.join(map(str, M_BUCKETS))}; repeatable "
                             "(default 1)")


def add_model_args(parser) -> None:
    """--model CONFIG.json (repeatable) and --tp N: the shapes of whole models."""
    parser.add_argument("--model", action="append", default=[], metavar="CONFIG.json",
                        help="a Hugging Face config.json (llama, mistral, qwen2, qwen3, mixtral): every distinct 4-bit "
                             "weight shape of the model [out_features x in_features]: q, k, v, o, gate, up, down "
                             "(Mixtral: the experts' w1, w3, w2 and the router); not lm_head, which QLoRA keeps in "
                             "16 bits. Repeatable; combines with --shape (examples under examples/models/)")
    parser.add_argument("--tp", type=positive_int, default=1, metavar="N",
                        help="with --model: the shapes on one of N tensor-parallel GPUs (q, k, v, gate, up split "
                             "their rows, o and down their columns); refused where N does not split the heads or "
                             "the intermediate size evenly (default 1)")


def models_from_args(args) -> list:
    """The :class:`nf4tune.tune.models.ModelShapes` of every --model (UserError for a config that
    cannot be read or split by --tp)."""
    from ..tune.models import ModelError, model_shapes

    paths = getattr(args, "model", None) or []
    tp = getattr(args, "tp", 1)
    if tp != 1 and not paths:
        raise UserError(f"--tp {tp} splits the shapes of a --model CONFIG.json; give one")
    try:
        return [model_shapes(p, tp) for p in paths]
    except ModelError as e:
        raise UserError(str(e)) from None


def problems_from_args(args, shapes=None) -> list[Problem]:
    """Every problem the arguments name ((--shape and --model shapes) x dtype x m, each shape
    once), checked by its family. ``shapes`` replaces --shape (not --model)."""
    family = get_family(args.family)
    dtypes = args.dtype if isinstance(args.dtype, list) else [args.dtype or "bf16"]
    dtypes = dtypes or ["bf16"]
    ms = args.m or ([1] if family.name != "dequant" else [None])
    if family.name == "dequant" and args.m:
        raise UserError("--m is for the matmul family (the dequant family has no batch)")
    shapes = list(shapes if shapes is not None else args.shape)
    for model in models_from_args(args):
        shapes += model.shape_tuples()
    out = []
    for shape in dict.fromkeys(tuple(s) for s in shapes):
        for d in dtypes:
            for m in ms:
                p = Problem(tuple(shape), d, args.quant, args.blocksize, family.name, m)
                try:
                    family.check_problem(p)
                except ValueError as e:
                    raise UserError(str(e)) from None
                out.append(p)
    return out


def load_config_text(option: str, text: str) -> dict:
    """A config given as JSON or as ``@file.json``: the dict, or a UserError naming the option."""
    origin = text
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as e:
            raise UserError(f"{option} {origin}: cannot read {path}: {e.strerror or e}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{option} {origin!r} is not valid JSON ({e}); give an object like "
                        "'{\"threads\": 128}' or @file.json") from None
    if not isinstance(d, dict):
        raise UserError(f"{option} {origin!r} must be a JSON object of knob: value")
    return d


def config_from_option(family, option: str, text: str, problem_values: dict):
    d = load_config_text(option, text)
    for k, v in problem_values.items():
        d.setdefault(k, v)
        if d[k] != v:
            raise UserError(f"{option} {text}: {k}={d[k]!r} does not match the problem's {k} {v!r}")
    try:
        return family.from_dict(d)
    except InvalidConfig as e:
        raise UserError(f"{option} {text}: {e}") from None


def require_gpu():
    from ..kernel.gpu import NoGPUError, require_gpu as _require

    try:
        return _require()
    except NoGPUError as e:
        raise CannotRun(str(e)) from None


def open_repo(url, read_only: bool):
    from nf4tune.db import resolve_url
    from nf4tune.db._engine import DatabaseError

    from ..measure.record import open_repository

    try:
        return open_repository(resolve_url(url), must_exist=read_only)
    except DatabaseError as e:
        raise CannotRun(str(e)) from None


def progress_printer(label: str, stream=None):
    state = {"last": -1}
    stream = stream or sys.stderr

    def show(done: int, total: int):
        pct = int(100 * done / max(total, 1))
        if pct != state["last"] or done == total:
            state["last"] = pct
            end = "\n" if done == total else "\r"
            print(f"{label}: {done}/{total} ({pct}%)", end=end, file=stream, flush=True)

    return show


def fmt(v, f, none="-"):
    return (f % v) if v is not None else none


def write_json(path, payload) -> None:
    from .._files import atomic_write

    atomic_write(path, json.dumps(payload))


def output_file(path):
    """An -o FILE argument checked before any work (a regular file or a new one)."""
    from .._files import OutputPathError, check_output_file

    if path is None:
        return None
    try:
        check_output_file(path)
    except OutputPathError as e:
        raise UserError(str(e)) from None
    return path


def command_line(argv=None) -> str:
    return "nf4-tune " + " ".join(sys.argv[1:] if argv is None else argv)
