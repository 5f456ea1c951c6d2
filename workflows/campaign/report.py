"""The campaign's report: its resources compared in one offline HTML page (scaling
curves, phases, the whole table), drawn as the run reports are (report_html.py)."""
import html
import os

from trajflow.tasks.rundir import write_text
from trajflow.workflows.campaign.table import COLUMNS, curve_points
from trajflow.workflows.profile.report_html import COLOURS, html_page, html_table, png_uri, pyplot


def campaign_scaling_plot(curves):
    """Per resource: t_total, S(N) and E(N) against ranks, one line per strategy
    (Khoshlessan et al. 2019 Figs. 10-11, side by side for every resource)."""
    plt = pyplot()
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
            if pts[0][3] is not None:  # S and E only where it ran at two or more rank counts
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
    return png_uri(fig)


def campaign_phase_bars(rows):
    """Mean phases of every experiment point, resources side by side."""
    plt = pyplot()
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
    return png_uri(fig)


def write_campaign_html(rows, cdir, path):
    """The campaign's resources compared: scaling curves, phases, and the whole table."""
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
    parts.append(html_table(COLUMNS, [[_fmt_cell(r.get(c)) for c in COLUMNS] for r in rows]))
    write_text(path, html_page(f"trajflow campaign {os.path.basename(cdir)}", "".join(parts)),
               user_target=True)


def _fmt_cell(v):
    return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else v)
