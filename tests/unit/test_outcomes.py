"""outcome.json across attempts: a resumed run keeps how its earlier attempts ended,
and while a resume runs the folder says it has not ended (tasks/rundir.py)."""
from trajflow.tasks.rundir import add_to_failure, begin_attempt, read_outcome, record_outcome


def test_a_resumed_run_keeps_its_earlier_failures_in_order(tmp_path):
    d = str(tmp_path)
    record_outcome(d, "failed", "node n3 was lost", stopped_at="analyze")
    begin_attempt(d)
    assert read_outcome(d) is None  # this attempt has not ended
    record_outcome(d, "failed", "the disk is full")
    begin_attempt(d)
    record_outcome(d, "done")
    done = read_outcome(d)
    assert done["status"] == "done"
    assert [(e["error"], e["stopped_at"]) for e in done["earlier"]] == [
        ("node n3 was lost", "analyze"), ("the disk is full", None)]
    begin_attempt(d)  # a done run is never set aside, and a done outcome adds nothing
    assert read_outcome(d)["status"] == "done"
    record_outcome(d, "done")
    assert len(read_outcome(d)["earlier"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json"]


def test_a_run_that_never_failed_has_no_earlier(tmp_path):
    record_outcome(str(tmp_path), "done")
    assert "earlier" not in read_outcome(str(tmp_path))


def test_what_came_after_a_failure_joins_it_once_and_never_a_done_run(tmp_path):
    d = str(tmp_path)
    record_outcome(d, "failed", None, stopped_at="analyze",
                   failed_tasks=["task r/analyze/analyze (attempt 2) ended FAILED with exit code 255"])
    add_to_failure(d, "the pilot failed: node n3 was lost")
    add_to_failure(d, "the pilot failed: node n3 was lost")  # said once
    failed = read_outcome(d)
    assert failed["error"] == "the pilot failed: node n3 was lost"
    assert failed["stopped_at"] == "analyze" and len(failed["failed_tasks"]) == 1
    assert "earlier" not in failed  # an amendment is not another attempt
    add_to_failure(d, "and then the walltime ran out")
    assert read_outcome(d)["error"] == ("the pilot failed: node n3 was lost; then "
                                        "and then the walltime ran out")
    named = tmp_path / "named"  # the outcome named the node already: the pilot's text adds nothing
    named.mkdir()
    record_outcome(str(named), "failed", "node n3 (SLURM: down) of the pilot's batch job 7 was lost")
    add_to_failure(str(named), "the pilot p failed: node n3 (SLURM: down) of the pilot's batch "
                               "job 7 was lost, and the batch system ended the job with it")
    assert read_outcome(str(named))["error"].count("n3") == 1
    done = tmp_path / "done"
    done.mkdir()
    record_outcome(str(done), "done")
    add_to_failure(str(done), "the pilot failed")
    assert read_outcome(str(done)).get("error") is None
    add_to_failure(str(tmp_path / "never"), "the pilot failed")  # no outcome: nothing written
    assert not (tmp_path / "never").exists()


def test_a_write_that_fails_leaves_the_old_record_and_no_temporary_file(tmp_path, monkeypatch):
    """The disk fills while outcome.json is written (seen in CI: outcome.json.PID.tmp
    was left beside a failed run): the earlier outcome stays whole, nothing else stays."""
    import builtins
    import errno
    from trajflow.tasks import rundir
    d = str(tmp_path)
    record_outcome(d, "failed", "node n3 was lost")

    class FillsUp:  # writes half of what it is given, then the disk is full
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            self.fh.write(text[:len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def opened(file, mode="r", **kw):
        fh = builtins.open(file, mode, **kw)
        return FillsUp(fh) if "w" in mode else fh

    monkeypatch.setattr(rundir, "open", opened, raising=False)
    try:
        record_outcome(d, "done")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        raise AssertionError("the full disk was not reported")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json"]
    assert read_outcome(d)["error"] == "node n3 was lost"


def test_replaced_whole_puts_the_file_in_place_only_when_the_block_ends(tmp_path):
    from trajflow.tasks.rundir import replaced_whole
    final = tmp_path / "result.h5"
    final.write_text("old")
    with replaced_whole(str(final)) as tmp:
        with open(tmp, "w") as fh:
            fh.write("new")
        assert final.read_text() == "old"
    assert final.read_text() == "new"
    try:
        with replaced_whole(str(final)) as tmp:
            with open(tmp, "w") as fh:
                fh.write("half")
            raise KeyboardInterrupt  # a Ctrl-C mid-write is a failure too
    except KeyboardInterrupt:
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["result.h5"] and final.read_text() == "new"


def test_a_target_that_is_not_a_plain_file_is_written_through(tmp_path):
    """`inspect --json /dev/stdout` or a symlink the user gave: written as open() would,
    the link kept."""
    import os
    from trajflow.tasks.rundir import write_text
    real = tmp_path / "real.json"
    real.write_text("old")
    os.symlink(real, tmp_path / "link.json")
    write_text(str(tmp_path / "link.json"), "new", user_target=True)
    assert os.path.islink(tmp_path / "link.json") and real.read_text() == "new"
    write_text(os.devnull, "into the void", user_target=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_disk_filled_during_the_run_still_gets_its_outcome_in_the_room_kept(tmp_path,
                                                                           monkeypatch):
    """A disk another job filled while the run went on: outcome.json is written in the
    room planning kept for it (a run once failed with no outcome.json at all, seen in
    CI), and a run that ended well gives the room back."""
    import builtins
    import errno
    import os
    from trajflow.tasks import rundir
    d = str(tmp_path)
    rundir.keep_room(d)
    assert os.path.getsize(tmp_path / rundir.RESERVE) == rundir.RESERVE_BYTES

    def opened(file, mode="r", **kw):  # the disk is full while the room is taken
        if "w" in mode and os.path.exists(tmp_path / rundir.RESERVE):
            raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(file, mode, **kw)

    monkeypatch.setattr(rundir, "open", opened, raising=False)
    record_outcome(d, "failed", "the disk is full")
    assert read_outcome(d)["error"] == "the disk is full"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json"]
    rundir.keep_room(d)  # a quota full, as clusters say it: the same room serves

    def over_quota(file, mode="r", **kw):
        if "w" in mode:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return builtins.open(file, mode, **kw)

    monkeypatch.setattr(rundir, "open", over_quota, raising=False)
    add_to_failure(d, "the pilot failed")
    assert read_outcome(d)["error"] == "the disk is full; then the pilot failed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json"]
    monkeypatch.undo()
    rundir.keep_room(d)  # a resume keeps it again
    begin_attempt(d)
    record_outcome(d, "done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json"]
    assert read_outcome(d)["earlier"][0]["error"] == "the disk is full; then the pilot failed"
