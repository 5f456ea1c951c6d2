"""How a result's pieces combine: the rule every analysis declares for each result.

Reduce joins a run's parts by these rules, never by a guess: a built-in
analysis declares one per result (BlockAnalysis.combine), a user analysis' part
layout is PART_COMBINE (mda_analyses.py) and its class' own aggregator (an
MDAnalysis ResultsGroup) merges the results themselves. A result without a rule
is refused, by name.
"""
import numpy as np


class Combine:
    """How one result's pieces (one per block, in block order: blocks are contiguous, so in
    frame order) become the run's result: declared per result by every analysis."""

    def merge(self, pieces):
        raise NotImplementedError


class Concatenate(Combine):
    """Rows one after another: a result with a row per frame (or bytes per block)."""

    def merge(self, pieces):
        return np.concatenate(pieces)


FRAME_ROWS = Concatenate()
FRAME_AXES = {"frame": FRAME_ROWS, "time": FRAME_ROWS}  # every part's frame numbers and times
