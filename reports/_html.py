"""Draw it: plotly figures and a static page from :class:`reports._data.ReportData`."""

from __future__ import annotations

import html
import json
from pathlib import Path

from tuner._files import atomic_write

from ._data import ReportData


def _fig_div(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def _history_fig(points: list, title: str):
    import plotly.graph_objects as go

    runs = [p["run"] for p in points]
    fig = go.Figure()
    tuned = [p["tuned_us"] for p in points]
    iqr = [p.get("iqr") or 0 for p in points]
    fig.add_trace(go.Scatter(x=runs + runs[::-1], y=[t + i / 2 for t, i in zip(tuned, iqr)] +
                             [t - i / 2 for t, i in zip(tuned, iqr)][::-1], fill="toself", line=dict(width=0),
                             name="tuned IQR", opacity=0.3))
    fig.add_trace(go.Scatter(x=runs, y=tuned, mode="lines+markers", name="tuned kernel"))
    fig.add_trace(go.Scatter(x=runs, y=[p.get("bnb_us") for p in points], mode="lines+markers", name="bnb"))
    flagged = [p for p in points if p.get("flag") not in (None, "ok")]
    if flagged:
        fig.add_trace(go.Scatter(x=[p["run"] for p in flagged], y=[p["tuned_us"] for p in flagged],
                                 mode="markers+text", text=[p["flag"] for p in flagged], textposition="top center",
                                 marker=dict(symbol="x", size=14, color="#c00"), name="flagged"))
    fig.update_layout(title=title, xaxis_title="run", yaxis_title="us (median)", height=320)
    return fig


def _study_figs(study: dict):
    import plotly.graph_objects as go

    done = [t for t in study["trials"] if t["value"] is not None]
    best, best_so_far = float("inf"), []
    for t in sorted(study["trials"], key=lambda t: t["number"]):
        if t["value"] is not None:
            best = min(best, t["value"])
        best_so_far.append(best if best < float("inf") else None)
    f1 = go.Figure()
    f1.add_trace(go.Scatter(x=[t["number"] for t in done], y=[t["value"] for t in done], mode="markers", name="trial"))
    f1.add_trace(go.Scatter(x=sorted(t["number"] for t in study["trials"]), y=best_so_far, mode="lines",
                            name="best so far"))
    f1.update_layout(title=f"{study['name']}: trials", xaxis_title="trial", yaxis_title="us", height=300)
    params = sorted({k for t in done for k in t["params"]})
    dims = []
    for p in params:
        values = sorted({str(t["params"].get(p)) for t in done})
        dims.append(dict(label=p, values=[values.index(str(t["params"].get(p))) for t in done],
                         tickvals=list(range(len(values))), ticktext=values))
    f2 = go.Figure(go.Parcoords(line=dict(color=[t["value"] for t in done], colorscale="Viridis_r", showscale=True),
                                dimensions=dims)) if dims else None
    if f2 is not None:
        f2.update_layout(title="parallel coordinates (colour: us)", height=320)
    f3 = None
    if study.get("importance"):
        imp = sorted(study["importance"].items(), key=lambda kv: kv[1])
        f3 = go.Figure(go.Bar(x=[v for _, v in imp], y=[k for k, _ in imp], orientation="h"))
        f3.update_layout(title="parameter importance (fANOVA)", height=260, xaxis_title="importance")
    return f1, f2, f3


def _knob_heatmap(knob_speed: list):
    import plotly.graph_objects as go

    cells: dict = {}
    for problem, knob, value, us in knob_speed:
        cells.setdefault((knob, value), {}).setdefault(problem, []).append(us)
    problems = sorted({k[0] for k in knob_speed})
    rows = sorted(cells)
    z = []
    for r in rows:
        row = []
        for p in problems:
            us = cells[r].get(p)
            row.append(min(us) if us else None)
        z.append(row)
    # normalise per problem: best us of the knob value / best us of the problem
    for j, p in enumerate(problems):
        best = min((z[i][j] for i in range(len(rows)) if z[i][j] is not None), default=None)
        for i in range(len(rows)):
            if z[i][j] is not None and best:
                z[i][j] = z[i][j] / best
    fig = go.Figure(go.Heatmap(z=z, x=problems, y=[f"{k}={v}" for k, v in rows], colorscale="RdYlGn_r",
                               colorbar=dict(title="best us / problem best")))
    fig.update_layout(title="knob values: best time relative to the problem's best", height=max(300, 18 * len(rows)))
    return fig


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222} table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px} th{background:#f3f3f3}
.flag-ok{background:#d9f2d9} .flag-bad{background:#f8d0d0;font-weight:bold} .flag-warn{background:#fde9b8}
.flag-none{color:#888} h2{margin-top:2em} .changes{font-size:12px;color:#633}
"""


# The page checks itself (what the headless-browser test reads): script errors and console.error
# calls are collected from the start, and once loaded the body records how many charts exist
# and how many plotly rendered.
_ERROR_TRAP = ("window.__nf4tuneErrors=[];window.addEventListener('error',function(e){"
               "window.__nf4tuneErrors.push(String(e.message||e));});(function(){var c=console.error;"
               "console.error=function(){window.__nf4tuneErrors.push(Array.prototype.join.call(arguments,' '));"
               "return c.apply(console,arguments);};})();")
_SELF_CHECK = ("window.addEventListener('load',function(){setTimeout(function(){var b=document.body;"
               "b.dataset.chartsExpected=document.querySelectorAll('.plotly-graph-div').length;"
               "b.dataset.chartsRendered=document.querySelectorAll('.js-plotly-plot .main-svg').length>0?"
               "Array.prototype.filter.call(document.querySelectorAll('.plotly-graph-div'),function(d){"
               "return d.querySelector('.main-svg')!==null;}).length:0;"
               "b.dataset.errors=JSON.stringify(window.__nf4tuneErrors);b.dataset.checked='1';},500);});")

from tuner.vocabulary import FAILING_FLAGS as _FAILING   # the flags that fail a night


def _flag_class(flag) -> str:
    if flag is None:
        return "flag-none"
    if flag in _FAILING:
        return "flag-bad"
    return "flag-ok" if flag == "ok" else "flag-warn"


def _nightly_cells(n) -> str:
    if not n:
        return "<td class='flag-none'>not run</td><td>-</td>"
    text = html.escape(n["flag"])
    notes = []
    if n.get("reason"):
        notes.append(html.escape(n["reason"]))
    if n.get("drop") is not None and n.get("threshold") is not None:
        notes.append(f"drop {100 * n['drop']:.1f}% (limit {100 * n['threshold']:.1f}%)")
    for k, (a, b) in (n.get("changes") or {}).items():
        notes.append(f"changed: {html.escape(str(k))} {html.escape(str(a))} &rarr; {html.escape(str(b))}")
    extra = f"<div class='changes'>{'<br>'.join(notes)}</div>" if notes else ""
    x = f"{n['speedup']:.2f}" if n.get("speedup") is not None else "-"
    return f"<td class='{_flag_class(n['flag'])} nightly' data-flag='{text}'>{text} (run {n['run']}){extra}</td><td>{x}</td>"


def build_report(data: ReportData, out_dir) -> Path:
    """Write the static site into ``out_dir`` (created; an existing index.html is replaced
    atomically). Returns the path of index.html."""
    from plotly.offline import get_plotlyjs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "plotly.min.js", get_plotlyjs())
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>nf4-tune report</title>"
             f"<style>{_STYLE}</style><script>{_ERROR_TRAP}</script><script src='plotly.min.js'></script></head><body>",
             "<h1>nf4-tune report</h1>", "<h2>Overview</h2>",
             "<table id='overview'><tr><th>GPU</th><th>problem</th><th>best us</th><th>bnb us</th><th>x bnb</th>"
             "<th>% of copy</th><th>status</th><th>nightly</th><th>nightly x bnb</th><th>valid / invalid</th>"
             "<th>best config</th></tr>"]
    fmt = lambda v, f: (f % v) if v is not None else "-"
    for r in data.overview:
        cls = "flag-ok" if r["status"] == "ok" else "flag-bad"
        cfg = html.escape(json.dumps(r["config"], sort_keys=True)) if r["config"] else "-"
        parts.append(f"<tr><td>{html.escape(r['gpu'])}</td><td>{html.escape(r['problem'])}</td>"
                     f"<td>{fmt(r['best_us'], '%.2f')}</td><td>{fmt(r['bnb_us'], '%.2f')}</td>"
                     f"<td>{fmt(r['speedup'], '%.2f')}</td><td>{fmt(r['pct_copy'], '%.1f')}</td>"
                     f"<td class='{cls}'>{html.escape(r['status'])}</td>{_nightly_cells(r.get('nightly'))}"
                     f"<td>{r['measured']} / {r['invalid']}</td>"
                     f"<td><code>{cfg}</code></td></tr>")
    parts.append("</table>")
    raised = [f for f in data.flags if f["flag"] != "ok"]
    parts.append(f"<h2>Nightly flags</h2><p>{len(data.flags)} nightly verdict(s), {len(raised)} raised.</p>")
    if raised:
        parts.append("<table id='flags'><tr><th>run</th><th>GPU</th><th>problem</th><th>flag</th><th>x bnb</th>"
                     "<th>baseline x bnb</th><th>drop / limit</th><th>p</th><th>reason</th><th>changed since the baseline</th></tr>")
        for f in raised:
            dl = (f"{100 * f['drop']:.1f}% / {100 * f['threshold']:.1f}%" if f.get("drop") is not None
                  and f.get("threshold") is not None else "-")
            ch = "<br>".join(f"{html.escape(str(k))}: {html.escape(str(a))} &rarr; {html.escape(str(b))}"
                             for k, (a, b) in (f.get("changes") or {}).items()) or "-"
            parts.append(f"<tr><td>{f['run']}</td><td>{html.escape(f['gpu'])}</td><td>{html.escape(f['problem'])}</td>"
                         f"<td class='{_flag_class(f['flag'])}'>{html.escape(f['flag'])}</td>"
                         f"<td>{fmt(f.get('speedup'), '%.3f')}</td><td>{fmt(f.get('baseline_speedup'), '%.3f')}</td>"
                         f"<td>{dl}</td><td>{fmt(f.get('p_value'), '%.1e')}</td><td>{html.escape(f.get('reason') or '')}</td>"
                         f"<td>{ch}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>History</h2>")
    for i, ((gname, label), points) in enumerate(sorted(data.history.items())):
        if points:
            parts.append(_fig_div(_history_fig(points, f"{gname}: {label}"), f"history-{i}"))
    if data.studies:
        parts.append("<h2>Searches</h2>")
        # parallel coordinates draw with WebGL, and a browser keeps only ~16 WebGL contexts: one
        # chart, with a study selector, instead of one chart per study
        parcoords = []
        for i, st in enumerate(data.studies):
            f1, f2, f3 = _study_figs(st)
            if f2 is not None:
                parcoords.append((st["name"], f2))
        if parcoords:
            options = "".join(f"<option value='{i}'>{html.escape(name)}</option>" for i, (name, _) in enumerate(parcoords))
            figs = json.dumps([json.loads(f.to_json()) for _, f in parcoords])
            parts.append("<h3>Parallel coordinates</h3><label>study <select id='parcoords-select'>" + options +
                         "</select></label>" + _fig_div(parcoords[0][1], "parcoords-0") +
                         f"<script>window.__nf4tuneParcoords={figs};document.getElementById('parcoords-select')"
                         ".addEventListener('change',function(e){var f=window.__nf4tuneParcoords[+e.target.value];"
                         "Plotly.react('parcoords-0',f.data,f.layout);});</script>")
        for i, st in enumerate(data.studies):
            f1, _, f3 = _study_figs(st)
            parts.append(f"<h3>{html.escape(st['name'])}</h3>" + _fig_div(f1, f"study-{i}"))
            if f3 is not None:
                parts.append(_fig_div(f3, f"importance-{i}"))
    if data.knob_speed:
        parts.append("<h2>Knobs</h2>" + _fig_div(_knob_heatmap(data.knob_speed), "knob-heatmap"))
    parts.append("<h2>Environments</h2><table id='environments'><tr>" +
                 "".join(f"<th>{h}</th>" for h in ("run", "kind", "started", "commit", "nvrtc", "driver",
                                                   "cuda-python", "bnb", "torch")) + "</tr>")
    for e in data.environments:
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(e.get(k, '-')))}</td>" for k in (
            "run", "kind", "started", "git_commit", "nvrtc", "driver", "cuda_python", "bnb", "torch")) + "</tr>")
    parts.append(f"</table><script>{_SELF_CHECK}</script></body></html>")
    return atomic_write(out / "index.html", "\n".join(parts))
