"""Draw it: plotly figures and a static page from :class:`reports._data.ReportData`.

Every value from the database reaches the page through one of three escapes: :func:`h` for
HTML text and attributes, :func:`script_json` for data embedded in a ``<script>`` (``<``, ``>``,
``&``, U+2028 and U+2029 as ``\\uXXXX``, so no value can close the script or start a comment),
and :func:`pt` for text that plotly renders (plotly reads a few HTML tags in its labels, so the
text is HTML-escaped before it becomes JSON). Figures are built with plotly.graph_objects,
serialised without their template, and drawn by one small script with one shared template.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from pathlib import Path

from nf4tune._files import publish_files

from nf4tune.vocabulary import FLAGS

from ._data import MIN_SAMPLES, NOT_JUDGED, ReportData, status_kind
from ._tables import TABLES, table_files

# -- escaping ----------------------------------------------------------------------------------
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for ch, esc in _SCRIPT_ESCAPES.items():
        text = text.replace(ch, esc)
    return text


def h(value) -> str:
    """HTML text or attribute value."""
    return html.escape("" if value is None else str(value), quote=True)


def pt(value) -> str:
    """Text that plotly draws (titles, tick labels, hover): HTML-escaped, as plotly decodes
    entities and reads tags such as <b> and <br>."""
    return html.escape("" if value is None else str(value), quote=False)


def _num(v, fmt: str = "%.2f", none: str = "-") -> str:
    return (fmt % v) if isinstance(v, (int, float)) else none


def _pct(v, none: str = "-") -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else none


def _t(when) -> str:
    """A stored time as shown: to the second."""
    return h((when or "-")[:19])


def _short(text, n: int = 160) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


# -- figures -----------------------------------------------------------------------------------
#: the linear / log switch of the trials chart (the page adds it, active on the study's scale)
SCALE_SWITCH = dict(type="buttons", direction="right", x=1, xanchor="right", y=1.18, yanchor="top", showactive=True,
                    buttons=[dict(label="linear", method="relayout", args=[{"yaxis.type": "linear"}]),
                             dict(label="log", method="relayout", args=[{"yaxis.type": "log"}])])

#: the one template every chart uses (defined once in the page)
TEMPLATE = dict(layout=dict(
    font=dict(family="system-ui, sans-serif", size=12, color="#222"),
    colorway=["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"],
    paper_bgcolor="white", plot_bgcolor="#fafafa", hovermode="closest",
    xaxis=dict(gridcolor="#e6e6e6", zerolinecolor="#ccc", automargin=True),
    yaxis=dict(gridcolor="#e6e6e6", zerolinecolor="#ccc", automargin=True),
    margin=dict(l=60, r=20, t=40, b=40), hoverlabel=dict(align="left"),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0)))

_BAD, _WARN, _OK, _PEER = "#c62828", "#e0a100", "#2e7d32", "#ff7f0e"


def _round(value, digits: int = 4):
    """Floats to ``digits`` significant digits, everywhere in a figure (what a chart can show)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v, digits) for v in value]
    return value


def fig_json(fig) -> dict:
    """A figure as plain data without its template (the page supplies the shared one)."""
    import plotly.io as pio

    d = _round(json.loads(pio.to_json(fig, validate=False, remove_uids=True)))
    d.get("layout", {}).pop("template", None)
    return dict(data=d.get("data", []), layout=d.get("layout", {}))


class FigurePack:
    """Figures as the page stores them: what is not an array (a trace's mode, names, hover
    templates, colours; a whole layout) is kept once in a shared table and referenced, as
    the histories of many problems share every style. The page merges them back (``unpack``)."""

    def __init__(self):
        self.styles: list = []
        self.layouts: list = []
        self._index: dict = {}

    def _ref(self, table: list, value) -> int:
        key = (id(table), json.dumps(value, sort_keys=True))
        if key not in self._index:
            self._index[key] = len(table)
            table.append(value)
        return self._index[key]

    @staticmethod
    def _split(node: dict) -> tuple[dict, dict]:
        style, data = {}, {}
        for k, v in node.items():
            if isinstance(v, dict):
                s, d = FigurePack._split(v)
                if s:
                    style[k] = s
                if d:
                    data[k] = d
            elif isinstance(v, list):
                data[k] = v
            else:
                style[k] = v
        return style, data

    def add(self, fig: dict) -> dict:
        traces = []
        for t in fig["data"]:
            style, data = self._split(t)
            traces.append(dict(data, _s=self._ref(self.styles, style)))
        return dict(data=traces, _l=self._ref(self.layouts, fig["layout"]))


def _band(go, x, lo, hi, name, color, row, fig, shape="linear"):
    """A filled band between ``lo`` and ``hi`` (points where either is None left out)."""
    keep = [(a, b, c) for a, b, c in zip(x, lo, hi) if b is not None and c is not None]
    if not keep:
        return
    xs = [k[0] for k in keep]
    line = dict(width=0, shape=shape)
    fig.add_trace(go.Scatter(x=xs, y=[k[2] for k in keep], mode="lines", line=line, hoverinfo="skip",
                             showlegend=False, legendgroup=name), row=row, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[k[1] for k in keep], mode="lines", line=line, fill="tonexty",
                             fillcolor=color, hoverinfo="skip", name=name, legendgroup=name), row=row, col=1)


def history_fig(entry: dict):
    """Tuned and peer times (with their IQR bands) over the dates of the runs, and below them
    x peer with the baseline band and the threshold line; None for fewer than two points."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    nights, others = entry["nights"], entry["others"]
    if len(nights) + len(others) < 2:
        return None
    peer = pt(entry["peer"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.58, 0.42], vertical_spacing=0.07)
    x = [n["date"] for n in nights]
    tuned = [n["tuned_us"] for n in nights]
    tiqr = [n["tuned_iqr_us"] or 0 for n in nights]
    piqr = [n["peer_iqr_us"] or 0 for n in nights]
    peers = [n["peer_us"] for n in nights]
    _band(go, x, [p - i / 2 if p is not None else None for p, i in zip(peers, piqr)],
          [p + i / 2 if p is not None else None for p, i in zip(peers, piqr)], f"{peer} IQR", "rgba(255,127,14,0.2)",
          1, fig)
    custom = [[pt(n["config_label"] or "-"), pt(n["commit"] or "-"), _num(n["tuned_iqr_us"]), n["run"], pt(n["status"]),
               _num(n["peer_iqr_us"]), _pct(n["peer_rel_iqr"])] for n in nights]
    hover = ("%{x}<br>run %{customdata[3]}: %{customdata[4]}<br>tuned %{y:.2f} us, IQR %{customdata[2]} us"
             "<br>config %{customdata[0]}<br>commit %{customdata[1]}<extra></extra>")
    fig.add_trace(go.Scatter(x=x, y=tuned, mode="lines+markers", name="tuned kernel (night), IQR bars",
                             customdata=custom, hovertemplate=hover, line=dict(color="#1f77b4"),
                             error_y=dict(type="data", array=[i / 2 for i in tiqr], thickness=1, width=3)),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=peers, mode="lines+markers", name=peer, line=dict(color=_PEER),
                             customdata=[[c[5], c[6]] for c in custom],
                             hovertemplate=("%{x}<br>" + peer + " %{y:.2f} us, IQR %{customdata[0]} us "
                                            "(%{customdata[1]} of the median)<extra></extra>")), row=1, col=1)
    if others:
        fig.add_trace(go.Scatter(
            x=[o["date"] for o in others], y=[o["tuned_us"] for o in others], mode="markers",
            name="search / bench best", marker=dict(symbol=["diamond" if o["measured"] else "star" for o in others],
                                                    size=10, color=["#555" if o["measured"] else _BAD for o in others]),
            customdata=[[o["run"], pt(o["kind"]), pt(_short(o["label"], 90)), o["samples"],
                         pt(o["config_label"] or "-"), pt(o["commit"] or "-"),
                         "" if o["measured"] else " (not a measurement)"] for o in others],
            hovertemplate=("%{x}<br>run %{customdata[0]} (%{customdata[1]}): %{y:.2f} us from %{customdata[3]} "
                           "sample(s)%{customdata[6]}<br>%{customdata[2]}<br>config %{customdata[4]}<br>commit "
                           "%{customdata[5]}<extra></extra>")), row=1, col=1)
    raised = [n for n in nights if n["status"] != "ok"]
    if raised:
        fig.add_trace(go.Scatter(
            x=[n["date"] for n in raised], y=[n["tuned_us"] for n in raised], mode="markers+text",
            text=[pt(n["status"]) for n in raised], textposition="top center", name="flagged", hoverinfo="skip",
            marker=dict(symbol="x", size=13, color=[_BAD if status_kind(n["status"]) == "bad" else _WARN
                                                    for n in raised])), row=1, col=1)
    # the baseline band (the good nights the baseline is made of), the baseline and the threshold
    # as steps over the judged nights, the first one reaching back to its window's first night
    judged = [n for n in nights if n["baseline_speedup"] is not None]
    if judged:
        steps = [dict(judged[0], date=judged[0]["window_start"] or judged[0]["date"])] + judged
        sx = [n["date"] for n in steps]
        _band(go, sx, [n["band_lo"] for n in steps], [n["band_hi"] for n in steps], "baseline band (good nights)",
              "rgba(46,125,50,0.22)", row=2, fig=fig, shape="vh")
        fig.add_trace(go.Scatter(x=sx, y=[n["limit_speedup"] for n in steps], mode="lines", name="threshold",
                                 line=dict(color=_BAD, dash="dash", width=1.5, shape="vh"),
                                 hovertemplate="threshold x %{y:.3f}<extra></extra>"), row=2, col=1)
        fig.add_trace(go.Scatter(x=sx, y=[n["baseline_speedup"] for n in steps], mode="lines", name="baseline",
                                 line=dict(color=_OK, width=1, shape="vh"),
                                 hovertemplate="baseline x %{y:.3f}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(
        x=x, y=[n["speedup"] for n in nights], mode="lines+markers", name=f"x {peer}",
        customdata=[[c[3], c[4]] for c in custom],
        marker=dict(size=9, color=[{"bad": _BAD, "warn": _WARN}.get(status_kind(n["status"]), "#1f77b4")
                                   for n in nights]), line=dict(color="#1f77b4"),
        hovertemplate="%{x}<br>run %{customdata[0]}: %{customdata[1]}<br>x " + peer + " %{y:.3f}<extra></extra>"),
        row=2, col=1)
    fig.update_yaxes(title_text="us (median)", row=1, col=1)
    fig.update_yaxes(title_text="x peer", row=2, col=1)
    fig.update_xaxes(type="date", hoverformat="%Y-%m-%d %H:%M:%S")
    fig.update_xaxes(row=2, col=1, title_text="run date (UTC)")
    if len(nights) >= 2 and others and min(o["date"] for o in others) < nights[0]["date"]:
        # open on the nights; earlier search runs are a zoom-out (double-click) away
        first, last = (dt.datetime.fromisoformat(nights[i]["date"]) for i in (0, -1))
        pad = max((last - first) * 0.08, dt.timedelta(seconds=5))
        fig.update_xaxes(range=[str(first - pad), str(last + pad)], row=2, col=1)
    fig.update_layout(height=430, margin=dict(t=30))
    return fig


def batch_fig(curve: dict):
    """x peer (best measured) against the batch m of one shape, with the break-even line."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=curve["m"], y=curve["speedup"], mode="lines+markers", name=f"x {pt(curve['peer'])}",
                             hovertemplate="m=%{x}: %{y:.2f}x<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="as fast as the peer")
    fig.update_layout(title=pt(f"{curve['label']} on {curve['gpu']}"), height=300,
                      xaxis=dict(title="batch m (rows of A)", type="log", tickvals=curve["m"]),
                      yaxis=dict(title=f"x {pt(curve['peer'])} (best measured)", rangemode="tozero"))
    return fig


def _batches(data: ReportData, figs: dict) -> list:
    if not data.batch_curves:
        return []
    parts = ["<section id='batches'><h2>Batches <a class='pl' href='#batches'>#</a></h2><p class='note'>Families "
             "with a batch (the matmul family): for each shape, the best measured speedup over the peer at each "
             "batch bucket; under 1 the runtime leaves that batch to bnb.</p>"]
    for i, c in enumerate(data.batch_curves):
        figs[f"batch-{i}"] = fig_json(batch_fig(c))
        links = " &middot; ".join(f"<a href='#{h(k)}'>m={m}</a>" for m, k in zip(c["m"], c["keys"]))
        parts.append(f"<div class='problem'><h4>{h(c['label'])} &middot; {h(c['gpu'])}</h4>"
                     f"<div class='note'>{links}</div>" + _chart(f"batch-{i}", figs) + "</div>")
    parts.append("</section>")
    return parts


def _studies_figs(study: dict) -> dict:
    """The trials (log or linear, failed ones drawn with their reasons), the parallel
    coordinates (with the objective as an axis) and the importances of one study."""
    import plotly.graph_objects as go

    trials = sorted(study["trials"], key=lambda t: t["number"])
    done = [t for t in trials if t["value"] is not None]
    failed = [t for t in trials if t["value"] is None]
    best, best_so_far = None, []
    for t in trials:
        if t["value"] is not None:
            best = t["value"] if best is None else min(best, t["value"])
        best_so_far.append(best)
    values = [t["value"] for t in done]
    spread = (max(values) / min(values)) if values and min(values) > 0 else 1
    log = spread > 20
    f1 = go.Figure()
    f1.add_trace(go.Scatter(x=[t["number"] for t in done], y=values, mode="markers", name="trial",
                            hovertemplate="trial %{x}: %{y:.2f} us<extra></extra>"))
    if values:
        f1.add_trace(go.Scatter(x=[t["number"] for t in trials], y=best_so_far, mode="lines", name="best so far",
                                line=dict(shape="hv"), hovertemplate="after trial %{x}: best %{y:.2f} us<extra></extra>"))
    if failed:
        y = (max(values) * (1.6 if log else 1.15)) if values else 1.0
        f1.add_trace(go.Scatter(
            x=[t["number"] for t in failed], y=[y] * len(failed), mode="markers", name=f"failed / invalid ({len(failed)})",
            marker=dict(symbol="x", size=10, color=_BAD),
            customdata=[[pt(t["state"]), pt(_short(t["reason"], 200))] for t in failed],
            hovertemplate="trial %{x}: %{customdata[0]}<br>%{customdata[1]}<extra></extra>"))
    layout = dict(title=dict(text=f"trials of {pt(study['name'])}", font=dict(size=13)), height=340,
                  xaxis=dict(title=dict(text="trial"), tick0=0, dtick=max(1, math.ceil(len(trials) / 15))),
                  yaxis=dict(title=dict(text="median us (lower is better)"), type="log" if log else "linear"))
    if not values:
        layout["yaxis"].update(showticklabels=False, title=dict(text=""))
        layout["annotations"] = [dict(text=f"all {len(failed)} trial(s) failed or were invalid: hover the markers "
                                           "for the reasons", xref="paper", yref="paper", x=0.5, y=0.3,
                                      showarrow=False, font=dict(color=_BAD))]
    f1.update_layout(**layout)
    out = dict(trials=fig_json(f1), parcoords=None, importance=None)
    params = sorted({k for t in done for k in t["params"]})
    if done and params:
        dims = [dict(label="median us (objective)", values=values,
                     range=[min(values), max(values)] if len(set(values)) > 1 else [min(values) * 0.9, max(values) * 1.1])]
        for p in params:
            choices = sorted({t["params"].get(p, "") for t in done})
            # parcoords draws its labels as plain text (no tags, no entities): not HTML-escaped
            dims.append(dict(label=_short(p, 40), values=[choices.index(t["params"].get(p, "")) for t in done],
                             tickvals=list(range(len(choices))), ticktext=[_short(c, 24) for c in choices]))
        f2 = go.Figure(go.Parcoords(
            line=dict(color=values, colorscale="Viridis", reversescale=True, showscale=True,
                      colorbar=dict(title=dict(text="median us"))), dimensions=dims))
        f2.update_layout(height=360, margin=dict(l=80, r=40, t=60, b=30))
        out["parcoords"] = fig_json(f2)
        out["parcoords"]["data"][0]["line"]["colorscale"] = "Viridis"     # plotly.js knows it by name
    if study.get("importance"):
        imp = sorted(study["importance"].items(), key=lambda kv: kv[1])
        f3 = go.Figure(go.Bar(x=[v for _, v in imp], y=[pt(_short(k, 40)) for k, _ in imp], orientation="h",
                              hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
        f3.update_layout(height=60 + 24 * len(imp), xaxis=dict(title=dict(text="importance (fANOVA)")),
                         margin=dict(t=20))
        out["importance"] = fig_json(f3)
    return out


def knob_heatmap(knob_speed: list):
    """Per problem and knob value: the best measured median with that value, relative to the
    problem's best measured median (every row labelled)."""
    import plotly.graph_objects as go

    cells: dict = {}
    order: dict = {}
    for sort_key, problem, knob, value, us in knob_speed:
        order[problem] = sort_key
        c = cells.setdefault((knob, value), {})
        c[problem] = min(us, c.get(problem, us))
    problems = sorted(order, key=lambda p: order[p])

    def value_key(kv):
        knob, value = kv
        try:
            return (knob, 0, float(value), "")
        except ValueError:
            return (knob, 1, 0.0, value)

    rows = sorted(cells, key=value_key)
    best = {p: min(c[p] for c in cells.values() if p in c) for p in problems}
    z = [[(cells[r][p] / best[p]) if p in cells[r] and best[p] else None for p in problems] for r in rows]
    us = [[cells[r].get(p) for p in problems] for r in rows]
    labels = [pt(_short(f"{k} = {v}", 48)) for k, v in rows]
    fig = go.Figure(go.Heatmap(z=z, x=[pt(p) for p in problems], y=labels, customdata=us, colorscale="RdYlGn",
                               reversescale=True, zmin=1, zmax=2,
                               colorbar=dict(title=dict(text="x the problem's best (2 and over: same colour)")),
                               hovertemplate="%{x}<br>%{y}<br>best %{customdata:.2f} us = %{z:.3f} x the best"
                                             "<extra></extra>"))
    fig.update_layout(height=max(320, 150 + 20 * len(rows)), margin=dict(l=40, b=120, t=20),
                      xaxis=dict(title=dict(text="problem"), tickangle=-30, type="category"),
                      yaxis=dict(title=dict(text="knob = value"), type="category", tickmode="linear", dtick=1,
                                 autorange="reversed"))
    return fig


# -- the page ----------------------------------------------------------------------------------
_STYLE = """
body{font-family:system-ui,sans-serif;margin:0 2em 2em;color:#222;font-size:14px}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.4em 0;z-index:5}
header h1{font-size:20px;margin:.2em 0} nav a{margin-right:1em} .meta{color:#555;margin:.2em 0}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:3px 6px;font-size:12.5px;
vertical-align:top} th{background:#f3f3f3;text-align:left} td.n{text-align:right;white-space:nowrap}
td.wrap{white-space:normal;max-width:15em} td.cfg{max-width:17em}
.s{display:inline-block;padding:1px 6px;border-radius:3px;font-weight:600;white-space:nowrap}
td{overflow-wrap:break-word}
.s-bad{background:#f8d0d0;color:#8b0000} .s-warn{background:#fde9b8;color:#6b4b00} .s-ok{background:#d9f2d9;color:#1b5e20}
.s-none{background:#eee;color:#666} .summary{font-size:16px;padding:.5em .8em;border-left:6px solid #999;background:#f7f7f7}
.summary.bad{border-color:#c62828} .summary.warn{border-color:#e0a100} .summary.ok{border-color:#2e7d32}
ul.counts{list-style:none;padding:0;margin:.4em 0} ul.counts li{display:inline-block;margin-right:.6em}
.note{color:#666;font-size:12px} .noisy{background:#fff3cd} .fake{color:#8b0000;font-size:12px}
a.pl{color:#aaa;text-decoration:none;margin-left:.3em} a.pl:hover{color:#333} code{font-size:12px}
.problem,.run{border-top:1px solid #eee;padding-top:.3em;margin-top:.6em} h2{margin-top:1.6em}
h4{margin:.3em 0} dl.legend dt{font-weight:600;float:left;clear:left;width:11em} dl.legend dd{margin-left:11.5em}
:target{background:#fffbe6} [id]{scroll-margin-top:80px} .chart{min-height:40px} .changes{font-size:12px;color:#633}
"""

# First in <head>, before any other script: errors and console.error calls are collected, and
# alert/confirm/prompt only record their calls (a test harness that watches Chromium's dialogs
# itself sets window.__nf4tuneNativeDialogs first).
_GUARD = ("window.__nf4tuneErrors=[];window.__nf4tuneDialogs=[];"
          "window.addEventListener('error',function(e){window.__nf4tuneErrors.push(String(e.message||e));},true);"
          "(function(){var c=console.error;console.error=function(){window.__nf4tuneErrors.push("
          "Array.prototype.join.call(arguments,' '));return c.apply(console,arguments);};"
          "if(window.__nf4tuneNativeDialogs)return;['alert','confirm','prompt','print'].forEach(function(n){"
          "window[n]=function(m){window.__nf4tuneDialogs.push(n+': '+String(m));return n==='confirm'?false:null;};});"
          "})();")

# Draws every chart with the shared template, wires the study selector, then checks the page:
# the body's data-* attributes say how many charts exist and rendered, the load time, script
# errors, dialogs and links to missing anchors. With #selfcheck in the URL it also walks every
# study of the selector.
_RENDER = r"""
(function(){
var D=window.NF4T,T=D.template,C={displaylogo:false,responsive:true},done={},sel=document.getElementById('study-select');
function copy(o){return JSON.parse(JSON.stringify(o));}
function merge(t,s){for(var k in s){var v=s[k];if(v&&typeof v==='object'&&!Array.isArray(v)&&t[k]&&typeof t[k]==='object')
 merge(t[k],v);else t[k]=v;}return t;}
function traces(f){return f.data.map(function(t){var o=merge(copy(D.styles[t._s]),t);delete o._s;return o;});}
function lay(f,menu){var l=copy(D.layouts[f._l]);l.template=T;
 if(menu){menu=copy(menu);menu.active=l.yaxis&&l.yaxis.type==='log'?1:0;l.updatemenus=[menu];}return l;}
var SLOTS={'study-trials':['trials','',D.scaleSwitch],'study-parcoords':['parcoords','no completed trial: nothing to draw'],
 'study-importance':['importance','importances need more finished trials with more than one value']};
function slot(id){var el=document.getElementById(id),s=D.studies[sel?+sel.value:0],w=SLOTS[id],f=s&&s[w[0]];
 if(f){var l=lay(f,w[2]);if(el.classList.contains('chart-empty')){el.classList.remove('chart-empty');el.textContent='';}
  el.style.height=(l.height||400)+'px';return Plotly.react(el,traces(f),l,C);}
 Plotly.purge(el);el.classList.add('chart-empty');el.style.height='auto';el.textContent=w[1];return Promise.resolve();}
// plotly.min.js (4.8 MB of script) is evaluated only when a chart is to be drawn: the tables
// of the first screen never wait for it
var P=null;
function plotly(){if(!P)P=window.Plotly?Promise.resolve():new Promise(function(ok,no){var s=document.createElement('script');
 s.src='plotly.min.js';s.onload=function(){document.body.dataset.plotlyMs=Math.round(performance.now());ok();};
 s.onerror=function(){no('plotly.min.js did not load: it must lie beside index.html');};document.head.appendChild(s);});
 return P;}
function draw(id){if(done[id])return done[id];var el=document.getElementById(id);
 done[id]=el?plotly().then(function(){return SLOTS[id]?slot(id):Plotly.newPlot(el,traces(D.figs[id]),lay(D.figs[id]),C);})
  :Promise.resolve();return done[id];}
if(sel)sel.addEventListener('change',function(){Object.keys(SLOTS).forEach(function(id){
 if(done[id])done[id]=done[id].then(function(){return slot(id);});});});
var ids=Array.prototype.map.call(document.querySelectorAll('.chart'),function(d){return d.id;});
// charts are drawn when they come near the viewport (their space is reserved, so nothing moves)
function near(id){var r=document.getElementById(id).getBoundingClientRect();return r.bottom>-300&&r.top<innerHeight+300;}
var io=window.IntersectionObserver?new IntersectionObserver(function(es){es.forEach(function(e){
 if(e.isIntersecting){io.unobserve(e.target);draw(e.target.id);}});},{rootMargin:'300px 0px'}):null;
ids.forEach(function(id){if(io)io.observe(document.getElementById(id));});
function check(extra){var b=document.body,charts=document.querySelectorAll('.chart:not(.chart-empty)');
 b.dataset.chartsExpected=charts.length;
 b.dataset.chartsRendered=Array.prototype.filter.call(charts,function(d){return d.querySelector('.main-svg')!==null;}).length;
 var missing=[];Array.prototype.forEach.call(document.querySelectorAll('a[href^="#"]'),function(a){
  var id=decodeURIComponent(a.getAttribute('href').slice(1));if(id&&!document.getElementById(id))missing.push(id);});
 b.dataset.brokenLinks=JSON.stringify(missing);for(var k in extra)b.dataset[k]=extra[k];
 // the first contentful paint, read from the timeline (a paint observer's callback is a low-priority
 // task that a long drawing run can hold back past this check)
 var fcp=performance.getEntriesByName&&performance.getEntriesByName('first-contentful-paint')[0];
 if(fcp)b.dataset.firstPaintMs=Math.round(fcp.startTime);
 b.dataset.errors=JSON.stringify(window.__nf4tuneErrors);b.dataset.dialogs=JSON.stringify(window.__nf4tuneDialogs);
 b.dataset.checked='1';}
function fail(e){window.__nf4tuneErrors.push('render: '+e);check({});}
// a permalink opens on its target: scroll there before choosing what to draw first
var target=location.hash.length>1&&document.getElementById(decodeURIComponent(location.hash.slice(1)));
if(target)target.scrollIntoView();
function painted(){return new Promise(function(ok){requestAnimationFrame(function(){setTimeout(ok,0);});});}
// loaded: the first screen painted with every chart in it drawn
Promise.all(ids.filter(near).map(draw)).then(painted).then(function(){
 var b=document.body;b.dataset.loadMs=Math.round(performance.now());
 if(location.hash!=='#selfcheck'){check({});
  if(ids.length)(window.requestIdleCallback||setTimeout)(function(){plotly().catch(fail);});return;}
 // the full check: every chart drawn, then every study of the selector
 Promise.all(ids.map(draw)).then(function(){b.dataset.allChartsMs=Math.round(performance.now());
  if(!sel){check({});return;}
  var n=sel.options.length,bad=[],i=0;
  (function next(){if(i>=n){sel.value='0';Promise.all(Object.keys(SLOTS).map(slot)).then(function(){
    check({studiesChecked:n,studiesFailed:JSON.stringify(bad)});},fail);return;}
   var j=i++;sel.value=String(j);Promise.all(Object.keys(SLOTS).map(function(id){return done[id]=slot(id);})).then(function(){
    var t=document.getElementById('study-trials');if(!t.data||!t.data.length||!t.querySelector('.main-svg'))bad.push(j);next();},
    function(e){bad.push(j+': '+e);next();});})();},fail);
},fail);
})();
"""

_LEGEND = [
    ("status", "the latest night's verdict of the problem (runs of `nf4-tune regress`); "
               f"'{NOT_JUDGED}' when no night has judged it"),
    ("ok", "the tuned kernel's speedup over its peer held against the baseline"),
    ("noisy-reference", "the peer (bnb) measurement of that night was far noisier than on the problem's other "
                        "nights (IQR over 3x their typical relative IQR and over 10% of the median): x bnb and "
                        "the drop are not to be trusted"),
    ("invalid-environment", "clocks or temperature off: the night was not judged"),
    ("suspicious", "a significant first drop of x bnb beyond the threshold, not yet confirmed"),
    ("regression", "the drop persisted (the immediate re-measurement or the next night): fails the night"),
    ("regression-vs-bnb", "the tuned kernel was slower than its peer: fails the night"),
    ("broken", "the stored config no longer passes the bit-exact gate: fails the night"),
    ("x bnb", "peer median / tuned median of that night; baseline: the median of the recent good nights"),
    ("drop / limit", "how far x bnb fell below the baseline, and the threshold it was judged against"),
    ("best ever x bnb", "the fastest valid median ever stored for the problem (any run, any kind) against the "
                        "median of every peer measurement; a value from fewer than 3 samples is not a "
                        "measurement and is marked"),
    ("% of ceiling", "the judged (or best measured) kernel's throughput as a share of its family's ceiling "
                     "(dequant: a device copy of the output size)"),
]


def _badge(status, anchor_id=None) -> str:
    text = h(status or "-")
    cls = f"s s-{status_kind(status)}"
    inner = f"<span class='{cls}' data-status='{text}'>{text}</span>"
    return f"<a href='#{h(anchor_id)}'>{inner}</a>" if anchor_id else inner


def _changes_html(changes: dict) -> str:
    return "<br>".join(f"{h(k)}: {h(_v(a))} &rarr; {h(_v(b))}" for k, (a, b) in _pairs(changes)) or "-"


def _pairs(changes) -> list:
    out = []
    for k, v in (changes or {}).items():
        if isinstance(v, (list, tuple)) and len(v) == 2:
            out.append((k, (v[0], v[1])))
        else:
            out.append((k, (None, v)))
    return out


def _v(value) -> str:
    return "none" if value is None else str(value)


def _summary(data: ReportData) -> tuple[str, str]:
    """The one-line answer at the top, and its colour class."""
    rows = data.overview
    if not rows:
        return "This database holds no measurement yet.", "none"
    judged = [r for r in rows if r["status"] != NOT_JUDGED]
    counts = ", ".join(f"{n} {h(s)}" for s, n in data.counts.items())
    if not judged:
        return (f"No nightly verdict in this database: {len(rows)} problem(s) measured, none judged "
                f"({counts}).", "none")
    worst = rows[0]
    kind = status_kind(worst["status"])
    lead = {"bad": "Failing", "warn": "Needs a look", "ok": "Clean"}.get(kind, "Latest night")
    night = data.meta.get("latest_night")
    when = data.meta.get("latest_night_date")
    text = f"<b>{lead}</b>: latest night run {night} ({_t(when)} UTC): {counts}."
    failing = [r for r in rows if status_kind(r["status"]) == "bad"]
    for r in failing[:3]:
        why = f"x bnb {_num(r['speedup'], '%.3f')} against a baseline of {_num(r['baseline_speedup'], '%.3f')}"
        if r["drop"] is not None:
            why += f" (drop {_pct(r['drop'])})"
        if r["changes"]:
            why += "; changed: " + ", ".join(h(k) for k, _ in _pairs(r["changes"]))
        text += (f"<br><a href='#{h(r['key'])}'>{h(r['problem'])}</a> on {h(r['gpu'])}: "
                 f"<span class='s s-bad'>{h(r['status'])}</span> since <a href='#run-{r['night_run']}'>run "
                 f"{r['night_run']}</a>, {why}.")
    if len(failing) > 3:
        text += f"<br>and {len(failing) - 3} more failing problem(s) below."
    return text, kind


def _verdict(data: ReportData) -> list:
    m = data.meta
    gpus = ", ".join(f"{h(g['name'])} (sm {h(g['compute_capability'])})" for g in m.get("gpus", [])) or "none"
    summary, kind = _summary(data)
    parts = ["<section id='verdict'>", f"<p id='summary' class='summary {kind}'>{summary}</p>",
             "<ul class='counts' id='counts'>" + "".join(
                 f"<li>{_badge(s)} <b>{n}</b></li>" for s, n in data.counts.items()) + "</ul>",
             f"<p class='meta' id='meta'>Generated <b>{h(m.get('generated'))}</b> from <code>{h(m.get('database'))}"
             f"</code> &middot; GPU(s): {gpus} &middot; families: "
             + ", ".join(f"{h(f['name'])} (peer {h(f['peer'])})" for f in data.families) + "</p>"]
    head = ("<tr><th>status</th><th>GPU</th><th>family</th><th>problem</th><th>night</th><th>tuned us</th>"
            "<th>peer us &plusmn; IQR</th><th>x bnb</th><th>baseline x bnb</th><th>drop / limit</th>"
            "<th>best ever x bnb<br><span class='note'>(any run, against every peer median)</span></th>"
            "<th>% of ceiling</th><th>valid / invalid</th><th>config judged</th></tr>")
    parts.append(f"<table id='overview'><thead>{head}</thead><tbody>")
    for r in data.overview:
        run = r["night_run"]
        night = (f"<a href='#run-{run}'>run&nbsp;{run}</a><br><span class='note'>{h((r['night_date'] or '')[5:16])}"
                 "</span>") if run else "-"
        noisy = " class='n noisy'" if r["noisy"] else " class='n'"
        peer_cell = f"{_num(r['peer_us'])} &plusmn; {_num(r['peer_iqr_us'])}"
        if r["noisy"]:
            peer_cell += "<br><span class='note'>noisy reference</span>"
        best = _num(r["best_speedup"])
        if r["best_us"] is not None:
            best += f" <span class='note'>({_num(r['best_us'])} us)</span>"
        if r["best_us"] is not None and not r["best_is_measured"]:
            best += (f"<br><span class='fake' title='{h(r['best_label'])}'>not a measurement: {r['best_samples']} "
                     f"sample(s) in <a href='#run-{r['best_run']}'>run {r['best_run']}</a>, &ldquo;"
                     f"{h(_short(r['best_label'], 40))}&rdquo;</span><br>best measured: "
                     f"{_num(r['best_measured_speedup'])}")
        drop = f"{_pct(r['drop'])} / {_pct(r['threshold'])}" if r["drop"] is not None else "-"
        parts.append(
            f"<tr data-key='{h(r['key'])}' data-status='{h(r['status'])}'><td>{_badge(r['status'], r['key'])}</td>"
            f"<td>{h(r['gpu'])}</td><td>{h(r['family'])}</td><td><a href='#{h(r['key'])}'>{h(r['problem'])}</a></td>"
            f"<td>{night}</td><td class='n'>{_num(r['tuned_us'])}</td><td{noisy}>{peer_cell}</td>"
            f"<td class='n'>{_num(r['speedup'], '%.3f')}</td><td class='n'>{_num(r['baseline_speedup'], '%.3f')}</td>"
            f"<td class='n'>{drop}</td><td class='n wrap'>{best}</td><td class='n'>{_num(r['pct_ceiling'], '%.1f')}</td>"
            f"<td class='n'>{r['valid']} / {r['invalid']}</td><td class='cfg'><code>{h(r['config'] or '-')}</code></td></tr>")
    parts.append("</tbody></table>")
    parts.append("<details id='legend' open><summary>Legend</summary><dl class='legend'>" + "".join(
        f"<dt>{_badge(k) if k in FLAGS else h(k)}</dt><dd>{h(v)}</dd>"
        for k, v in _LEGEND) + "</dl></details></section>")
    return parts


def _flags(data: ReportData) -> list:
    raised = [f for f in data.flags if f["status"] != "ok"]
    parts = [f"<section id='flags'><h2>Nightly flags <a class='pl' href='#flags'>#</a></h2>"
             f"<p>{len(data.flags)} nightly verdict(s), {len(raised)} not ok; newest first.</p>"]
    if raised:
        parts.append("<table id='flags-table'><thead><tr><th>run</th><th>GPU</th><th>problem</th><th>verdict</th>"
                     "<th>x bnb</th><th>baseline</th><th>drop / limit</th><th>p</th><th>peer IQR / typical</th>"
                     "<th>reason</th><th>changed since the baseline</th></tr></thead><tbody>")
        for f in reversed(raised):
            dl = f"{_pct(f['drop'])} / {_pct(f['threshold'])}" if f["drop"] is not None else "-"
            shown = _badge(f["status"], f["key"])
            if f["status"] != f["flag"]:
                shown += f"<br><span class='note'>stored: {h(f['flag'])}</span>"
            parts.append(
                f"<tr data-status='{h(f['status'])}'><td><a href='#run-{f['run']}'>run {f['run']}</a><br>"
                f"<span class='note'>{_t(f['date'])}</span></td><td>{h(f['gpu'])}</td>"
                f"<td><a href='#{h(f['key'])}'>{h(f['problem'])}</a></td><td>{shown}</td>"
                f"<td class='n'>{_num(f['speedup'], '%.3f')}</td><td class='n'>{_num(f['baseline_speedup'], '%.3f')}</td>"
                f"<td class='n'>{dl}</td><td class='n'>{_num(f['p_value'], '%.1e')}</td>"
                f"<td class='n'>{_pct(f['peer_rel_iqr'])} / {_pct(f['typical_rel_iqr'])}</td>"
                f"<td>{h(f['reason'])}</td><td class='changes'>{_changes_html(f['changes'])}</td></tr>")
        parts.append("</tbody></table>")
    parts.append("</section>")
    return parts


def _history(data: ReportData, figs: dict) -> list:
    parts = ["<section id='history'><h2>History <a class='pl' href='#history'>#</a></h2>"
             "<p class='note'>Per GPU x problem: the nights (tuned kernel and peer, with their IQR bands; hover for "
             "config, commit and IQR), the search and bench runs' best, and x peer with the baseline band and the "
             "threshold. A problem with a single measurement is a table row.</p>"]
    for fam in data.families:
        rows = [r for r in data.overview if r["family"] == fam["name"]]
        parts.append(f"<h3 id='family-{h(fam['name'])}'>family {h(fam['name'])} &middot; peer {h(fam['peer'])} "
                     f"&middot; ceiling {h(fam['ceiling'])}{'' if fam['known'] else ' (a family this version does not know)'}</h3>")
        singles = []
        for r in rows:
            entry = data.history[r["key"]]
            fig = history_fig(entry)
            if fig is None:
                singles.append((r, entry))
                continue
            figs[f"hist-{r['key']}"] = fig_json(fig)
            nights = " &middot; ".join(f"<a href='#run-{n['run']}'>run {n['run']}</a> {_badge(n['status'])}"
                                       for n in entry["nights"]) or "no night"
            parts.append(f"<div class='problem' id='{h(r['key'])}'><h4>{h(r['problem'])} &middot; {h(r['gpu'])} "
                         f"{_badge(r['status'])}<a class='pl' href='#{h(r['key'])}' title='permalink'>#</a></h4>"
                         f"<div class='note'>nights: {nights}</div>"
                         + _chart(f"hist-{r['key']}", figs) + "</div>")
        if singles:
            parts.append("<table class='singles'><thead><tr><th>problem</th><th>GPU</th><th>status</th><th>run</th>"
                         "<th>date</th><th>commit</th><th>us</th><th>peer us</th><th>x peer</th><th>config</th>"
                         "</tr></thead><tbody>")
            for r, e in singles:
                p = (e["nights"] or e["others"] or [None])[0]
                if p is None:
                    cells = "<td colspan='7'>no valid measurement</td>"
                else:
                    cells = (f"<td><a href='#run-{p['run']}'>run {p['run']}</a></td><td>{_t(p['date'])}</td>"
                             f"<td>{h(p['commit'])}</td><td class='n'>{_num(p['tuned_us'])}</td>"
                             f"<td class='n'>{_num(p['peer_us'])}</td><td class='n'>{_num(p['speedup'], '%.3f')}</td>"
                             f"<td><code>{h(p['config_label'] or '-')}</code></td>")
                parts.append(f"<tr class='problem' id='{h(r['key'])}'><td>{h(r['problem'])}"
                             f"<a class='pl' href='#{h(r['key'])}'>#</a></td><td>{h(r['gpu'])}</td>"
                             f"<td>{_badge(r['status'])}</td>{cells}</tr>")
            parts.append("</tbody></table>")
    parts.append("</section>")
    return parts


_LABELS_SHOWN = 14


def _chart(div_id: str, figs: dict, key: str = None) -> str:
    """A chart's place, its height reserved (charts are drawn when they come into view, and
    nothing on the page may move when they do)."""
    fig = figs.get(key or div_id)
    height = (fig or {}).get("layout", {}).get("height") or 80
    return f"<div class='chart' id='{h(div_id)}' style='height:{int(height)}px'></div>"


def _runs(data: ReportData) -> list:
    parts = ["<section id='runs'><h2>Runs <a class='pl' href='#runs'>#</a></h2><p class='note'>Each run: its "
             "command, what changed against its baseline (the last clean night before it, else the previous "
             "run on the GPU), its verdicts, and the labels of what it measured.</p>"]
    for r in reversed(data.runs):
        base = (f"compared with <a href='#run-{r['baseline']}'>run {r['baseline']}</a> ({h(r['baseline_why'])})"
                if r["baseline"] is not None else "no earlier run to compare with")
        env = ("<br>".join(f"{h(k)}: {h(_v(a))} &rarr; {h(_v(b))}" for k, (a, b) in r["env_diff"].items())
               or "no environment change")
        out = [f"<div class='run' id='run-{r['run']}'><h4>run {r['run']} &middot; {h(r['kind'])} &middot; "
               f"{_t(r['started'])} UTC &middot; {h(r['gpu'])}<a class='pl' href='#run-{r['run']}'>#</a></h4>",
               f"<div>command: <code class='cmd'>{h(r['command'] or '-')}</code></div>",
               f"<div>{base}: <span class='changes env-diff'>{env}</span></div>"]
        if r["config_diff"]:
            out.append("<div>config changes:<ul class='config-diff'>" + "".join(
                f"<li><a href='#{h(c['key'])}'>{h(c['problem'])}</a>: <code>{h(c['before'])}</code> &rarr; "
                f"<code>{h(c['after'])}</code> ("
                + ", ".join(f"{h(k)} {h(_v(a))} &rarr; {h(_v(b))}" for k, (a, b) in c["knobs"].items()) + ")</li>"
                for c in r["config_diff"]) + "</ul></div>")
        if r["verdicts"]:
            out.append("<div>verdicts: " + " ".join(
                f"<a href='#{h(v['key'])}'>{h(v['problem'])}</a> {_badge(v['status'])}"
                for v in r["verdicts"] if v["status"] != "ok")
                       + f" <span class='note'>({sum(v['status'] == 'ok' for v in r['verdicts'])} ok)</span></div>")
        # a search's config labels are its trials (the studies below list them): name only those
        # with a reason or too few samples, and the references
        labels = [e for e in r["labels"] if r["kind"] != "search" or e["status"] != "ok" or e["reason"]
                  or e["samples"] < MIN_SAMPLES]
        shown = labels[:_LABELS_SHOWN]
        more = len(r["labels"]) - len(shown)
        out.append(f"<div>{r['measurements']} measurement(s), labels:<ul class='labels'>" + "".join(
            f"<li><code>{h(e['label'])}</code> &times;{e['count']} ({h(e['status'])}"
            + (f", <span class='fake'>{e['samples']} sample(s): not a measurement</span>"
               if e["status"] == "ok" and e["samples"] < MIN_SAMPLES else "")
            + (f", reason: {h(_short(e['reason'], 200))}" if e["reason"] else "") + ")</li>" for e in shown)
            + (f"<li class='note'>and {more} more config label(s), each measured once</li>" if more > 0 else "")
            + "</ul></div></div>")
        parts.extend(out)
    parts.append("</section>")
    return parts


def _searches(data: ReportData, studies: list) -> list:
    if not data.studies:
        return []
    parts = ["<section id='searches'><h2>Searches <a class='pl' href='#searches'>#</a></h2>",
             "<table id='studies'><thead><tr><th>#</th><th>study</th><th>trials</th><th>complete</th>"
             "<th>failed / invalid</th><th>best us</th><th>why trials failed</th></tr></thead><tbody>"]
    for i, st in enumerate(data.studies):
        done = [t["value"] for t in st["trials"] if t["value"] is not None]
        reasons = {}
        for t in st["trials"]:
            if t["value"] is None:
                reasons[t["reason"]] = reasons.get(t["reason"], 0) + 1
        why = "<br>".join(f"&times;{n} {h(_short(r, 160))}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
        parts.append(f"<tr><td>{i}</td><td>{h(st['name'])}</td><td class='n'>{len(st['trials'])}</td>"
                     f"<td class='n'>{len(done)}</td><td class='n'>{len(st['trials']) - len(done)}</td>"
                     f"<td class='n'>{_num(min(done) if done else None)}</td><td class='changes'>{why or '-'}</td></tr>")
        studies.append(_studies_figs(st))
    options = "".join(f"<option value='{i}'>{h(st['name'])}</option>" for i, st in enumerate(data.studies))
    parts.append("</tbody></table><p><label>study <select id='study-select'>" + options + "</select></label> "
                 "<span class='note'>(the trial chart has a linear / log switch; failed and invalid trials are red "
                 "crosses: hover for the reason)</span></p>" + _chart("study-trials", studies[0], "trials") +
                 "<h3>Parallel coordinates</h3>" + _chart("study-parcoords", studies[0], "parcoords") +
                 "<h3>Parameter importance</h3>" + _chart("study-importance", studies[0], "importance") + "</section>")
    return parts


def _environments(data: ReportData) -> list:
    cols = ("run", "kind", "started", "gpu", "project_version", "git_commit", "nvrtc", "driver", "cuda_python", "bnb",
            "torch")
    parts = ["<section id='environments'><h2>Environments <a class='pl' href='#environments'>#</a></h2>"
             "<table id='environments-table'><thead><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>"]
    for r in data.runs:
        vals = dict(r["env"], run=f"<a href='#run-{r['run']}'>{r['run']}</a>", kind=h(r["kind"]),
                    started=_t(r["started"]), gpu=h(r["gpu"]))
        parts.append("<tr>" + "".join(f"<td>{vals[c] if c in ('run', 'kind', 'started', 'gpu') else h(vals.get(c))}</td>"
                                      for c in cols) + "</tr>")
    parts.append("</tbody></table></section>")
    if data.unreadable:
        parts.append("<section id='unreadable'><h2>Rows not shown</h2><p>Their problem could not be read:</p><ul>"
                     + "".join(f"<li>{h(u['table'])} row {h(u['id'])}: shape <code>{h(u['shape'])}</code></li>"
                               for u in data.unreadable[:50]) + "</ul></section>")
    return parts


DOWNLOADS = TABLES


def report_files() -> list:
    """The names of the files a report writes into its folder (index.html last)."""
    return ["plotly.min.js"] + [f"{name}.{ext}" for name in TABLES for ext in ("csv", "json")] + ["index.html"]


def build_report(data: ReportData, out_dir) -> Path:
    """Write the static site into ``out_dir`` (created): index.html, plotly.min.js beside it,
    and the overview, flags and history as CSV and JSON. They are written into a fresh folder
    beside ``out_dir`` and then moved into it, index.html last; one of their names there that
    is a symlink, a folder, a special file or a database is refused and no other file of
    ``out_dir`` is touched (:func:`nf4tune._files.publish_files`). Returns the path of index.html."""
    from plotly.offline import get_plotlyjs

    files = {"plotly.min.js": get_plotlyjs()}
    files.update(table_files(data))
    figs: dict = {}
    studies: list = []
    title = f"nf4-tune report: {data.meta.get('database', '')}"
    downloads = " ".join(f"{name} <a href='{name}.csv' download>csv</a> <a href='{name}.json' download>json</a>"
                         f" &middot;" for name in DOWNLOADS).rstrip(" &middot;")
    body = (_verdict(data) + _flags(data) + _history(data, figs) + _batches(data, figs) + _runs(data)
            + _searches(data, studies))
    if data.knob_speed:
        figs["knob-heatmap"] = fig_json(knob_heatmap(data.knob_speed))
        body.append("<section id='knobs'><h2>Knobs <a class='pl' href='#knobs'>#</a></h2><p class='note'>Per problem "
                    "and knob value, the best measured median with that value relative to the problem's best "
                    "measured median (values of fewer than 3 samples left out).</p>"
                    + _chart("knob-heatmap", figs) + "</section>")
    body += _environments(data)
    sections = ["verdict", "flags", "history"] + ["batches"] * bool(data.batch_curves) + ["runs"] + \
        ["searches"] * bool(data.studies) + \
        ["knobs"] * bool(data.knob_speed) + ["environments"]
    nav = " ".join(f"<a href='#{a}'>{a}</a>" for a in sections)
    pack = FigurePack()
    figs = {k: pack.add(f) for k, f in figs.items()}
    studies = [{k: pack.add(f) if f else None for k, f in st.items()} for st in studies]
    payload = script_json(dict(template=TEMPLATE, figs=figs, studies=studies, scaleSwitch=SCALE_SWITCH,
                               styles=pack.styles, layouts=pack.layouts))
    page = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><script>{_GUARD}</script>"
            f"<title>{h(title)}</title><meta name='viewport' content='width=device-width'>"
            f"<link rel='preload' href='plotly.min.js' as='script'><style>{_STYLE}</style></head><body>",
            f"<header><h1>nf4-tune report</h1><nav>{nav} &middot; downloads: {downloads}</nav></header>",
            *body, f"<script>window.NF4T={payload};</script><script>{_RENDER}</script></body></html>"]
    files["index.html"] = "\n".join(page)
    return publish_files(out_dir, {name: files[name] for name in report_files()})[-1]
