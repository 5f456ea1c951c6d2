"""The task programs' exit codes that say more than "failed", so the workstation can
tell a failure a retry may cure (a killed rank, a node or file-system error: any
other code) from one it cannot."""

INJECTED_FAILURE = 3    # the testing hook TRAJFLOW_TEST_FAIL (faults.py): retried
INCOMPLETE_PARTS = 4    # reduce found the parts not covering every frame once
COLLECTIVE_TIMEOUT = 5  # an MPI rank gave up waiting for the others at the gather
ANALYSIS_RAISED = 7     # the analysis' own code raised (a user's factory, _prepare,
                        # _single_frame or _conclude): the same input raises again

NOT_RETRIED = frozenset({ANALYSIS_RAISED})
