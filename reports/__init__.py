"""Static, offline HTML reports of an nf4-tune database (plotly).

Split as optuna splits its plots: :mod:`reports._data` gets plain data out of the database
(through :class:`db.Repository` only), :mod:`reports._html` draws it, :mod:`reports._tables`
writes its tables as CSV and JSON. :func:`build_report` writes ``index.html`` with
``plotly.min.js`` and the downloads beside it, so the page opens with no network.
"""

from ._data import ReportData, collect
from ._html import build_report, report_files

__all__ = ["ReportData", "collect", "build_report", "report_files"]
