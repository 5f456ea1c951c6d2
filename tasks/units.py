"""Units as MDAnalysis converts them, without importing MDAnalysis.

Why here: analyze ranks that read H5MD or DCD skip MDAnalysis' import (0.65 s
of every rank's start-up) yet must convert exactly as MDAnalysis does, or a
time or a coordinate differs from its serial run in the last bits. The
factors are MDAnalysis' (`MDAnalysis.units`), computed the way its
`get_conversion_factor` computes them (target factor / source factor);
tests/test_formats.py checks every one against MDAnalysis itself.
"""

# MDAnalysis.units.lengthUnit_factor / timeUnit_factor (units per Å, per ps)
_LENGTH_PER_ANGSTROM = {"Angstrom": 1.0, "nm": 1.0 / 10, "pm": 1e2, "fm": 1e5}
_TIME_PER_PS = {"ps": 1.0, "fs": 1e3, "ns": 1e-3, "s": 1e-12, "AKMA": 1 / 4.888821e-2}

# H5MD unit strings MDAnalysis' H5MDReader accepts (its _unit_translation),
# case as written there: anything else it refuses, and so do we.
H5MD_LENGTH = {"Angstrom": "Angstrom", "angstrom": "Angstrom", "A": "Angstrom",
               "nm": "nm", "pm": "pm", "fm": "fm"}
H5MD_TIME = {"ps": "ps", "fs": "fs", "ns": "ns", "second": "s", "sec": "s", "s": "s",
             "AKMA": "AKMA"}


def to_angstrom(unit: str) -> float:
    """The factor MDAnalysis multiplies a length in `unit` by to get Å."""
    return _LENGTH_PER_ANGSTROM["Angstrom"] / _LENGTH_PER_ANGSTROM[unit]


def to_ps(unit: str) -> float:
    """The factor MDAnalysis multiplies a time in `unit` by to get ps."""
    return _TIME_PER_PS["ps"] / _TIME_PER_PS[unit]


AKMA_TO_PS = to_ps("AKMA")  # a DCD's time step is in AKMA units
