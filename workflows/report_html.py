"""One self-contained, offline HTML file for an inspection report.

Figures are drawn with matplotlib (Agg) and embedded as base64 PNG, styles
are inline: the file opens on a laptop with no network, years later.
"""
import base64
import html
import io
import os

from .inspection import straggler_lines
from .stragglers import PHASES, phase_times

COLOURS = {"open_topology": "#8c564b", "open_trajectory": "#c49c94", "io": "#1f77b4",
           "compute": "#2ca02c", "wait": "#d62728", "comm": "#9467bd", "write": "#ff7f0e",
           "convert": "#ffbb78", "launch": "#7f7f7f", "other": "#cccccc"}


def _png(fig):
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _label(r):
    who = f"rank {r.get('rank', 0)}" if r.get("mode") == "mpi" else f"block {r.get('block', '')}"
    return f"{r['run']} {r['task']} {who if r['task'] == 'analyze' else ''}".strip()


def gantt(records):
    """Every task and rank a row; each timed interval a bar coloured by phase."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted(records, key=lambda r: (r["run"], r["t_start"], r.get("rank", 0)))
    starts = {}
    for r in rows:  # each run on its own clock, so runs of a campaign line up
        starts[r["run"]] = min(starts.get(r["run"], float("inf")), r["t_start"] - r.get("t_launch", 0.0))
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    for y, r in enumerate(rows):
        t0 = starts[r["run"]]
        if r.get("t_launch"):
            ax.barh(y, r["t_launch"], left=r["t_start"] - r["t_launch"] - t0, color=COLOURS["launch"])
        ax.barh(y, r["t_total"], left=r["t_start"] - t0, color=COLOURS["other"])
        for name, a, b in r.get("intervals", []):
            ax.barh(y, b - a, left=a - t0, color=COLOURS.get(name, "#000000"))
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run's first task launched")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, COLOURS.keys(), fontsize=7, ncol=5, loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.3))
    ax.set_title("timeline of every task and rank")
    return _png(fig)


def stacked_bars(records):
    import matplotlib.pyplot as plt
    rows = [r for r in records if r["task"] == "analyze"]
    rows.sort(key=lambda r: (r["run"], r.get("block", 0)))
    fig, ax = plt.subplots(figsize=(10, 3.5))
    bottom = [0.0] * len(rows)
    for phase in ("open", "io", "compute", "wait", "comm", "write", "launch", "other"):
        vals = [r.get("t_wait", 0.0) if phase == "wait" else phase_times(r)[phase] for r in rows]
        colour = COLOURS.get(phase, COLOURS.get("open_topology") if phase == "open" else "#000")
        ax.bar(range(len(rows)), vals, bottom=bottom, label=phase, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, ncol=4)
    ax.set_title("analyze: phases per rank / task")
    return _png(fig)


def distributions(records):
    import matplotlib.pyplot as plt
    rows = [r for r in records if r["task"] == "analyze"]
    names = [p for p in PHASES if p != "other"] + ["wait"]
    data = [[r.get("t_wait", 0.0) if p == "wait" else phase_times(r)[p] for r in rows] for p in names]
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.boxplot(data, tick_labels=names)
    ax.set_ylabel("seconds")
    ax.set_title("analyze: distribution of each phase over ranks / tasks")
    return _png(fig)


def scaling_plot(rows):
    import matplotlib.pyplot as plt
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
    return _png(fig)


def _table(header, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(report, title="trajflow inspection"):
    records = report["records"]
    flags = report["stragglers"]
    parts = [f"<h1>{html.escape(title)}</h1>",
             "<p>Runs: " + ", ".join(html.escape(r["workdir"]) for r in report["runs"]) + "</p>"]
    parts.append("<h2>Stragglers</h2>")
    parts.append("<ul>" + "".join(f"<li>{html.escape(line.strip())}</li>"
                                  for line in straggler_lines(flags, records)) + "</ul>")
    if flags:
        parts.append(_table(
            ["run", "task", "kind", "rank(s)", "block", "host", "duration s", "baseline s",
             "baseline", "x baseline", "threshold s", "cause", "impact s", "victims' wait s"],
            [[f["run"], f["task"], f["kind"], f["rank"] if f["kind"] != "host" else
              ",".join(map(str, f["ranks"])), f["block"], f["host"], f"{f['duration_s']:.3f}",
              f"{f['baseline_s']:.3f}", f["baseline"], f"{f['ratio']:.1f}",
              f"{f['threshold_s']:.3f}", f["cause"], f"{f['impact_s']:.3f}",
              f"{f['victims_wait_s']:.3f}"] for f in flags]))
    parts.append("<h2>Advice</h2><ul>" + "".join(
        f"<li><b>{html.escape(run)}</b>: {html.escape(a['text'])}</li>"
        for run, a in report["advice"].items()) + "</ul>")
    if records:
        parts.append(f'<h2>Timeline</h2><img alt="timeline" src="{gantt(records)}">')
        if any(r["task"] == "analyze" for r in records):
            parts.append(f'<h2>Phases per rank</h2><img alt="phases" src="{stacked_bars(records)}">')
            parts.append(f'<h2>Phase distributions</h2><img alt="distributions" src="{distributions(records)}">')
    if report.get("scaling"):
        parts.append(f'<h2>Scaling</h2><img alt="scaling" src="{scaling_plot(report["scaling"])}">')
        parts.append(_table(["analysis", "io", "mode", "N", "t_total s", "S(N)", "E(N)"],
                            [[r["analysis"], r["io"], r["mode"], r["N"], f"{r['t_total']:.3f}",
                              f"{r['S_total']:.2f}", f"{r['E_total']:.2f}"] for r in report["scaling"]]))
    parts.append("<h2>Every task and rank (seconds)</h2>")
    cols = ["open", "io", "compute", "comm", "write", "launch", "other"]
    parts.append(_table(["run", "task", "rank", "block", "host", "frames"] + cols + ["wait", "total"],
                        [[r["run"], r["task"], r.get("rank"), r.get("block", ""), r.get("host"),
                          r.get("frames", "")] + [f"{phase_times(r)[c]:.3f}" for c in cols] +
                         [f"{r.get('t_wait', 0.0):.3f}", f"{r['t_total']:.3f}"] for r in records]))
    return _page(title, "".join(parts))


def _page(title, body):
    style = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{body}</body></html>")


def write_html(report, path, title="trajflow inspection"):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render(report, title))


def campaign_scaling_plot(curves):
    """Per resource: t_total, S(N) and E(N) against ranks, one line per strategy
    (paper 000 Figs. 10-11, side by side for every resource)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    resources = sorted({key[0] for key in curves})
    fig, axes = plt.subplots(len(resources), 3, figsize=(12, 3.2 * len(resources)), squeeze=False)
    for row, resource in zip(axes, resources):
        for key, pts in sorted(curves.items()):
            if key[0] != resource:
                continue
            label = f"{key[2]} {key[3]}" + (f" {key[4]}" if key[4] != "-" else "") + \
                (f" K={key[5]}" if key[5] != 1 else "")
            n = [p[0] for p in pts]
            row[0].errorbar(n, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=label)
            row[1].plot(n, [p[3] for p in pts], "o-", label=label)
            row[2].plot(n, [p[4] for p in pts], "o-", label=label)
        top = max(p[0] for key, pts in curves.items() if key[0] == resource for p in pts)
        row[1].plot([1, top], [1, top], "k:", label="ideal")
        row[2].axhline(1.0, color="k", linestyle=":")
        row[0].set_ylabel(f"{resource}\nt_total (s)")
        row[1].set_ylabel("S(N)")
        row[2].set_ylabel("E(N)")
        row[0].legend(fontsize=7)
        ns = sorted({p[0] for key, pts in curves.items() if key[0] == resource for p in pts})
        for ax in row:
            ax.set_xlabel("ranks N")
            ax.set_xticks(ns)
    fig.tight_layout()
    return _png(fig)


def campaign_phase_bars(rows):
    """Mean phases of every experiment point, resources side by side."""
    import matplotlib.pyplot as plt
    points = {}
    for r in rows:
        if "t_total" in r:
            key = (r["resource"], f"{r['io']} {r['mode']} N={r['ranks']}" +
                   (f" K={r['repeat']}" if r["repeat"] != 1 else ""))
            points.setdefault(key, []).append(r)
    keys = sorted(points)
    fig, ax = plt.subplots(figsize=(12, 4))
    bottom = [0.0] * len(keys)
    for phase, col, colour in (("open", "t_open", COLOURS["open_topology"]), ("io", "t_IO", COLOURS["io"]),
                               ("compute", "t_compute", COLOURS["compute"]),
                               ("wait", "t_wait", COLOURS["wait"]), ("comm", "t_comm", COLOURS["comm"])):
        vals = [sum(r[col] for r in points[k]) / len(points[k]) for k in keys]
        ax.bar(range(len(keys)), vals, bottom=bottom, label=phase, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(keys)), [f"{k[0]}\n{k[1]}" for k in keys], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel("seconds (slowest rank, mean of repeats)")
    ax.legend(fontsize=7, ncol=5)
    ax.set_title("analyze phases per experiment")
    return _png(fig)


def write_campaign_html(rows, cdir, path):
    """The campaign's resources compared: scaling curves, phases, and the whole table."""
    from .campaign_table import COLUMNS, curve_points
    curves = curve_points(rows)
    parts = [f"<h1>trajflow campaign {html.escape(os.path.basename(cdir))}</h1>",
             f"<p>Folder: {html.escape(cdir)}. {sum(r['status'] == 'done' for r in rows)} of "
             f"{len(rows)} experiments done.</p>"]
    if curves:
        parts.append(f'<h2>Scaling per resource</h2><img alt="scaling" '
                     f'src="{campaign_scaling_plot(curves)}">')
        parts.append(f'<h2>Phases</h2><img alt="phases" src="{campaign_phase_bars(rows)}">')
    else:
        parts.append("<p>No experiment has completed: nothing to plot.</p>")
    parts.append("<h2>Every experiment</h2>")
    parts.append(_table(COLUMNS, [[_fmt_cell(r.get(c)) for c in COLUMNS] for r in rows]))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_page(f"trajflow campaign {os.path.basename(cdir)}", "".join(parts)))


def _fmt_cell(v):
    return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else v)
