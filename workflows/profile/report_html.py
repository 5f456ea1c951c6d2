"""One self-contained, offline HTML file for an inspection report.

The timeline is a Bokeh figure (zoom, pan, hover: hundreds of ranks stay
readable) with Bokeh's JavaScript inlined, not fetched from a CDN; the other
figures are matplotlib PNGs embedded as base64, styles are inline: the file
opens on a laptop with no network, years later. Bokeh because it inlines
1.3 MB of JavaScript where Plotly inlines ~4.5 MB, and needs no pandas.
"""
import base64
import html
import io
import os
import re

from trajflow.tasks.modes import is_mpi_rank
from trajflow.tasks.rundir import RESULT, write_text
from trajflow.workflows.profile.advice import pilot_span
from trajflow.workflows.profile.wall_time import describe as describe_wall
from trajflow.workflows.profile.inspection import rank_spans, straggler_lines
from trajflow.workflows.profile.stragglers import (describe, phase_times, PHASES, rank_list,
                                                  SHOWN_PHASES)

COLOURS = {"setup": "#e377c2", "claim": "#c5b0d5", "finalize": "#f7b6d2", "progress": "#ffe0b0",
           "open_topology": "#8c564b", "open_trajectory": "#c49c94", "io": "#1f77b4",
           "compute": "#2ca02c", "wait": "#d62728", "comm": "#9467bd", "write": "#ff7f0e",
           "convert": "#ffbb78", "queued": "#e7cb94", "launch": "#7f7f7f", "start-up": "#bcbd22",
           "exit": "#aec7e8",
           "other": "#cccccc",
           "pilot": "#dbdb8d", "rank": "#17becf"}  # "rank": a timing table's row, its phases in no known order


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt
    return plt


def png_uri(fig):
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _label(r):
    if r["task"] in ("split", "reduce"):
        return f"{r['run']} {r['task']}"
    who = f"rank {r.get('rank', 0)}" if is_mpi_rank(r) else f"block {r.get('block', '')}"
    return f"{r['run']} {r['task']} {who}"


def interactive_timeline(records, flags, pilots=None, with_library=True):
    """The timeline as a Bokeh figure, its JavaScript inlined (no CDN: the file opens
    offline): every task and rank a row, each phase interval and RADICAL's launch,
    start-up and exit a bar, and a row for each run's pilot (`pilots`: run -> (start,
    stop), where known); zoom, pan, and hover for run, task, rank, host, phase,
    duration; a straggler flag a red triangle at its member's end, its sentence on hover.
    Readable at hundreds of ranks, where a static figure's rows run together.
    `with_library` False: BokehJS itself left out (a notebook has it from an earlier
    display: see library_once), with a line saying what to do where it is not there."""
    from bokeh.embed import components
    from bokeh.models import ColumnDataSource, HoverTool, Range1d
    from bokeh.plotting import figure
    from bokeh.resources import Resources
    pilots = {run: span for run, span in (pilots or {}).items() if span}
    rows = sorted(records, key=lambda r: (r["run"], r["t_start"], r.get("rank", 0)))
    labels, seen = [], {}
    for r in rows:  # a row's label must be unique (a retried task has two records)
        seen[_label(r)] = seen.get(_label(r), 0) + 1
        labels.append(_label(r) + (f" ({seen[_label(r)]})" if seen[_label(r)] > 1 else ""))
    spans = {id(r): [("other", "phase", r["t_start"], r["t_stop"])]  # what phases leave out
             + rank_spans(r) for r in rows}
    starts = {run: span[0] for run, span in pilots.items()}
    for r in rows:  # each run on its own clock, so runs of a campaign line up
        starts[r["run"]] = min(starts.get(r["run"], float("inf")), *(s[2] for s in spans[id(r)]))
    entries = [(f"{run} pilot", {"run": run, "task": "pilot"}, [("pilot", "radical", *span)])
               for run, span in sorted(pilots.items()) if run in starts]
    entries += [(label, r, spans[id(r)]) for label, r in zip(labels, rows)]
    labels = [label for label, _, _ in entries]
    bars = {k: [] for k in ("y", "left", "right", "phase", "colour", "run", "task", "rank", "host",
                            "block", "seconds")}
    for label, r, pieces in entries:
        t0 = starts[r["run"]]
        for name, _, a, b in pieces:
            for k, v in (("y", label), ("left", a - t0), ("right", b - t0), ("phase", name),
                         ("colour", COLOURS.get(name, "#000000")),
                         ("run", r["run"]), ("task", r["task"]), ("rank", r.get("rank", "")),
                         ("host", str(r.get("host", ""))), ("block", str(r.get("block", ""))),
                         ("seconds", b - a)):
                bars[k].append(v)
    rows = [r for _, r, _ in entries]
    # rows tall enough to read at a few ranks, thin at hundreds; the view starts on the
    # tasks (the pilot's row runs on far beyond them: zoom out to see it whole)
    row_px = 26 if len(rows) <= 20 else 18 if len(rows) <= 60 else 12
    tasks = [(a - starts[r["run"]], b - starts[r["run"]]) for _, r, pieces in entries
             if r["task"] != "pilot" for _, _, a, b in pieces]
    lo, hi = (min(a for a, _ in tasks), max(b for _, b in tasks)) if tasks else (0.0, 1.0)
    margin = 0.03 * max(hi - lo, 1e-3)
    fig = figure(y_range=list(reversed(labels)), x_range=Range1d(lo - margin, hi + margin),
                 height=min(2800, 170 + row_px * len(rows)),
                 sizing_mode="stretch_width",
                 x_axis_label="seconds since the run's pilot started (or its first task's launch)",
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom",
                 title="timeline of every task and rank (scroll to zoom, drag to pan, hover "
                       "for numbers)")
    drawn = fig.hbar(y="y", left="left", right="right", height=0.8, color="colour",
                     source=ColumnDataSource(bars), legend_field="phase")
    fig.add_tools(HoverTool(renderers=[drawn], tooltips=[
        ("run", "@run"), ("task", "@task"), ("rank", "@rank"), ("block", "@block"),
        ("host", "@host"), ("phase", "@phase"), ("seconds", "@seconds{0.000}")]))
    _draw_work_units(fig, entries, starts, HoverTool, ColumnDataSource)
    marks = {"y": [], "x": [], "flag": []}
    for f in flags:
        for label, r in zip(labels, rows):
            if r["run"] == f["run"] and r["task"] == f["task"] and (
                    r.get("rank") in f["ranks"] if f["kind"] == "host" else
                    (r.get("rank"), r.get("block")) == (f["rank"], f["block"])):
                marks["y"].append(label)
                marks["x"].append(r["t_stop"] - starts[r["run"]])
                marks["flag"].append(describe(f))
    if marks["y"]:
        flagged = fig.scatter(x="x", y="y", marker="triangle", size=11, color="#d62728",
                              source=ColumnDataSource(marks), legend_label="straggler")
        fig.add_tools(HoverTool(renderers=[flagged], tooltips=[("straggler", "@flag")]))
    fig.yaxis.major_label_text_font_size = "8pt" if len(rows) < 80 else "0pt"
    fig.legend.orientation = "horizontal"
    fig.legend.label_text_font_size = "8pt"
    fig.add_layout(fig.legend[0], "above")  # not over the bars
    script, div = components(fig)
    # BokehJS's core alone (1.3 MB): no widgets, tables or MathJax (another 3 MB) are used;
    # the core's loader of MathJax from a CDN (for math text, never drawn here) is cut, so
    # the page holds no address to fetch anything from
    if not with_library:
        return LIBRARY_MISSING + script + div
    js = Resources(mode="inline", components=["bokeh"]).render_js()
    return js.replace(MATHJAX_CDN, "") + script + div


# shown in place of a timeline whose BokehJS is not on the page (a notebook reopened
# with the first report's output cleared)
LIBRARY_MISSING = (
    '<p class="trajflow-needs-bokeh" style="display:none">The timeline needs BokehJS, which '
    "this notebook loads with the first trajflow report it shows in a kernel: restart the "
    "kernel and run the notebook again.</p>"
    '<script>if (typeof Bokeh === "undefined") {document.querySelectorAll('
    '".trajflow-needs-bokeh").forEach(function (p) {p.style.display = "block";});}</script>')
_library_shown = False


def library_once() -> bool:
    """True the first time this process (a notebook's kernel) shows a report inline, False
    after: BokehJS (1.3 MB) goes into the first display only, not into every one."""
    global _library_shown
    first, _library_shown = not _library_shown, True
    return first


MATHJAX_CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"


def _draw_work_units(fig, entries, starts, HoverTool, ColumnDataSource):
    """Outline each chunk a rank of a dynamic schedule ran, and each copy of a block a
    task ran (its own, or a backup), over the phase bars; hover says which frames."""
    units = {"y": [], "left": [], "right": [], "what": []}
    for label, r, _ in entries:
        t0 = starts.get(r["run"], 0.0)
        pieces = [(c[4], c[5], f"chunk {c[0]}: the run's frames #{c[2]}-#{c[3] - 1} "
                               f"(block {c[1]})")
                  for c in r.get("chunks") or [] if is_mpi_rank(r)]
        pieces += [(b["t_start"], b["t_stop"],
                    f"block {b['block']} ({'backup copy' if b['backup'] else 'own'}, "
                    f"{'won' if b['won'] else 'stopped: the other copy won'})")
                   for b in r.get("block_copies") or []]
        for a, b, what in pieces:
            units["y"].append(label)
            units["left"].append(a - t0)
            units["right"].append(b - t0)
            units["what"].append(what)
    if units["y"]:
        drawn = fig.hbar(y="y", left="left", right="right", height=0.9, fill_alpha=0.0,
                         line_color="#333333", line_width=0.6, source=ColumnDataSource(units),
                         legend_label="chunk or block copy")
        fig.add_tools(HoverTool(renderers=[drawn], tooltips=[("work", "@what")]))


def stacked_bars(records):
    plt = pyplot()
    rows = [r for r in records if r["task"] == "analyze"]
    rows.sort(key=lambda r: (r["run"], r.get("block", 0)))
    fig, ax = plt.subplots(figsize=(10, 3.5))
    bottom = [0.0] * len(rows)
    for phase in SHOWN_PHASES:
        vals = [r.get("t_wait", 0.0) if phase == "wait" else phase_times(r)[phase] for r in rows]
        colour = COLOURS.get(phase, COLOURS.get("open_topology") if phase == "open" else "#000")
        ax.bar(range(len(rows)), vals, bottom=bottom, color=colour,
               label="launch + start-up" if phase == "launch" else phase)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, ncol=4)
    ax.set_title("analyze: phases per rank / task")
    return png_uri(fig)


# a box plot of fewer ranks or tasks than this shows no distribution (the bars above
# have each one); not drawn, a small run's report is ~0.1 s of CPU quicker
DISTRIBUTION_MEMBERS = 5


def distributions(records):
    plt = pyplot()
    rows = [r for r in records if r["task"] == "analyze"]
    names = [p for p in PHASES if p != "other"] + ["wait"]
    data = [[r.get("t_wait", 0.0) if p == "wait" else phase_times(r)[p] for r in rows] for p in names]
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.boxplot(data, tick_labels=names)
    ax.set_ylabel("seconds")
    ax.set_title("analyze: distribution of each phase over ranks / tasks")
    return png_uri(fig)


def scaling_plot(rows):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    series = {}
    for r in rows:
        series.setdefault((r["analysis"], r["io"], r["mode"]), []).append(r)
    for key, pts in series.items():
        n = [p["N"] for p in pts]
        axes[0].plot(n, [p["S_total"] for p in pts], "o-", label=" ".join(key))
        axes[1].plot(n, [p["E_total"] for p in pts], "o-", label=" ".join(key))
    axes[0].set_xlabel("ranks N")
    axes[0].set_ylabel("speed-up S(N)")
    axes[1].set_xlabel("ranks N")
    axes[1].set_ylabel("efficiency E(N)")
    axes[0].legend(fontsize=7)
    return png_uri(fig)


def html_table(header, rows):
    """A plain HTML table, every cell escaped (reports, and reprs in notebooks)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(report, title="trajflow inspection"):
    """The report as a whole HTML page."""
    return html_page(title, f"<h1>{html.escape(title)}</h1>" + render_body(report))


def render_body(report, with_library=True):
    """The report's content (a notebook shows it inline: Profile._repr_html_, with BokehJS
    in its first display only: `with_library`)."""
    records = report["records"]
    flags = [f for f in report["stragglers"] if f.get("judged", True)]  # not a too-short run's
    parts = ["<p>" + "; ".join(f"{what}: " + ", ".join(html.escape(p) for p in paths)
                              for what, paths in (("Runs", [r["workdir"] for r in report["runs"]]),
                                                  ("Timing tables", report.get("tables", [])))
                              if paths) + "</p>"]
    parts += [f"<p>{html.escape(note)}</p>" for note in report.get("notes", [])]
    for run in report.get("runs", []):
        figures = result_figures(run["workdir"], trust=report.get("trust", False))
        if figures:
            parts.append(f"<h2>Result: {html.escape(os.path.basename(run['workdir']))}</h2>"
                         + "".join(f'<img alt="result" src="{f}">' for f in figures))
    failed = [e for e in report.get("endings", {}).values() if not e["ok"]]
    if failed:  # what failed, where and why, before any timing
        parts.append("<h2>Did not complete</h2>" + "".join(
            f"<pre>{html.escape(chr(10).join(e['lines']))}</pre>" for e in failed))
    walls = {run: a["times"]["wall"] for run, a in report["advice"].items()
             if (a.get("times") or {}).get("wall")}
    if walls:  # the one wall time `trajflow runs` and the summary give, and where it went
        parts.append("<h2>Wall time</h2>" + html_table(
            ["run", "wall s"] + ["where it went"],
            [[run, f"{w['whole']:.1f}", describe_wall(w)] for run, w in walls.items()]))
    parts.append("<h2>Stragglers</h2>")
    parts.append("<ul>" + "".join(f"<li>{_prose(line.strip())}</li>"
                                  for line in straggler_lines(report)) + "</ul>")
    if flags:
        parts.append(html_table(
            ["run", "task", "kind", "rank(s)", "block", "host", "duration s", "baseline s",
             "baseline", "x baseline", "threshold s", "cause", "impact s", "victims' wait s"],
            [[f["run"], f["task"], f["kind"], f["rank"] if f["kind"] != "host" else
              rank_list(f["ranks"]), "" if f["block"] is None else f["block"], f["host"], f"{f['duration_s']:.3f}",
              f"{f['baseline_s']:.3f}", f["baseline"], f"{f['ratio']:.1f}",
              f"{f['threshold_s']:.3f}", f["cause"], f"{f['impact_s']:.3f}",
              f"{f['victims_wait_s']:.3f}"] for f in flags]))
    parts.append("<h2>Advice</h2><ul>" + "".join(
        f"<li><b>{html.escape(run)}</b>: {_prose(a['text'])}</li>"
        for run, a in report["advice"].items()) + "".join(
        f"<li>{_prose(line)}</li>" for line in report.get("comparisons", [])) + "</ul>")
    if records:
        pilots = {os.path.basename(r["workdir"]): pilot_span(r["workdir"]) for r in report["runs"]}
        parts.append("<h2>Timeline</h2>" + interactive_timeline(records, flags, pilots,
                                                                    with_library))
        parts.append("<p><small>pilot: the pilot's bootstrapper from its start to its end "
                     "(queue wait before it is not seen). queued: a task waiting in "
                     "RADICAL's agent scheduler for cores. launch: RADICAL-Pilot launching a "
                     "task (its launch_start to the first rank's start). start-up: a rank's "
                     "interpreter start, imports and, on a fresh install, the kernels' "
                     "compilation, before its first timestamp. exit: its last timestamp to "
                     "RADICAL-Pilot's rank_stop (interpreter exit). other: time inside the "
                     "rank no phase accounts for.</small></p>")
        members = sum(r["task"] == "analyze" for r in records)
        if members:
            parts.append(f'<h2>Phases per rank</h2><img alt="phases" src="{stacked_bars(records)}">')
        if members >= DISTRIBUTION_MEMBERS:
            parts.append(f'<h2>Phase distributions</h2><img alt="distributions" src="{distributions(records)}">')
    if report.get("scaling"):
        parts.append(f'<h2>Scaling</h2><img alt="scaling" src="{scaling_plot(report["scaling"])}">')
        parts.append(html_table(["analysis", "io", "mode", "N", "t_total s", "S(N)", "E(N)"],
                            [[r["analysis"], r["io"], r["mode"], r["N"], f"{r['t_total']:.3f}",
                              f"{r['S_total']:.2f}", f"{r['E_total']:.2f}"] for r in report["scaling"]]))
    parts.append("<h2>Every task and rank (seconds)</h2>")
    cols = [p for p in SHOWN_PHASES if p != "wait"]
    parts.append(html_table(["run", "task", "rank", "block", "host", "frames"] + cols + ["wait", "total"],
                        [[r["run"], r["task"], r.get("rank"), r.get("block", ""), r.get("host"),
                          r.get("frames", "")] + [f"{phase_times(r)[c]:.3f}" for c in cols] +
                         [f"{r.get('t_wait', 0.0):.3f}", f"{r['t_total']:.3f}"] for r in records]))
    return "".join(parts)


def result_figures(rundir, most=2, trust=False):
    """Up to `most` figures of a complete run's result (PNG data URIs): each per-frame
    series against time (rmsd: its rmsd column), and a curve over `bins` (an RDF's).
    Results stored with pickle are drawn only with `trust` (unpickling runs code)."""
    import numpy as np
    from trajflow.tasks.results import open_result
    result = os.path.join(rundir, RESULT)
    if os.path.islink(result) or not os.path.isfile(result):  # a FIFO would hang h5py
        return []
    try:
        results = open_result(rundir, trust)
    except Exception:  # noqa: a damaged result shows no figure; the report says the rest
        return []
    figures = []
    bins = np.asarray(results.get("bins", []))
    for key, value in results.items():
        if key in ("frame", "time", "bins") or len(figures) >= most:
            continue
        try:
            value = np.asarray(value) if not isinstance(value, dict) else None
        except (ValueError, TypeError):  # ragged lists, objects: nothing to plot
            value = None
        if value is None or value.dtype.kind not in "biuf":
            continue
        if key == "rmsd" and value.ndim == 2:
            value = value[:, 2]  # (frame, time, rmsd)
        if len(bins) > 1 and value.ndim == 1 and len(value) == len(bins):
            figures.append(_line(bins, value, "bins", key))
        else:
            figure = result_plot(results["time"], value, key)
            if figure:
                figures.append(figure)
    return figures


def _line(x, y, xlabel, ylabel):
    """A small line plot as a PNG data URI."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.plot(x, y, lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return png_uri(fig)


def result_plot(time, values, label):
    """A per-frame result against time (a PNG data URI), or None when `values` is not
    one number per frame: what a notebook shows of a finished run."""
    import numpy as np
    try:
        values = np.asarray(values)
    except (ValueError, TypeError):  # ragged lists, objects: nothing to plot
        return None
    if values.ndim != 1 or len(values) != len(time) or values.dtype.kind not in "biuf":
        return None
    return _line(time, values, "time (ps)", label)



def _prose(text):
    """Escaped text whose command-line options (`--mode mpi`) never break across lines."""
    return re.sub(r"(--[a-z][a-z-]*(?: [A-Za-z0-9.:_]+)?)", r"<code>\1</code>", html.escape(text))


def html_page(title, body):
    style = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "img{max-width:100%}code{white-space:nowrap}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{body}</body></html>")


def write_html(report, path, title="trajflow inspection", user_target=True):
    """The report into `path`: a file the user named (a link of theirs is followed), or,
    with `user_target` False, a run folder's report.html (a link there is replaced)."""
    write_text(path, render(report, title), user_target=user_target)
