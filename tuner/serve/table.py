"""Which config serves a problem: the table of tuned configs and the choice among them.

A table holds entries ``{gpu, family, shape, dtype, quant, blocksize, m, config}``, read from a
JSON file written by ``nf4-tune export`` (the runtime never opens a database: ``export`` turns one
into a table). The serving table is, in this order: what :func:`use_configs` was given;
``$NF4TUNE_CONFIGS``; the table shipped with the package (``serve/tuned_configs.json``); with the
per-user table (:func:`user_table_path`, what opt-in autotuning wrote) laid over it: its entries win
where both hold a problem. The per-user table is the one table ``nf4-tune export`` does not write.

Dequant (bit-exact, so any config is correct) takes the exact entry, else the nearest tuned problem
of the same dtype and quant type on that GPU (:meth:`nf4tune.vocabulary.Problem.distance`), else the
family's built-in default (:meth:`ConfigTable.choose`). The matmul runtime serves only what was
measured faster than bnb: the exact entry, else a transfer from the nearest tuned neighbours
(:meth:`ConfigTable.transfer`), else bnb.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..families import get as get_family
from ..vocabulary import InvalidConfig, Problem

__all__ = ["Choice", "ConfigTable", "PACKAGED_TABLE", "TABLE_FORMAT", "use_configs", "current_table",
           "choose_config", "on_change", "table_document", "entry_key", "read_table_entries",
           "user_table_path", "reload_user_table", "shape_distance"]

PACKAGED_TABLE = Path(__file__).with_name("tuned_configs.json")
#: 1: dequant entries only (no family, no m); 2: every family
TABLE_FORMAT = 2


@dataclass(frozen=True)
class Choice:
    config: object                    # a nf4tune.family.Config, or None when bnb's own path serves
    source: str                       # "exact", "nearest", "transfer", "default" or "bnb"
    tuned_for: Optional[str] = None   # the problem of the table entry used
    table: str = ""
    note: str = ""

    def describe(self) -> str:
        if self.config is None:
            return f"{self.source}: {self.note}"
        where = f" ({self.tuned_for} in {self.table})" if self.tuned_for else ""
        return f"{self.source}{where}: {self.config.short()}" + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True)
class Entry:
    gpu: str
    problem: Problem
    config: object
    median_us: Optional[float] = None
    speedup_vs_bnb: Optional[float] = None
    table: str = ""                   # the file it was read from


def shape_distance(a: Problem, b: Problem) -> tuple:
    """How far weight shape ``b`` is from ``a``: the sum of the log distances of each dimension (a
    weight of other rows and columns is another launch geometry even at the same size), then the
    blocksize on a log scale."""
    return (sum(abs(math.log(x) - math.log(y)) for x, y in zip(a.shape, b.shape)) if len(a.shape) == len(b.shape)
            else math.inf, abs(math.log2(a.blocksize) - math.log2(b.blocksize)), b.shape)


class ConfigTable:
    """Tuned entries and the choice among them."""

    def __init__(self, entries: list, origin: str):
        self.origin = origin
        self.entries: list[Entry] = []
        for e in entries:
            try:
                family = get_family(e.get("family", "dequant"))
                problem = Problem(tuple(int(d) for d in e["shape"]), e["dtype"], e["quant"], int(e["blocksize"]),
                                  family.name, e.get("m"))
                cfg = family.from_dict(e["config"])
                self.entries.append(Entry(e["gpu"], problem, cfg, e.get("median_us"), e.get("speedup_vs_bnb"),
                                          origin))
            except (KeyError, TypeError, ValueError, InvalidConfig) as err:
                raise ValueError(f"{origin}: bad entry {e!r}: {err}") from None

    def overlaid(self, top: "ConfigTable") -> "ConfigTable":
        """This table with ``top``'s entries laid over it: where both hold a (GPU, problem), ``top``'s."""
        out = ConfigTable([], f"{top.origin} over {self.origin}")
        mine = {(e.gpu, e.problem) for e in top.entries}
        out.entries = list(top.entries) + [e for e in self.entries if (e.gpu, e.problem) not in mine]
        return out

    @classmethod
    def from_file(cls, path) -> "ConfigTable":
        return cls(read_table_document(path)["entries"], str(path))

    def comparable(self, gpu: str, problem: Problem) -> list:
        """The entries ``choose`` picks from for ``problem`` on GPU model ``gpu``: that GPU's entries of
        the problem's family, dtype and quant (any shape, blocksize and batch)."""
        return [e for e in self.entries if e.gpu == gpu and e.problem.family == problem.family
                and e.problem.dtype == problem.dtype and e.problem.quant == problem.quant]

    def choose(self, gpu: str, problem: Problem) -> Choice:
        same = self.comparable(gpu, problem)
        for e in same:
            if e.problem == problem:
                return Choice(e.config, "exact", e.problem.label(), self.origin)
        if same:
            e = min(same, key=lambda e: problem.distance(e.problem))
            return Choice(get_family(problem.family).for_problem(e.config, problem), "nearest", e.problem.label(),
                          self.origin)
        return Choice(get_family(problem.family).builtin_default(problem), "default", None, self.origin)

    def entry(self, gpu: str, problem: Problem) -> Optional[Entry]:
        return next((e for e in self.entries if e.gpu == gpu and e.problem == problem), None)

    def neighbours(self, gpu: str, problem: Problem, any_bucket: bool = False) -> list:
        """The entries a transfer to ``problem`` may take from, nearest first: tuned on that GPU model for
        the same family, dtype, quant type and batch bucket (``any_bucket``: any bucket, the problem's first,
        then the nearest), another problem, and measured faster than bnb."""
        near = [e for e in self.entries if e.gpu == gpu and e.problem.family == problem.family
                and e.problem.dtype == problem.dtype and e.problem.quant == problem.quant
                and (any_bucket or e.problem.m == problem.m) and e.problem != problem
                and e.speedup_vs_bnb is not None and e.speedup_vs_bnb > 1.0]
        return sorted(near, key=lambda e: (e.problem.m != problem.m,
                                           abs((e.problem.m or 1).bit_length() - (problem.m or 1).bit_length()),
                                           shape_distance(problem, e.problem)))

    def fitting(self, gpu: str, problem: Problem, accepts, any_bucket: bool = False):
        """(entry, its config carried over to the problem's problem knobs) of each neighbour
        (:meth:`neighbours`) whose config ``accepts(config)`` takes (True, or the reason it refuses: the
        launch plan's verdict), nearest first."""
        family = get_family(problem.family)
        for e in self.neighbours(gpu, problem, any_bucket):
            try:
                config = family.for_problem(e.config, problem)
            except InvalidConfig:
                continue
            if accepts(config) is True:
                yield e, config

    def transfer(self, gpu: str, problem: Problem, accepts) -> Optional[Choice]:
        """The config of the nearest neighbour of the same batch bucket whose launch plan accepts ``problem``
        (:meth:`fitting`); None when no neighbour's config fits, and for a batch bucket above
        :data:`TRANSFER_MAX_M`. Never a hand-written rule per shape."""
        if not transfers_at(problem):
            return None
        for e, config in self.fitting(gpu, problem, accepts):
            return Choice(config, "transfer", e.problem.label(), e.table,
                          f"{e.speedup_vs_bnb:.2f}x bnb on {e.problem.shape_text}")
        return None


#: The largest batch bucket a transfer serves. On an H100 (2026-12-07, `nf4-tune bench --family matmul --runtime`,
#: the packaged table) every transfer at M = 1..32 ran 1.14-2.74x bnb, and at M = 64 0.55-1.25x: there the tuned
#: entries lead bnb's dequantize-and-cuBLAS path by little (1.3-1.7x) and a neighbour's tile does not carry over,
#: whether the neighbour led by 1.3x (0.81x served) or by 1.7x (0.55x and 0.83x served). Above it, bnb serves
#: what has no entry of its own; autotuning can still find one.
TRANSFER_MAX_M = 32


def transfers_at(problem: Problem) -> bool:
    """Whether a transfer may serve ``problem``'s batch bucket (at most :data:`TRANSFER_MAX_M`)."""
    return (problem.m or 1) <= TRANSFER_MAX_M


def user_table_path() -> Path:
    """The per-user table: what opt-in autotuning found on this machine (``$NF4TUNE_AUTOTUNE_TABLE``, else
    ``$XDG_CACHE_HOME/nf4-tune/autotuned.json``, else ``~/.cache/nf4-tune/autotuned.json``). It is laid
    over the serving table; ``nf4-tune export`` never writes it."""
    if os.environ.get("NF4TUNE_AUTOTUNE_TABLE"):
        return Path(os.environ["NF4TUNE_AUTOTUNE_TABLE"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "nf4-tune" / "autotuned.json"


def read_table_document(path) -> dict:
    """The content of the table file ``path`` (what :func:`table_document` makes), checked: a ValueError that
    says why for a file that cannot be read, a database, or anything that is no table of a known format."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the config table {path}: {e}") from None
    if raw.startswith(b"SQLite format 3\0"):
        raise ValueError(f"{path} is a database, not a table written by `nf4-tune export` (`nf4-tune export "
                         f"--db {path} -o TABLE.json` makes one)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the config table {path}: {e}") from None
    if (not isinstance(data, dict) or data.get("format") not in (1, TABLE_FORMAT)
            or not isinstance(data.get("entries"), list)):
        raise ValueError(f"{path} is not a table written by `nf4-tune export` (format 1 or {TABLE_FORMAT})")
    return data


def read_table_entries(path) -> list:
    """The entries of the table file ``path`` as written (dicts), each checked as the runtime reads it: a
    ValueError that says why otherwise."""
    entries = list(read_table_document(path)["entries"])
    ConfigTable(entries, str(path))
    return entries


def entry_key(e: dict) -> tuple:
    """What a table entry (a dict as a table file holds it) is for: its GPU model and problem. Two entries of one
    key are the same (GPU, problem); laying tables over each other keeps one of each."""
    return (e["gpu"], e.get("family", "dequant"), tuple(e["shape"]), e["dtype"], e["quant"], e["blocksize"],
            e.get("m"))


def table_document(entries: list) -> dict:
    """The content of a table file holding ``entries`` (what ``nf4-tune export`` writes)."""
    return dict(format=TABLE_FORMAT, entries=list(entries))


_lock = threading.Lock()
_table: Optional[ConfigTable] = None        # what serves: _base with the per-user table laid over it
_base: Optional[ConfigTable] = None
_listeners: list = []


def on_change(fn) -> None:
    """Call ``fn()`` whenever the serving table changes (the runtimes drop their plans)."""
    _listeners.append(fn)


def use_configs(source=None) -> ConfigTable:
    """Serve from ``source``: a table file written by ``nf4-tune export`` (a path), or a
    :class:`ConfigTable`; None goes back to ``$NF4TUNE_CONFIGS`` / the packaged table. Later calls
    choose again."""
    global _table, _base
    with _lock:
        _base = None if source is None else _load(source)
        _table = None
        table = _current_locked()
    for fn in _listeners:
        fn()
    return table


def _load(source) -> ConfigTable:
    if isinstance(source, ConfigTable):
        return source
    return ConfigTable.from_file(source)


def _current_locked() -> ConfigTable:
    global _table, _base
    if _table is None:
        if _base is None:
            _base = ConfigTable.from_file(os.environ.get("NF4TUNE_CONFIGS") or PACKAGED_TABLE)
        _table = _base
        user = user_table_path()
        if user.is_file():
            try:
                _table = _base.overlaid(ConfigTable.from_file(user))
            except ValueError as e:
                import warnings

                warnings.warn(f"nf4-tune: the per-user table is ignored: {e} (remove {user}, or autotune again)",
                              RuntimeWarning, stacklevel=3)
    return _table


def reload_user_table() -> ConfigTable:
    """Read the per-user table again (after autotuning wrote it); the runtimes drop their decisions."""
    global _table
    with _lock:
        _table = None
        table = _current_locked()
    for fn in _listeners:
        fn()
    return table


def current_table() -> ConfigTable:
    with _lock:
        return _current_locked()


def choose_config(gpu: str, problem: Problem) -> Choice:
    """The config the runtime serves for ``problem`` on GPU model ``gpu``."""
    return current_table().choose(gpu, problem)
