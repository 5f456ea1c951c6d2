"""A core of its own for RADICAL (local.localhost_agent_core) on a real local pilot.

The resource keeps CPU 0 for RADICAL (system_architecture.blocked_cores): the
bootstrap pins the agent there, the client's process and EnTK go there, RADICAL
schedules no task there, and every task moves itself to the other CPUs
(tasks/placement.py); RADICAL's processes, there, run with trajflow's timer slack. Checked while the pilot is up: every process below the
pilot's process may run on CPU 0 only, among them the agent; every task's record
says it ran elsewhere; the result is MDAnalysis'. (That the ranks then run as
fast as under plain mpiexec is measured by `trajflow bench --scale large`, not
timed here.)
"""
import os

import numpy as np
import pytest

import trajflow
from trajflow.tasks.placement import RADICAL_TIMER_SLACK_NS, timer_slack_ns
from trajflow.tasks.procfs import descendants, processes

pytestmark = pytest.mark.serial  # every CPU but the agent's is the pilot's

RESOURCE = "local.localhost_agent_core"


def allowed_cpus(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        line = next(li for li in fh if li.startswith("Cpus_allowed_list:"))
    out = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def working_folder(pid):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a CPU besides the agent's")
def test_radical_stays_on_cpu_0_and_the_tasks_leave_it(tmp_path, adk, reference_results,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # the pilot's session folder goes there
    with trajflow.Pilot(RESOURCE, walltime=10, progress=False) as pilot:
        assert pilot.cpus == os.cpu_count() - 1  # the default: every core but the agent's
        run = pilot.run(adk[0], adk[1], "rmsd", blocks=pilot.cpus, out=str(tmp_path / "rmsd"))
        every = processes()
        # the client's (forked from the pilot's process) and the agent's (started in
        # the pilot's sandbox, named after the session, by the bootstrapper)
        below = descendants([pilot._process._child.pid], every)
        session = os.path.basename(pilot.session_dir)
        agent = {p.pid for p in every if session in working_folder(p.pid)}
        titles = {p.pid: p.title for p in every if p.pid in below | agent}
        assert any("agent" in titles[pid] for pid in agent), sorted(titles.values())
        placed = {f"{pid} {titles[pid]}": allowed_cpus(pid) for pid in titles
                  if os.path.exists(f"/proc/{pid}")}
        slack = {f"{pid} {titles[pid]}": timer_slack_ns(pid) for pid in titles
                 if "trajflow.tasks" not in titles[pid]}  # the guard is trajflow's own
    assert all(cpus == {0} for cpus in placed.values()), "\n".join(f"{k}: {v}" for k, v in placed.items())
    # and they wake less often while idle (a process gone meanwhile reads None)
    slack = {k: v for k, v in slack.items() if v is not None}
    other = {k: v for k, v in slack.items() if v != RADICAL_TIMER_SLACK_NS}
    if os.geteuid() == 0:  # another process' slack is readable with CAP_SYS_NICE only
        assert len(slack) > 10 and not other, other
    ref = reference_results(adk[0], [adk[1]], "rmsd")
    np.testing.assert_allclose(run.results.rmsd, ref["rmsd"], atol=1e-4)
    tasks = {r["task"] for r in run.profile.records}
    assert tasks == {"analyze", "reduce"}  # shared io: no split stage
    for r in run.profile.records:
        assert r["cpus"] and 0 not in r["cpus"], (r["task"], r["cpus"])
        assert r["t_cpu_wait"] is None or r["t_cpu_wait"] >= 0
