"""What runs inside the pilot: split, analyze and reduce, their readers and kernels.

Nothing here imports trajflow.workflows: a task needs only its plan.json.
"""
from .placement import drop_radical_timer_slack, leave_agent_cpus

# A task leaves the CPUs kept for RADICAL's agent before it imports anything heavy
# (numpy, h5py, numba's kernels): with every rank of a node starting at once, their
# imports would otherwise all run on the agent's CPU. A no-op without
# $TRAJFLOW_AGENT_CPUS (on the workstation, and on resources that keep none).
leave_agent_cpus()
drop_radical_timer_slack()  # and its waits end on time again (placement.py)
