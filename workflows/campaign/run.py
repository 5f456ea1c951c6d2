"""Run a campaign: one pilot per resource, the resources side by side.

CAMPAIGN_DIR holds everything: the campaign file as run (campaign.toml), the
expanded experiments (experiments.json), one RUNDIR per experiment under
runs/<resource>/, the EnTK sessions under sessions/<resource>/, one log per
resource under logs/, and the campaign table (campaign.csv).

Each resource gets a process of its own (in its own process group, so that a
Ctrl-C is forwarded to it exactly once) holding one AppManager and one pilot;
its experiments run on that pilot one after another (their timings are not
disturbed by each other), or side by side with `concurrent = true`. Every
experiment's RUNDIR gets outcome.json when it ends, which is what the
progress lines and `--resume` read: a failed experiment is recorded and the
others go on.
"""
import dataclasses
import hashlib
import html
import json
import logging
import multiprocessing
import os
import shutil
import signal
import time

from trajflow.tasks.plan import RunPlan
from trajflow.tasks.rundir import (MARKER, PLAN, read_outcome, record_outcome, replaced_whole,
                                   write_text)
from trajflow.tasks.universe_args import trajectory_keywords
from trajflow.workflows.campaign.folders import (CAMPAIGN_MARKER, EXPERIMENTS_FILE,
                                                 is_campaign_dir, resource_log, rundir,
                                                 session_root)
from trajflow.workflows.campaign.remote import run_remote_resource
from trajflow.workflows.campaign.spec import CampaignSpec
from trajflow.workflows.campaign.table import (COLUMNS, experiment_rows, summary_lines, TABLE_FILE,
                                               write_table)
from trajflow.workflows.datasets import adk_concatenated
from trajflow.workflows.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Interrupted, RunFailed
from trajflow.workflows.profile.report_html import html_table
from trajflow.workflows.run import held_client, resources, signals
from trajflow.workflows.run.execute import run_plans
from trajflow.workflows.run.progress import close_bar, new_bar, shown
from trajflow.workflows.run.planning import (check_outdir, InputError, read_inputs, resolve,
                                             write_plan)
from trajflow.workflows.run.spec import RunSpec


log = logging.getLogger(__name__)

def input_files(campaign: CampaignSpec):
    """(topology, [trajectories]); a built-in dataset is built once in the cache."""
    if "dataset" in campaign.input:
        top, traj = adk_concatenated(campaign.input["copies"], campaign.input["format"])
        return top, [traj]
    return campaign.input["topology"], campaign.input["trajectory"]


def check_resources(campaign: CampaignSpec):
    """Each local resource known and valid, its pilot's options too (a remote one is
    checked on its machine)."""
    for label in campaign.resources:
        if campaign.resources[label].remote:
            continue
        try:
            resources.check_resource(label)
        except ValueError as exc:
            raise InputError(f"[resources.\"{label}\"]: {exc}")
        if campaign.resources[label].held_pilot:
            _check_held_pilot(campaign, label)
        else:
            campaign.checked_pilot_spec(label)


def _check_held_pilot(campaign, label):
    """The held pilot a resource names is there, on that resource, with the cores its
    largest experiment needs; InputError before anything is written."""
    name = campaign.resources[label].held_pilot
    status = held_client.held_status(name)
    where = f"[resources.\"{label}\"] pilot = \"{name}\""
    if status["resource"] != resources.resolve_resource(label):
        raise InputError(f"{where}: that pilot is on {status['resource']}, not {label}: name "
                         f"the resource [resources.\"{status['resource']}\"]")
    needed = campaign.cores(label)
    if status["cpus"] < needed:
        raise InputError(f"{where}: that pilot has {status['cpus']} cores and the largest "
                         f"experiment needs {needed}: hold a larger one, or fewer ranks")


def plan_experiments(campaign: CampaignSpec, cdir: str, resume: bool):
    """{experiment: plan} for every experiment still to run, checked, nothing written.

    With `resume`, experiments whose outcome is "done" (and whose result is
    there) are kept, provided they were made from the same inputs and
    analysis; the others will be run again from the start (a timing
    experiment half from one pilot and half from another measures nothing).
    """
    local = [e for e in campaign.experiments if not campaign.resources[e.resource].remote]
    if not local:  # every experiment is planned on its own machine
        return {}, []
    top, trajs = input_files(campaign)
    chosen = RunSpec(**{k: campaign.option(k) for k in ("start", "stop", "step", "frames",
                                                        "universe", "format", "topology_format")})
    inputs = read_inputs(top, trajs, campaign.analysis, campaign.option("select"),
                         campaign.option("args"), campaign.option("allow_truncated"),
                         campaign.option("trial"), chosen, chosen.universe)  # once for all
    todo, kept = {}, []
    for e in local:
        d = rundir(cdir, e)
        if resume and os.path.exists(os.path.join(d, PLAN)):
            outcome = read_outcome(d)
            old = RunPlan.load(os.path.join(d, PLAN))
            if outcome and outcome["status"] == "done" and os.path.exists(old.result_path()):
                if (old.input_checksum != inputs.checksum or old.analysis != campaign.analysis
                        or old.analysis_args != inputs.analysis_args
                        or old.universe != inputs.universe):
                    raise InputError(f"--resume: experiment {e.id} was run on other inputs or "
                                     "another analysis than the campaign file now names; start "
                                     "a new campaign folder (--out) instead of mixing the two")
                kept.append(e)
                continue
        todo[e] = resolve(campaign.run_spec(e, top, trajs, d), cores=campaign.cores(e.resource),
                          new_out=False, inputs=inputs)
        todo[e].asked_at = 0.0  # experiments wait their turn: each is timed from its tasks
        if e.io == "h5md":
            todo[e].shared_h5md = shared_h5md_path(cdir, inputs.checksum,
                                                   campaign.option("compression"),
                                                   todo[e].frame_selection,
                                                   trajectory_keywords(inputs.universe))
    return todo, kept


def shared_h5md_path(cdir, checksum, compression, frame_selection=None, read_as=None):
    """The campaign's one H5MD copy of its inputs (each h5md experiment wrote its own
    376 MB copy of the same file, seen); named by the inputs, the frames chosen (a copy
    holds just those) and the Universe keywords that change how they read (`read_as`: a
    dt or format), so other inputs, frames or readings never reuse it."""
    chosen = frame_selection if not read_as else {"frames": frame_selection, "read_as": read_as}
    frames = "all" if chosen is None else hashlib.sha256(
        json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cdir, "shared",
                        f"trajectory-{checksum[:16]}-{compression or 'none'}-{frames}.h5md")


def prepare_dir(campaign: CampaignSpec, out: str, resume: bool) -> str:
    cdir = os.path.abspath(out)
    if resume:
        if not is_campaign_dir(cdir):
            raise InputError(f"--resume: {cdir!r} is not a trajflow campaign folder; give the "
                             "--out folder of the campaign to resume")
        return cdir
    if os.path.exists(cdir) and is_campaign_dir(cdir):
        raise InputError(f"{cdir!r} holds an earlier campaign: add --resume to finish it, or "
                         "choose another --out")
    return check_outdir(cdir)


def describe(campaign: CampaignSpec, cdir: str, kept=()) -> str:
    """What a run would do: the experiments and each resource's pilot description."""
    lines = [f"campaign {campaign.name}: {len(campaign.experiments)} experiments "
             f"({campaign.design} design, {campaign.repeats} repeat(s) each) of "
             f"{campaign.analysis} on {len(campaign.resources)} resource(s); folder {cdir}"]
    for label in campaign.resources:
        cfg = resources.resource_config(label) or {}
        lm = cfg.get("launch_methods", {}).get("order", [])
        remote = campaign.resources[label].remote
        if remote:
            held = campaign.resources[label].held_pilot
            lines.append(f"\n{label}: by a campaign on {remote.remote} over SSH (planned and checked "
                         "there" + (f", on its held pilot {held}" if held else "")
                         + "), fetched into runs/ here")
            lines += [f"  {e.id:55s} to run there" for e in campaign.on(label)]
            continue
        if campaign.resources[label].held_pilot:
            lines.append(f"\n{label}: the held pilot {campaign.resources[label].held_pilot} "
                         "(no pilot start); experiments "
                         + ("side by side" if campaign.concurrent else "one after another"))
            lines += [f"  {e.id:55s} to run" for e in campaign.on(label)]
            continue
        lines.append(f"\n{label}: pilot {json.dumps(campaign.pilot(label))}")
        lines.append(f"  batch system {cfg.get('resource_manager', '?')}, default queue "
                     f"{cfg.get('default_queue') or '-'}, launch methods {', '.join(lm) or '?'}; "
                     + ("experiments side by side" if campaign.concurrent
                        else "experiments one after another"))
        for e in campaign.on(label):
            state = "done, kept" if e in kept else "to run"
            lines.append(f"  {e.id:55s} {state}")
    return "\n".join(lines)


def write_campaign_files(campaign: CampaignSpec, cdir: str, todo: dict):
    """The campaign's folder, the file as run, experiments.json, and each plan."""
    os.makedirs(cdir, exist_ok=True)
    # written whole under new names: a link planted in a reused folder is replaced
    write_text(os.path.join(cdir, CAMPAIGN_MARKER), "This folder is a trajflow campaign.\n")
    with replaced_whole(os.path.join(cdir, "campaign.toml")) as tmp:
        shutil.copyfile(campaign.path, tmp)
    write_text(os.path.join(cdir, EXPERIMENTS_FILE), json.dumps(
        {"name": campaign.name, "analysis": campaign.analysis,
         "experiments": [dict(e.as_dict(), rundir=os.path.relpath(rundir(cdir, e), cdir))
                         for e in campaign.experiments]}, indent=1))
    plans = {}
    for e, plan in todo.items():
        if os.path.exists(os.path.join(plan.workdir, MARKER)):
            shutil.rmtree(plan.workdir)  # an unfinished experiment of ours: run it again whole
        plans[e] = (plan, write_plan(plan))
    return plans


@dataclasses.dataclass
class CampaignResult:
    """How a campaign ended: its table, one record per experiment (as campaign.csv).

    Examples
    --------
    >>> result = trajflow.Campaign.load("scaling.toml").run(out="adk-scaling")
    >>> [(r["experiment"], r["status"], r["t_total"], r["E"]) for r in result.records]
    >>> result.failures            # the records of experiments that did not end done
    >>> result.to_csv("table.csv")
    """
    path: str                 # CAMPAIGN_DIR
    records: list             # one dict per experiment, campaign.csv's columns
    interrupted: bool = False

    def __repr__(self):
        done = len(self.records) - len(self.failures)
        return (f"<trajflow.CampaignResult {len(self.records)} experiments: {done} done, "
                f"{len(self.failures)} not{', interrupted' if self.interrupted else ''}: "
                f"{self.path}>")

    def _repr_html_(self):
        """In a notebook: the campaign's table, an experiment a row."""
        columns = [c for c in COLUMNS if any(c in r for r in self.records)]
        return (f"<p>{html.escape(repr(self))}</p>"
                + html_table(columns, [[r.get(c, "") for c in columns] for r in self.records]))

    @property
    def table_path(self):
        return os.path.join(self.path, TABLE_FILE)

    @property
    def failures(self):
        return [r for r in self.records if r["status"] != "done"]

    @property
    def ok(self):
        return not self.interrupted and not self.failures

    def to_csv(self, path):
        return write_table(self.records, path)

    def summary(self):
        return "\n".join(summary_lines(self.records))


def dry_run(campaign: CampaignSpec, out: str, resume=False) -> dict:
    """What run_campaign would do, checked (inputs read, plans made), nothing written:
    the folder, the experiments (each "to run" or "done, kept"), each resource's
    pilot description, and the same as text."""
    cdir = prepare_dir(campaign, out, resume)
    check_resources(campaign)
    todo, kept = plan_experiments(campaign, cdir, resume)
    return {"folder": cdir,
            "experiments": [dict(e.as_dict(), state="done, kept" if e in kept else "to run",
                                 rundir=rundir(cdir, e)) for e in campaign.experiments],
            "pilots": {label: campaign.pilot(label) for label in campaign.resources},
            "text": describe(campaign, cdir, kept)}


def run_campaign(campaign: CampaignSpec, out: str, resume=False, progress=True) -> CampaignResult:
    """Run the campaign's experiments, one pilot per resource side by side; the
    table is written to CAMPAIGN_DIR/campaign.csv and returned. InputError before
    anything is written; Interrupted (its `result` the table so far) on Ctrl-C.
    `progress`: the plan and a bar per resource on stderr."""
    cdir = prepare_dir(campaign, out, resume)
    check_resources(campaign)
    todo, kept = plan_experiments(campaign, cdir, resume)
    log.log(shown(progress), describe(campaign, cdir, kept))
    plans = write_campaign_files(campaign, cdir, todo)
    procs = {}
    ctx = multiprocessing.get_context("fork")
    for label in campaign.resources:
        mine = [(e, *plans[e]) for e in campaign.on(label) if e in plans]
        if campaign.resources[label].remote:
            procs[label] = ctx.Process(target=run_remote_resource, name=f"trajflow-{label}",
                                       args=(campaign, label, cdir, resume))
        elif mine:
            procs[label] = ctx.Process(target=_run_resource, name=f"trajflow-{label}",
                                       args=(campaign, label, mine, cdir))
        else:
            continue
        procs[label].start()
    interrupted = _follow(campaign, cdir, procs, kept, progress)
    rows = experiment_rows(cdir)
    with replaced_whole(os.path.join(cdir, TABLE_FILE)) as tmp:  # never through a link
        write_table(rows, tmp)
    result = CampaignResult(cdir, rows, interrupted)
    if interrupted:
        exc = Interrupted(f"{signals.describe_stop()}; every resource's pilot was cancelled")
        exc.result = result
        raise exc
    return result


def _follow(campaign, cdir, procs, kept, progress=True) -> bool:
    """A progress bar per resource until every resource process has ended.
    Ctrl-C is passed to each resource process once; they cancel their pilots."""
    level = shown(progress)
    bars, seen = {}, set(kept)
    for i, label in enumerate(procs):
        bars[label] = new_bar(total=len([e for e in campaign.on(label) if e not in seen]),
                              desc=label, position=i, unit="exp", leave=True,
                              disable=None if progress else True)
    interrupted = False
    while True:
        try:
            alive = [p for p in procs.values() if p.is_alive()]
            for label in procs:
                for e in campaign.on(label):
                    outcome = read_outcome(rundir(cdir, e))
                    if outcome and e not in seen:
                        seen.add(e)
                        bars[label].update(1)
                        msg = f"{e.id}: {outcome['status']}"
                        if outcome["status"] != "done":
                            msg += f" ({outcome.get('error') or outcome.get('stopped_at') or 'a task failed'})"
                        log.log(level, msg)
            if not alive:
                break
            time.sleep(1.0)
        except KeyboardInterrupt:
            if interrupted:
                continue  # already asked; keep waiting for the pilots to be cancelled
            interrupted = True
            log.warning("interrupted; cancelling every resource's pilot")
            for p in procs.values():
                if p.is_alive():
                    os.kill(p.pid, signal.SIGINT)
    for bar in bars.values():
        close_bar(bar)
    return interrupted or any(p.exitcode == EXIT_INTERRUPTED for p in procs.values())


def _run_resource(campaign, label, runs, cdir):
    """One resource's process: its pilot, its experiments; output to logs/<label>.log."""
    with resource_log(cdir, label):
        code, error = EXIT_OK, None
        try:
            if campaign.resources[label].held_pilot:
                code = _run_on_held(campaign, label, runs)
            else:
                report = run_plans([(e.id, plan, path) for e, plan, path in runs],
                                   campaign.pilot_spec(label),
                                   session_root=session_root(cdir, label),
                                   retries=campaign.option("retries"),
                                   one_at_a_time=not campaign.concurrent)
                for o in report.failed:
                    print(o.describe())
                code = EXIT_OK if report.ok else EXIT_FAILED
        except (Interrupted, KeyboardInterrupt):
            code, error = EXIT_INTERRUPTED, f"{signals.describe_stop()}; the pilot was cancelled"
        except Exception as exc:  # the pilot did not start, EnTK broke: recorded, others go on
            code, error = EXIT_FAILED, f"{type(exc).__name__}: {exc}"
        for e, plan, _ in runs:
            if read_outcome(plan.workdir) is None:
                record_outcome(plan.workdir, "failed", error or "did not run")
        print(f"{label}: ended with exit code {code}" + (f": {error}" if error else ""))
    os._exit(code)


def _run_on_held(campaign, label, runs):
    """A resource's experiments on the held pilot it names: one after another (side by
    side if the campaign is concurrent); the exit code."""
    spec = RunSpec(retries=campaign.option("retries"))
    failed = False
    with held_client.HeldPilot(campaign.resources[label].held_pilot) as pilot:
        futures = []
        for experiment, plan, path in runs:
            futures.append(pilot.submit_written(plan, path, spec))
            if not campaign.concurrent:
                failed |= not _ended_well(futures[-1], experiment)
        if campaign.concurrent:
            failed = not all([_ended_well(f, e) for f, (e, _, _) in zip(futures, runs)])
    return EXIT_FAILED if failed else EXIT_OK


def _ended_well(future, experiment):
    try:
        future.result()
        return True
    except RunFailed as exc:
        print(f"{experiment.id}: {exc}")
        return False


class Campaign(CampaignSpec):
    """A campaign file read and checked (CampaignSpec), that runs.

    Examples
    --------
    >>> campaign = trajflow.Campaign.load("scaling.toml")
    >>> campaign.dry_run()["pilots"]            # nothing written or submitted
    >>> result = campaign.run(out="adk-scaling")
    >>> result.records, result.failures
    """

    def dry_run(self, out=None, resume=False) -> dict:
        """Check everything (inputs read, every plan made) and write nothing: the
        experiments (each "to run" or "done, kept"), each resource's pilot
        description, the folder, and all that as "text"."""
        return dry_run(self, self._folder(out), resume)

    def run(self, out=None, resume=False, progress=True):
        """Run every experiment (one pilot per resource, the resources side by
        side) and return the CampaignResult; `resume` keeps what completed in
        `out`. A failed experiment is recorded in the table, the others go on.
        Raises InputError before anything is written, Interrupted on Ctrl-C.

        Examples
        --------
        >>> result = trajflow.Campaign.load("scaling.toml").run(out="adk-scaling")
        >>> result.ok, result.failures, result.table_path
        """
        return run_campaign(self, self._folder(out), resume, progress)
