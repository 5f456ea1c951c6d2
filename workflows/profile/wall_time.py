"""Where a run's wall time went: one number, from the call to the run's end, cut into
parts that add up to it.

The wall time runs from the moment the user asked (plan.asked_at) to the moment
the run said how it ended (outcome.json's `ended`); `trajflow runs`,
`inspect`, `Run.summary()` and the report all give this one number. It is
cut at moments the run's folder keeps:

- planning: from the call until the run was handed to its pilot (`handed_at`);
- in the pilot's queue: until its pilot took it from its queue (`dispatched_at`):
  gathering runs submitted together into one batch (0.3 s; a run sent while others
  run joins them at once);
- pilot start: until the pilot's agent was active (RADICAL's PMGR_ACTIVE), where
  the pilot was started for this run;
- hand-over: EnTK and RADICAL passing the first task to the agent's scheduler;
- then, over the tasks: each stage's name while one of its tasks held cores;
  in the agent's scheduler while a task of the run waited there and none of its
  tasks ran: for cores another run held, or the scheduler's own pass (about 0.1 s
  a task on an idle local pilot, measured); between stages while none
  waited and none ran (EnTK moving to the next stage);
- collecting: from the last task's end until the outcome was written.

A moment a folder lacks (an older run, a run without a lock) gives its time to
the next part (without the hand-over's moment, planning and hand-over are one
part: before the first task); a moment out of order (clocks of two hosts) is held to the one
before it, so the parts always add up to the whole.
"""
from trajflow.tasks.plan import is_finite_number
from trajflow.tasks.rundir import INTERRUPTED

QUEUED = "in the pilot's queue"
BEFORE_TASKS = ("planning", QUEUED, "pilot start", "hand-over")
BEFORE_FIRST_TASK = "before the first task"  # planning and hand-over, where not told apart
WAITING_FOR_CORES = "in the agent's scheduler"
BETWEEN_STAGES = "between stages"
COLLECTING = "collecting"
FIXED_PARTS = BEFORE_TASKS + (BEFORE_FIRST_TASK, WAITING_FOR_CORES, BETWEEN_STAGES, COLLECTING)


def task_spans(records):
    """One (stage, arrived, started, ended) per RADICAL task of the records (its ranks
    together): arrived at the agent's scheduler, got its cores, gave them back. Where RADICAL's
    events are not kept (a timing table, an older folder), the ranks' own times."""
    tasks = {}
    for rec in records:
        # RADICAL's task ids start again in a resumed run's new session
        key = (rec.get("run"), rec.get("rp_session"),
               rec.get("rp_task_id") or (rec["task"], rec.get("block"), rec.get("source")))
        rp = rec.get("radical") or {}
        launched = rp.get("launch_start", rec["t_start"] - (rec.get("t_launch") or 0.0))
        arrived = rp.get("queued", launched)
        started = rp.get("cores", launched)
        # until the scheduler took its cores back (the next stage's task waits for them)
        ended = max(rp.get("released", 0.0), rp.get("launch_stop", 0.0), rec["t_stop"])
        span = tasks.get(key)
        tasks[key] = (rec["task"], arrived, started, ended) if span is None else (
            span[0], min(span[1], arrived), min(span[2], started), max(span[3], ended))
    return [(stage, a, max(a, s), max(a, s, e)) for stage, a, s, e in tasks.values()]


def over_tasks(spans):
    """{part: seconds} from the first task's arrival to the last one's end: a stage's
    name while a task of it ran (the last stage to start, where two overlap: the reduce
    an MPI analyze task's root does at its end is reduce's time, not analyze's),
    in the agent's scheduler while some waited there and none ran, between stages
    otherwise."""
    spans = [(stage if stage not in FIXED_PARTS else f"{stage} (tasks)", a, s, e)
             for stage, a, s, e in spans]  # a table's task named like a part stays apart
    order = {}
    for stage, _, started, _ in sorted(spans, key=lambda s: s[2]):
        order.setdefault(stage, len(order))
    events = []
    for stage, arrived, started, ended in spans:
        events += [(arrived, "queued", +1, stage), (started, "queued", -1, stage),
                   (started, "running", +1, stage), (ended, "running", -1, stage)]
    events.sort(key=lambda e: e[0])
    parts = {stage: 0.0 for stage in order}
    parts.update({WAITING_FOR_CORES: 0.0, BETWEEN_STAGES: 0.0})
    queued, running = 0, {stage: 0 for stage in order}
    for (when, kind, delta, stage), (after, *_rest) in zip(events, events[1:] + [events[-1]]):
        if kind == "queued":
            queued += delta
        else:
            running[stage] += delta
        length = after - when
        if length <= 0:
            continue
        busy = [s for s in order if running[s] > 0]
        part = (max(busy, key=order.get) if busy else
                WAITING_FOR_CORES if queued > 0 else BETWEEN_STAGES)
        parts[part] += length
    return parts


def wall_time(records, asked_at=None, handover=None, pilot=None, ended=None):
    """{"whole": seconds, "parts": {name: seconds} in time order, "ended": whether the
    run said how it ended}; None where nothing is known. `handover` holds the
    outcome's handed_at and dispatched_at, `pilot` the (start, active) of a pilot
    started for the run, `ended` the outcome's end (ended_at). A resumed run's records
    of its earlier attempts (ended before this attempt was asked for) are not its."""
    handover = handover or {}
    begun = started_at(asked_at, handover)
    spans = [s for s in task_spans(records) if begun is None or s[3] > begun]
    first = min((a for _, a, _, _ in spans), default=None)
    started, active = pilot or (None, None)
    if active is None and _moment(started) and started > (started_at(asked_at, handover) or 0):
        active = first  # an older folder knows only when a pilot started for this run began
    marks = [handover.get("handed_at"), handover.get("dispatched_at"), active]
    last = max((e for _, _, _, e in spans), default=None)
    start = begun if begun is not None else first if first is not None else (
        ended if _moment(ended) else None)
    if start is None:
        return None
    said = _moment(ended)
    limit = first if first is not None else ended if said else None  # where these moments end
    parts, cursor = {}, start
    names = BEFORE_TASKS if _moment(marks[0]) else BEFORE_TASKS[1:3] + (BEFORE_FIRST_TASK,)
    for name, when in zip(names, (marks if _moment(marks[0]) else marks[1:]) + [first]):
        if not _moment(when):
            continue
        when = max(when, cursor) if limit is None else min(max(when, cursor), max(limit, cursor))
        parts[name] = when - cursor
        cursor = when
    if spans:
        parts.update(over_tasks([(s, max(a, cursor), max(b, cursor), max(e, cursor))
                                 for s, a, b, e in spans]))
        cursor = max(cursor, last)
    stop = max(ended, cursor) if said else cursor
    parts[COLLECTING] = stop - cursor
    return {"whole": stop - start, "parts": parts, "ended": said}


def started_at(asked_at, handover):
    """Where a run's wall time starts: the call, or where a plan was made without one
    (a campaign's experiment) the moment it was handed to its pilot; None if neither."""
    return next((t for t in (asked_at, handover.get("handed_at"), handover.get("dispatched_at"))
                 if _moment(t)), None)


def ended_at(outcome):
    """When the run said how it ended (outcome.json's `ended`), or None: not ended, or
    its client killed before it could say (the handover's record then stands, whose
    `ended` is when it was handed over)."""
    outcome = outcome or {}
    return None if outcome.get("error") == INTERRUPTED else outcome.get("ended")


def whole_from_outcome(asked_at, outcome):
    """The wall time as `wall_time` gives it, from the plan's call and outcome.json
    alone (a listing of many runs reads no records); None while it has not ended."""
    start, ended = started_at(asked_at, outcome or {}), ended_at(outcome)
    return max(0.0, ended - start) if start is not None and _moment(ended) else None


def _moment(value):
    return is_finite_number(value) and value > 0


def describe(wall, least_s=0.05):
    """"12.3 s: 0.4 s planning, 3.1 s in the pilot's queue, ..." (parts under
    `least_s` left out of the words, not of the sum)."""
    said = ", ".join(f"{s:.1f} s {name}" for name, s in wall["parts"].items() if s >= least_s)
    return f"{wall['whole']:.1f} s" + (f" ({said})" if said else "")
