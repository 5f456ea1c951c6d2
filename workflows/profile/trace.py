"""An inspection report as a Chrome Trace Event file (Perfetto and chrome://tracing open it).

Trace viewers zoom and search hundreds of thousands of events where a
static figure cannot. Layout: one process per task (a RADICAL task: the
ranks of an MPI task, or one block in tasks mode), one thread per rank; a
complete event ("ph": "X") per timed phase interval, with run, host, block
and frames in args; RADICAL's share as events of their own: "launch"
(RADICAL's launch_start to the rank's start), "start-up" (the rank's start to
its first timestamp: interpreter, imports) and "exit" (its last timestamp to
RADICAL's rank_stop); the pilot's own row (its bootstrapper's start to end, as
the HTML report's timeline); a straggler flag as an instant event on its member,
or on its task for a slow host. Times are microseconds on RADICAL-Pilot's
clock (seconds since the epoch, as its profiles and ours record them), so
a trace lines up with RADICAL's own profiles.
"""
import json
import os

from trajflow.tasks.modes import is_block_task
from trajflow.tasks.rundir import write_text
from trajflow.workflows.profile.advice import pilot_span
from trajflow.workflows.profile.inspection import rank_spans
from trajflow.workflows.profile.stragglers import describe


def _task_key(rec):
    return rec["run"], rec.get("rp_task_id") or rec["task"]


def _task_name(rec):
    name = f"{rec['run']} {rec['task']}"
    if is_block_task(rec) and rec.get("block") is not None:
        name += f" block {rec['block']}"
    return name + (f" ({rec['rp_task_id']})" if rec.get("rp_task_id") else "")


def trace_events(report):
    """The report's records and flags as a Chrome Trace Event object."""
    records = report["records"]
    pids = {}
    for rec in sorted(records, key=lambda r: (r["run"], r["t_start"])):
        pids.setdefault(_task_key(rec), len(pids) + 1)
    spans = {id(rec): rank_spans(rec) for rec in records}
    events = []
    for key, pid in pids.items():
        first = next(r for r in records if _task_key(r) == key)
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": _task_name(first)}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                       "args": {"sort_index": pid}})
    for rec in records:
        pid, tid = pids[_task_key(rec)], rec.get("rank", 0)
        where = f"rank {tid}" + (f" on {rec['host']}" if rec.get("host") else "")
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": where}})
        args = {k: rec.get(k) for k in ("run", "task", "rank", "host", "block", "frames")
                if rec.get(k) is not None}
        for name, cat, a, b in spans[id(rec)]:
            events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                           "ts": a * 1e6, "dur": (b - a) * 1e6,
                           "args": {**args, "seconds": round(b - a, 6)}})
    events += _pilot_events(report, len(pids) + 1)
    events += _flag_events(report["stragglers"], records, pids)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"made_by": "trajflow inspect --trace", "clock": "epoch microseconds"}}


def _pilot_events(report, pid):
    """One row for the pilot of each run, from its bootstrapper's start to its end (as
    the HTML report's timeline has it), below the tasks."""
    events = []
    for run in report.get("runs", []):  # (a report of timing tables has none)
        span = pilot_span(run["workdir"])
        if span is None:
            continue
        name = os.path.basename(run["workdir"])
        events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{name} pilot"}},
                   {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
                   {"name": "pilot", "cat": "radical", "ph": "X", "pid": pid, "tid": 0,
                    "ts": span[0] * 1e6, "dur": (span[1] - span[0]) * 1e6,
                    "args": {"run": name, "seconds": round(span[1] - span[0], 3)}}]
        pid += 1
    return events


def _flag_events(flags, records, pids):
    events = []
    for flag in flags:
        members = [r for r in records if r["run"] == flag["run"] and r["task"] == flag["task"]
                   and (r.get("rank") in flag["ranks"] if flag["kind"] == "host" else
                        r.get("rank") == flag["rank"] and r.get("block") == flag["block"])]
        if not members:
            continue
        end = max(r["t_stop"] for r in members)
        event = {"name": f"straggler ({flag['kind']}, {flag['cause']})", "cat": "straggler",
                 "ph": "i", "ts": end * 1e6, "pid": pids[_task_key(members[0])],
                 "args": {"flag": describe(flag)}}
        if flag["kind"] == "host":
            event["s"] = "p"  # the whole task: the host's ranks are named in args
        else:
            event.update(s="t", tid=members[0].get("rank", 0))
        events.append(event)
    return events


def write_trace(report, path, user_target=True):
    """The trace into `path` (a file the user named: a link of theirs is followed)."""
    write_text(path, json.dumps(trace_events(report)), user_target=user_target)
