"""A trajflow workflow script: two analyses on one local pilot, then their profiles.

    python examples/rmsd_and_rdf.py            # on this workstation, 2 cores

1. RMSD of AdK's CA atoms (MDAnalysisTests' PSF/DCD), 2 MPI ranks;
2. the water O-O radial distribution of the solvated AdK (GRO/XTC, 47,681
   atoms, periodic), an MDAnalysis InterRDF built by a lambda in this script,
   over an H5MD copy, side by side with the first on the same pilot;
3. each run's results as numpy arrays, and where its ranks spent their time.
Change `resource` (and add queue/project) to run the same on a cluster.
"""
import trajflow
from MDAnalysis.analysis.rdf import InterRDF
from MDAnalysisTests.datafiles import DCD, GRO, PSF, XTC

resource = "local.localhost"

with trajflow.Pilot(resource, cpus=2, walltime=20, path="example-pilot") as pilot:
    rmsd = pilot.submit(PSF, DCD, "rmsd", blocks=2, out="example-rmsd")
    rdf = pilot.submit(GRO, XTC,
                       lambda u: InterRDF(u.select_atoms("name OW"), u.select_atoms("name OW"),
                                          nbins=80, range=(0.0, 8.0), exclusion_block=(1, 1)),
                       io="h5md", blocks=2, out="example-rdf")
    rmsd, rdf = rmsd.result(), rdf.result()

print(f"RMSD over {len(rmsd.frame)} frames: {rmsd.results.rmsd[:, 2].min():.2f} to "
      f"{rmsd.results.rmsd[:, 2].max():.2f} A")
peak = rdf.results.bins[rdf.results.rdf.argmax()]
print(f"water O-O g(r): first peak at {peak:.2f} A, g = {rdf.results.rdf.max():.2f}")

for run in (rmsd, rdf):
    print(f"\n{run.path}")
    for r in run.profile.records:
        if r["task"] == "analyze":
            print(f"  rank {r['rank']}: {r['frames']} frames, io {r['t_io']:.3f} s, "
                  f"compute {r['t_compute']:.3f} s, wait {r['t_wait']:.3f} s")
    print("  " + "\n  ".join(run.profile.summary_lines()))
    run.profile.to_html(run.path + "/report.html")
