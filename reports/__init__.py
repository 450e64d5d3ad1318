"""Static, offline HTML reports of an nf4-tune database (plotly).

Split as optuna splits its plots: :mod:`reports._data` gets plain data out of the database,
:mod:`reports._html` draws it. :func:`build_report` writes ``index.html`` with ``plotly.min.js``
beside it, so the page opens with no network.
"""

from ._data import ReportData, collect
from ._html import build_report

__all__ = ["ReportData", "collect", "build_report"]
