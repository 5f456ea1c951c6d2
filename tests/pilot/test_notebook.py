"""The example notebook (examples/trajflow.ipynb), executed cell by cell by a real
Jupyter kernel (nbclient, ipykernel) on a real local pilot: its outputs are
MDAnalysis' answers, its objects display themselves as HTML, and nothing of the
pilot is left once it is closed."""
import glob
import os
import re
import warnings

import pytest

from paths import EXAMPLES
from processes import assert_nothing_left

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _html(cell):
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs
                   if o.output_type in ("execute_result", "display_data"))


def test_the_example_notebook_runs_in_a_real_kernel(tmp_path, adk):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    from MDAnalysis.analysis.base import AnalysisFromFunction
    nb = nbformat.read(os.path.join(EXAMPLES, "trajflow.ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell's traceback, if one fails
    code = [c for c in nb.cells if c.cell_type == "code"]
    shown_run, said_rmsd, said_rgyr, shown_profile = _html(code[1]), _text(code[2]), \
        _text(code[3]), _html(code[4])
    assert "<td>done</td>" in shown_run and 'src="data:image/png;base64,' in shown_run
    u = mda.Universe(*adk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = rms.RMSD(u, select="name CA").run().results.rmsd[:, 2]
        protein = u.select_atoms("protein")
        rg = AnalysisFromFunction(lambda ag: ag.radius_of_gyration(), u.trajectory,
                                  protein).run(start=10, step=2).results.timeseries
    assert re.search(r"largest RMSD: ([\d.]+) A over 98 frames", said_rmsd), said_rmsd
    assert float(re.search(r"largest RMSD: ([\d.]+)", said_rmsd).group(1)) == \
        pytest.approx(ref.max(), abs=1e-4)
    got = re.search(r"over (\d+) frames, first ([\d.]+) A", said_rgyr)
    assert got and int(got.group(1)) == len(rg) and float(got.group(2)) == pytest.approx(
        rg[0], abs=1e-4), said_rgyr
    assert "Timeline" in shown_profile and "Stragglers" in shown_profile
    session = os.path.basename(glob.glob(str(tmp_path / "trajflow-pilot-*" / "re.session.*"))[0])
    assert_nothing_left(session)
