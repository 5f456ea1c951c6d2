"""End a task's process the moment its work is on disk.

A task's interpreter took 0.25-0.4 s to exit after its last timestamp
(numba's and MDAnalysis' teardown, measured: numba with loaded kernels 0.38 s,
MDAnalysis 0.25 s, numpy alone 0.03 s), against milliseconds of work per
block: RADICAL-Pilot holds the task's core until the process is gone. Every
file a task writes is closed before its main() returns, so after flushing
stdout and stderr the process can end with os._exit: 0.01 s.

Not an MPI rank: ranks ended by os._exit right after MPI_Finalize were
reported by mpiexec as "Killed (signal 9)" (23 % of 3-rank launches on 2
cores, 0 of 60 the normal way): MPICH sends its PMI "finalize" to hydra's proxy
from a C atexit handler, which os._exit skips (libc's exit() would run it). An MPI rank exits the normal way (atexit
handlers, mpi4py's MPI_Finalize) but with the garbage collector's last sweep
over every object of its imports skipped (gc.freeze): 0.07-0.13 s to 0.02-0.03
s from its last timestamp to mpiexec's end, 0 failures in 120 such launches.
"""
import gc
import os
import sys
import traceback


def run_and_exit(main):
    """sys.exit(main()) with the same exit codes and messages, without the teardown."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # what the interpreter would print, and its exit code
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if _is_mpi_rank():
        gc.disable()
        gc.freeze()
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _is_mpi_rank():
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized()


def abort_mpi_job(code):
    """MPI_Abort of the whole job, and this rank's end: MPICH's MPI_Abort returns once it
    has told its launcher, which then kills the job (seen), and nothing of this rank may
    run on meanwhile (a rank served by the task server, in a process group of its own,
    ran on into the lines after it). Never returns."""
    from mpi4py import MPI
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)
