"""What can go wrong in a run, as exceptions a workflow script can catch.

    >>> import trajflow
    >>> try:
    ...     run = trajflow.run("adk.psf", "adk.dcd", "rmsd")
    ... except trajflow.InputError as exc:      # nothing was written, no pilot
    ...     print(exc)
    ... except trajflow.RunFailed as exc:       # tasks failed; what ran is in exc.run
    ...     for task in exc.failed_tasks:
    ...         print(task.describe())

The CLI turns them into exit codes: InputError 2, RunFailed 1, Interrupted 130.
"""

# the exit codes of `trajflow` and of the processes it starts (a stop signal N: 128 + N)
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class InputError(Exception):
    """Bad input: the message names the problem and the fix. Raised before
    anything is written or any pilot is requested.

    Examples
    --------
    >>> trajflow.run(PSF, DCD, "rmsd", io="nfs")
    trajflow.InputError: unknown --io 'nfs': choose one of shared, split, h5md
    """


class RunFailed(Exception):
    """A run ended without a complete result.

    Attributes
    ----------
    failed_tasks : list of TaskOutcome
        each failed task's stage, attempt, exit code, sandbox and stderr tail
        (``task.describe()`` says it in words).
    run : Run
        the run as far as it went: its folder, plan, outcome and profile
        (``run.results`` raises, since there is no complete result).

    Examples
    --------
    >>> try:
    ...     trajflow.run(PSF, DCD, "rmsd", mode="tasks", retries=0)
    ... except trajflow.RunFailed as exc:
    ...     task = exc.failed_tasks[0]
    ...     print(task.stage, task.exit_code, task.sandbox, task.stderr_tail)
    """

    def __init__(self, message, failed_tasks=(), run=None):
        super().__init__(message)
        self.failed_tasks = list(failed_tasks)
        self.run = run


class Interrupted(Exception):
    """The user stopped the run (Ctrl-C); the pilot was cancelled and its tasks ended.
    From Campaign.run, `exc.result` is the CampaignResult so far.

    Examples
    --------
    >>> try:
    ...     run = trajflow.run(PSF, DCD, "rmsd")
    ... except trajflow.Interrupted:
    ...     print("stopped; nothing is left running")
    """
