"""MDAnalysis Universe keywords a run passes wherever it opens the user's files.

A LAMMPS dump named `.lammpstrj` needs `format="LAMMPSDUMP"`, chained XTC files
that overlap need `continuous=True`, a DCD without a time step needs `dt=`:
MDAnalysis takes these as keywords of `Universe(...)`. A run keeps them as a
JSON object (RunSpec.universe, plan.json's `universe`) and hands them on in
the same way on the workstation and in every task. The topology's keywords go
to every Universe; the trajectory's only where the user's own trajectory files
are read (never to trajflow's H5MD copies and segments, which already hold the
frames as those keywords made them). Only the keywords below are taken: each is
plain data, checked here, so a plan.json cannot hand MDAnalysis anything else.
"""
from typing import Dict, Optional, Tuple

# name -> (JSON types allowed, "topology" or "trajectory", what it does)
KEYWORDS: Dict[str, Tuple[tuple, str, str]] = {
    "topology_format": ((str,), "topology", "the topology's format when its name does not say "
                                            "it (PSF, DATA, TPR, ...)"),
    "atom_style": ((str,), "topology", "a LAMMPS DATA file's atom style"),
    "to_guess": ((list,), "topology", "attributes MDAnalysis guesses (types, masses, bonds, ...)"),
    "force_guess": ((list,), "topology", "attributes guessed even when the topology has them"),
    "vdwradii": ((dict,), "topology", "van der Waals radii for guessing bonds"),
    "fudge_factor": ((int, float), "topology", "bond guessing's tolerance"),
    "lower_bound": ((int, float), "topology", "bond guessing's shortest bond"),
    "format": ((str,), "trajectory", "the trajectory's format when its name does not say it "
                                     "(LAMMPSDUMP, XTC, ...)"),
    "continuous": ((bool,), "trajectory", "chained XTC/TRR files that overlap: drop the "
                                          "repeated frames, so time only goes forward"),
    "dt": ((int, float), "trajectory", "ps between frames, where the file does not say"),
    "time_offset": ((int, float), "trajectory", "ps added to every frame's time"),
    "convert_units": ((bool,), "trajectory", "convert to MDAnalysis' units (default true)"),
    "lammps_coordinate_convention": ((str,), "trajectory", "a LAMMPS dump's coordinate "
                                                           "columns (auto, unscaled, ...)"),
    "unwrap_images": ((bool,), "trajectory", "a LAMMPS dump: unwrap by its image flags"),
    "timeunit": ((str,), "trajectory", "a LAMMPS DCD's time unit"),
    "lengthunit": ((str,), "trajectory", "a LAMMPS DCD's length unit"),
}


def problem(args) -> Optional[str]:
    """Why `args` cannot be a run's Universe keywords, or None."""
    if not isinstance(args, dict):
        return f"give a JSON object of MDAnalysis Universe keywords, not {type(args).__name__}"
    for key, value in args.items():
        if key not in KEYWORDS:
            return (f"{key!r} is not a Universe keyword trajflow passes on; known: "
                    f"{', '.join(KEYWORDS)}")
        kinds = KEYWORDS[key][0]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            wanted = " or ".join("a number" if k in (int, float) else
                                 {str: "a string", bool: "true or false", list: "a list",
                                  dict: "an object"}[k] for k in dict.fromkeys(kinds))
            return f"{key!r} must be {wanted}, not {value!r:.40}"
    return None


def topology_keywords(args) -> dict:
    """The keywords every Universe of the run gets (its topology's)."""
    return {k: v for k, v in (args or {}).items() if KEYWORDS[k][1] == "topology"}


def trajectory_keywords(args) -> dict:
    """The keywords for reading the user's own trajectory files."""
    return {k: v for k, v in (args or {}).items() if KEYWORDS[k][1] == "trajectory"}
