"""Per-rank timing tables from any tool, read as records the straggler judge knows.

The scientists this tool is for often have such tables from their own MPI
scripts (the papers' scripts wrote exactly these): one row per rank, times in
seconds. The format (CSV with a header line):

    rank   required, an integer, unique within its group
    group  optional: rows of several tasks in one file, each judged on its own
    host   optional: ranks of one host slow together are one flag
    frames optional: durations are compared per frame
    t_open, t_io, t_compute, t_wait, t_comm, t_write   optional phases
    t_total  optional: the rank's time from start to end, wait included;
             when absent, the sum of the phases

Unknown columns are ignored and listed. A table that cannot be judged
raises InputError naming the file, the row (as a spreadsheet numbers it:
the header is row 1) and the column.
"""
import csv
import os

from trajflow.tasks.modes import MpiMode
from trajflow.workflows.errors import InputError

PHASE_COLUMNS = ("t_open", "t_io", "t_compute", "t_wait", "t_comm", "t_write")
KNOWN_COLUMNS = ("rank", "group", "host", "frames") + PHASE_COLUMNS + ("t_total",)


def read_table(path):
    """(records, ignored column names) of one timing table."""
    if not os.path.isfile(path):
        raise InputError(f"timing table {path!r} does not exist: give a CSV file with a header "
                         "line and one row per rank")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        rows = list(reader)
    if "rank" not in header:
        raise InputError(f"{path}: no 'rank' column (columns found: {', '.join(header) or 'none'});"
                         f" a timing table needs rank and any of {', '.join(KNOWN_COLUMNS[2:])}")
    if "t_total" not in header and not any(c in header for c in PHASE_COLUMNS):
        raise InputError(f"{path}: no time column: give t_total or any of "
                         f"{', '.join(PHASE_COLUMNS)} (seconds)")
    if not rows:
        raise InputError(f"{path}: the table has a header but no rows")
    name = os.path.basename(path)
    records, seen = [], set()
    for row_number, row in enumerate(rows, start=2):
        rec = _record(path, row_number, row, header, name)
        key = (rec["task"], rec["rank"])
        if key in seen:
            raise InputError(f"{path} row {row_number}, column rank: rank {rec['rank']} appears "
                             f"twice{' in group ' + rec['task'] if 'group' in header else ''}; "
                             "one row per rank (a group column separates tasks)")
        seen.add(key)
        records.append(rec)
    return records, [h for h in header if h not in KNOWN_COLUMNS]


def _record(path, row_number, row, header, name):
    def number(column, kind=float):
        text = (row.get(column) or "").strip()
        where = f"{path} row {row_number}, column {column}"
        if not text:
            raise InputError(f"{where}: empty; every row needs a value in every known column")
        try:
            value = kind(text)
        except ValueError:
            raise InputError(f"{where}: {text!r} is not "
                             f"{'an integer' if kind is int else 'a number (seconds)'}") from None
        if value < 0 or value != value:
            raise InputError(f"{where}: {text!r} is negative or not a number; times, ranks and "
                             "frames are zero or more")
        return value

    rec = {"run": name, "task": (row.get("group") or "").strip() or "ranks",
           "rank": number("rank", int), "mode": MpiMode.name, "t_start": 0.0}
    if "host" in header:
        rec["host"] = (row.get("host") or "").strip() or None
    if "frames" in header:
        rec["frames"] = number("frames", int)
    for column in PHASE_COLUMNS:
        rec[column] = number(column) if column in header else 0.0
    phases = sum(rec[c] for c in PHASE_COLUMNS)
    rec["t_total"] = number("t_total") if "t_total" in header else phases
    if rec["t_total"] + rounding(row, phases) < phases:
        raise InputError(f"{path} row {row_number}, column t_total: {rec['t_total']} s is less "
                         f"than the sum of the phases ({phases:.6g} s); give the rank's whole "
                         "time, or leave t_total out to have it summed")
    rec["t_overhead"] = rec["t_total"] - phases  # what the phases do not account for
    rec["t_work"] = rec["t_total"] - rec["t_wait"]
    rec["t_stop"] = rec["t_total"]  # the ranks start together (at a barrier)
    return rec


def rounding(row, phases):
    """How far below the phases' sum a printed t_total may be and still be whole: tables
    from other tools round each number (1076.428852 against a sum of 1076.428853), so
    half a unit of the last printed digit of t_total and of each phase given, at least
    1e-6 relative."""
    def half_unit(text):
        text = (text or "").strip().lower()
        if not text or "e" in text:  # absent, or in exponent form: no printed precision
            return 0.0
        return 0.5 * 10.0 ** -len(text.partition(".")[2])
    cells = [row.get(c) for c in PHASE_COLUMNS if row.get(c) is not None]
    return max(1e-6 * max(phases, 1.0), half_unit(row.get("t_total"))
               + sum(half_unit(c) for c in cells))


def read_tables(paths):
    """Every table's records, and a line for each table with ignored columns."""
    records, notes = [], []
    for path in paths:
        recs, ignored = read_table(path)
        records += recs
        if ignored:
            notes.append(f"{path}: columns ignored (not known): {', '.join(ignored)}")
    return records, notes
