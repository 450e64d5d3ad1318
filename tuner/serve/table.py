"""Which config serves a problem: the table of tuned configs and the choice among them.

A table holds entries ``{gpu, family, shape, dtype, quant, blocksize, m, config}``, read from a
JSON file written by ``nf4-tune export`` (the runtime never opens a database: ``export`` turns one
into a table). For a problem on a GPU model it takes the exact entry, else the nearest tuned
problem of the same family, dtype and quant type on that GPU
(:meth:`nf4tune.vocabulary.Problem.distance`), else the family's built-in default. The serving
source is, in this order: what :func:`use_configs` was given; ``$NF4TUNE_CONFIGS``; the table
shipped with the package (``serve/tuned_configs.json``).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..families import get as get_family
from ..vocabulary import InvalidConfig, Problem

__all__ = ["Choice", "ConfigTable", "PACKAGED_TABLE", "TABLE_FORMAT", "use_configs", "current_table",
           "choose_config", "on_change", "table_document"]

PACKAGED_TABLE = Path(__file__).with_name("tuned_configs.json")
#: 1: dequant entries only (no family, no m); 2: every family
TABLE_FORMAT = 2


@dataclass(frozen=True)
class Choice:
    config: object                    # a nf4tune.family.Config, or None when bnb's own path serves
    source: str                       # "exact", "nearest", "default" or "bnb"
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
                self.entries.append(Entry(e["gpu"], problem, cfg, e.get("median_us"), e.get("speedup_vs_bnb")))
            except (KeyError, TypeError, ValueError, InvalidConfig) as err:
                raise ValueError(f"{origin}: bad entry {e!r}: {err}") from None

    @classmethod
    def from_file(cls, path) -> "ConfigTable":
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
        return cls(data["entries"], str(path))

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


def table_document(entries: list) -> dict:
    """The content of a table file holding ``entries`` (what ``nf4-tune export`` writes)."""
    return dict(format=TABLE_FORMAT, entries=list(entries))


_lock = threading.Lock()
_table: Optional[ConfigTable] = None
_listeners: list = []


def on_change(fn) -> None:
    """Call ``fn()`` whenever the serving table changes (the runtimes drop their plans)."""
    _listeners.append(fn)


def use_configs(source=None) -> ConfigTable:
    """Serve from ``source``: a table file written by ``nf4-tune export`` (a path), or a
    :class:`ConfigTable`; None goes back to ``$NF4TUNE_CONFIGS`` / the packaged table. Later calls
    choose again."""
    global _table
    with _lock:
        _table = None if source is None else _load(source)
        table = _current_locked()
    for fn in _listeners:
        fn()
    return table


def _load(source) -> ConfigTable:
    if isinstance(source, ConfigTable):
        return source
    return ConfigTable.from_file(source)


def _current_locked() -> ConfigTable:
    global _table
    if _table is None:
        if os.environ.get("NF4TUNE_CONFIGS"):
            _table = ConfigTable.from_file(os.environ["NF4TUNE_CONFIGS"])
        else:
            _table = ConfigTable.from_file(PACKAGED_TABLE)
    return _table


def current_table() -> ConfigTable:
    with _lock:
        return _current_locked()


def choose_config(gpu: str, problem: Problem) -> Choice:
    """The config the runtime serves for ``problem`` on GPU model ``gpu``."""
    return current_table().choose(gpu, problem)
