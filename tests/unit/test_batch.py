"""The batch-system objects' parsing and wording, with a stand-in `sinfo` on PATH
(the real SLURM daemons are exercised by tests/pilot/test_vcluster*.py)."""
import os
import stat

from trajflow.workflows.run.batch import BATCH_SYSTEMS, lost_nodes_of_job
from trajflow.workflows.profile.advice import slow_host_advice

SLURM = BATCH_SYSTEMS["SLURM"]


def fake_sinfo(tmp_path, monkeypatch, lines):
    script = tmp_path / "sinfo"
    script.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\ncat <<'EOF'\n"
                      + "\n".join(lines) + "\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_slurm_names_the_nodes_that_are_down_or_not_responding(tmp_path, monkeypatch):
    fake_sinfo(tmp_path, monkeypatch, ["n1|allocated|none", "n2|down*|Not responding",
                                       "n3|idle*|none", "n4|drained|maintenance",
                                       "n5|failing|bad disk"])
    assert SLURM.lost_nodes("n[1-5]") == ["n2 (SLURM: down, not responding)",
                                         "n3 (SLURM: idle, not responding)",
                                         "n5 (SLURM: failing, bad disk)"]
    assert "-n n[1-5]" in (tmp_path / "args").read_text()


def test_a_job_record_gives_the_lost_nodes_in_words(tmp_path, monkeypatch):
    fake_sinfo(tmp_path, monkeypatch, ["n1|mixed|none", "n2|down*|Not responding"])
    record = tmp_path / "batch_job.txt"
    assert lost_nodes_of_job(SLURM, str(record)) == ""  # no record: nothing said
    record.write_text("4242 n[1-2]\n")
    assert lost_nodes_of_job(SLURM, str(record)) == \
        "node n2 (SLURM: down, not responding) of the pilot's batch job 4242 was lost"
    fake_sinfo(tmp_path, monkeypatch, ["n1|mixed|none", "n2|mixed|none"])
    assert lost_nodes_of_job(SLURM, str(record)) == ""


def test_the_job_record_command_and_the_client_environment():
    assert SLURM.client_environment() == {"SBATCH_NO_REQUEUE": "1"}
    command = SLURM.job_record_command("/a b/job.txt")
    assert command.startswith("echo \"$SLURM_JOB_ID $SLURM_JOB_NODELIST\" > '/a b/job.txt'")
    assert "||" in command  # never fails the pilot's bootstrap


def test_a_slow_host_gets_advice_to_leave_it_out_and_ranks_do_not():
    host = {"kind": "host", "host": "node7", "task": "analyze", "ranks": [4, 5], "ratio": 2.5,
            "cause": "compute"}
    text = slow_host_advice([host, {**host, "kind": "rank", "host": "node2"}])
    assert "Host node7" in text and "SBATCH_EXCLUDE=node7" in text and "ranks 4-5" in text
    assert "node2" not in text
    assert slow_host_advice([]) == ""
