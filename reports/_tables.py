"""The report's tables as downloads beside index.html: the overview, the flags and the history,
each as CSV and JSON (written atomically). CSV cells that a spreadsheet would read as a formula
(text starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) are prefixed with ``'``."""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from pathlib import Path

from nf4tune._files import publish_files

from ._data import ReportData, to_plain

#: the tables written beside index.html, each as NAME.csv and NAME.json
TABLES = ("overview", "flags", "history")

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """One CSV cell: numbers as they are (a negative number stays a number), text defused
    against formula injection (OWASP: a leading ``'``); ``nan`` and ``inf`` are text."""
    if value is None:
        return ""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return repr(float(value))
    if isinstance(value, (dict, list)):
        value = json.dumps(to_plain(value), sort_keys=True)
    text = str(float(value)) if isinstance(value, numbers.Real) else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _history_rows(data: ReportData) -> list:
    rows = []
    for key, e in data.history.items():
        common = dict(key=key, gpu=e["gpu"], family=e["family"], problem=e["problem"], peer=e["peer"])
        for n in e["nights"]:
            rows.append(dict(common, run=n["run"], kind="regress", date=n["date"], commit=n["commit"],
                             status=n["status"], flag=n["flag"], tuned_us=n["tuned_us"],
                             tuned_iqr_us=n["tuned_iqr_us"], peer_us=n["peer_us"], peer_iqr_us=n["peer_iqr_us"],
                             speedup=n["speedup"], baseline_speedup=n["baseline_speedup"],
                             band_lo=n["band_lo"], band_hi=n["band_hi"], limit_speedup=n["limit_speedup"],
                             config=n["config_label"], label=None, samples=n["tuned_samples"]))
        for o in e["others"]:
            rows.append(dict(common, run=o["run"], kind=o["kind"], date=o["date"], commit=o["commit"], status=None,
                             flag=None, tuned_us=o["tuned_us"], tuned_iqr_us=o["tuned_iqr_us"], peer_us=o["peer_us"],
                             peer_iqr_us=None, speedup=o["speedup"], baseline_speedup=None, band_lo=None,
                             band_hi=None, limit_speedup=None, config=o["config_label"], label=o["label"],
                             samples=o["samples"]))
    rows.sort(key=lambda r: (r["family"], r["gpu"], r["key"], r["run"]))
    return rows


def tables(data: ReportData) -> dict:
    """name -> list of rows (dicts of plain values)."""
    return dict(overview=[dict(r) for r in data.overview], flags=[dict(f) for f in data.flags],
                history=_history_rows(data))


def _csv(rows: list) -> str:
    cols: list = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([csv_cell(r.get(c)) for c in cols])
    return buf.getvalue()


def table_files(data: ReportData) -> dict:
    """File name -> text: NAME.csv and NAME.json for each table."""
    files = {}
    meta = to_plain(data.meta)
    for name, rows in tables(data).items():
        files[f"{name}.csv"] = _csv(rows)
        files[f"{name}.json"] = json.dumps(dict(meta=meta, rows=to_plain(rows)), indent=1)
    return files


def write_tables(data: ReportData, out: Path) -> list:
    """Write NAME.csv and NAME.json for each table into ``out`` (:func:`nf4tune._files.publish_files`);
    the paths written."""
    return publish_files(out, table_files(data))
