"""RADICAL-Pilot's agent_0, run with its bridges and components forked from one
warm Python (tasks/component_starter.py), as the client's are.

RADICAL's bootstrapper starts the agent as `$LAUNCHER radical-pilot-agent_0 PID`;
a pre_bootstrap_0 entry of the session's config (workflows/run/resources.py,
where the pilot runs in this virtualenv) sets LAUNCHER to this module, which
turns forked starts on and runs the agent's own script in this process (runpy:
the agent's pid is the one the bootstrapper watches, its name is `rp.agent.0`).
The agent's 12 bridges and 4 components then start in ~0.1-0.3 s each instead of
0.25-0.5 s. Beside it runs the server of the pilot's single-core tasks
(tasks/task_server.py). The agent's RPC requests are sent again while unanswered
(tasks/agent_rpc.py: its first one could be lost, and its start hung), it waits
on its two input queues at once (tasks/agent_waits.py), and its loops sleep until
there is something to do (tasks/quiet_components.py). Flags in
front turn the task server (`--no-task-server`) and the forked starts
(`--no-forked-starts`) off. Anything else it is asked to launch is exec'd as it is.
"""
import os
import sys

from trajflow.tasks.agent_rpc import resend_unanswered_rpcs
from trajflow.tasks.agent_waits import wait_on_all_inputs
from trajflow.tasks.quiet_components import quiet_components
from trajflow.tasks.component_starter import run_as_main, same_python_script, use_forked_starts
from trajflow.tasks.placement import keep_inherited_placement
from trajflow.tasks.task_server import start_beside_agent

AGENT = "radical-pilot-agent_0"
NO_TASK_SERVER = "--no-task-server"
NO_FORKED_STARTS = "--no-forked-starts"


def main(argv):
    flags = set()
    while argv[:1] and argv[0] in (NO_TASK_SERVER, NO_FORKED_STARTS):
        flags.add(argv.pop(0))
    script = same_python_script(AGENT) if argv[:1] == [AGENT] else None
    if script is None:  # not RADICAL's agent, or another Python's: run as it is
        os.execvp(argv[0], argv)
    keep_inherited_placement()  # the agent's timer slack and CPUs, not a task's
    if NO_FORKED_STARTS not in flags:
        use_forked_starts(agent=True)
    if NO_TASK_SERVER not in flags:
        start_beside_agent()
    from radical.pilot.utils.component import BaseComponent  # (as the script is about to)
    resend_unanswered_rpcs(BaseComponent)
    wait_on_all_inputs(BaseComponent)  # agent_0's two queues hold requests (quiet_bridges)
    quiet_components(BaseComponent)  # its watcher, main thread and timed callbacks sleep
    run_as_main(script, argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
