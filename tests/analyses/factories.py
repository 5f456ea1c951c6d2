"""Factories for the any-analysis tests: each builds an MDAnalysis analysis on the
Universe it is given, as a user's file would. Cheap selections keep the runs short."""
import numpy as np
from MDAnalysis.analysis.base import AnalysisBase, AnalysisFromFunction
from MDAnalysis.analysis.results import ResultsGroup


def interrdf(u, nbins=75):
    from MDAnalysis.analysis.rdf import InterRDF
    ow = u.select_atoms("name OW and index 20000:23000")
    return InterRDF(ow, ow, nbins=nbins, exclusion_block=(1, 1))


def interrdf_s(u):
    from MDAnalysis.analysis.rdf import InterRDF_s
    ow = u.select_atoms("name OW and index 20000:21000")
    hw = u.select_atoms("name HW1 and index 20000:21000")
    return InterRDF_s(u, [[ow, ow], [ow, hw]], nbins=40)


def density(u):
    from MDAnalysis.analysis.density import DensityAnalysis
    ow = u.select_atoms("name OW and index 20000:26000")
    return DensityAnalysis(ow, delta=4.0, gridcenter=[40.0, 40.0, 40.0], xdim=60.0, ydim=60.0,
                           zdim=60.0)


def linear_density(u):
    from MDAnalysis.analysis.lineardensity import LinearDensity
    if not hasattr(u.atoms, "charges"):  # a GRO has none; LinearDensity wants them
        u.add_TopologyAttr("charges", np.zeros(len(u.atoms)))
    return LinearDensity(u.select_atoms("resname SOL and index 20000:26000"), grouping="atoms",
                         binsize=1.0)


def hbonds(u):
    from MDAnalysis.analysis.hydrogenbonds.hbond_analysis import HydrogenBondAnalysis
    return HydrogenBondAnalysis(u, donors_sel="protein and name N", hydrogens_sel="protein and name HN",
                                acceptors_sel="protein and name O")


def contacts(u):
    from MDAnalysis.analysis.contacts import Contacts
    a, b = "name CA and resid 1-60", "name CA and resid 120-214"
    return Contacts(u, select=(a, b), refgroup=(u.select_atoms(a), u.select_atoms(b)), radius=8.0)


def dssp(u):
    from MDAnalysis.analysis.dssp import DSSP
    return DSSP(u, guess_hydrogens=True)


def dihedral(u):
    from MDAnalysis.analysis.dihedrals import Dihedral
    return Dihedral([r.phi_selection() for r in u.select_atoms("protein").residues[5:15]])


def janin(u):
    from MDAnalysis.analysis.dihedrals import Janin
    return Janin(u.select_atoms("resid 10-60"))


def atomic_distances(u):
    from MDAnalysis.analysis.atomicdistances import AtomicDistances
    ca = u.select_atoms("name CA")
    return AtomicDistances(ca[:50], ca[100:150])


def distance_matrix(u):
    from MDAnalysis.analysis.diffusionmap import DistanceMatrix
    return DistanceMatrix(u, select="name CA and resid 1-40")


def mda_rmsd(u):
    from MDAnalysis.analysis.rms import RMSD
    return RMSD(u, select="backbone")


def ramachandran(u):
    from MDAnalysis.analysis.dihedrals import Ramachandran
    return Ramachandran(u.select_atoms("resid 10-60"))


def bat(u):
    """Bond-angle-torsion coordinates of three residues (one molecule, bonds from the PSF)."""
    from MDAnalysis.analysis.bat import BAT
    return BAT(u.select_atoms("resid 1-3"))


def gnm(u):
    from MDAnalysis.analysis.gnm import GNMAnalysis
    return GNMAnalysis(u, select="name CA", cutoff=7.0)


def close_contact_gnm(u):
    from MDAnalysis.analysis.gnm import closeContactGNMAnalysis
    return closeContactGNMAnalysis(u, select="protein and resid 1-15", cutoff=4.5, weights="size")


def persistence_length(u):
    """Chains of MDAnalysisTests' polymer, as MDAnalysis' own test takes them."""
    from MDAnalysis.analysis.polymer import PersistenceLength
    return PersistenceLength([r.atoms.select_atoms("name C* N*") for r in u.residues])


def _rna_strands(u, first=(0, 21), second=(1, 22)):
    """Two pairs of residues of MDAnalysisTests' RNA, as its own tests take them."""
    from MDAnalysis.core.groups import ResidueGroup
    r = u.residues
    return ResidueGroup([r[i] for i in first]), ResidueGroup([r[i] for i in second])


RNA_NAMES = dict(g_name="GUA", a_name="ADE", c_name="CYT", u_name="URA")


def watson_crick(u):
    from MDAnalysis.analysis.nucleicacids import WatsonCrickDist
    return WatsonCrickDist(*_rna_strands(u), **RNA_NAMES)


def minor_pair(u):
    from MDAnalysis.analysis.nucleicacids import MinorPairDist
    return MinorPairDist(*_rna_strands(u, (2, 19), (16, 4)), **RNA_NAMES)


def major_pair(u):
    from MDAnalysis.analysis.nucleicacids import MajorPairDist
    return MajorPairDist(*_rna_strands(u, (1, 4), (11, 8)), **RNA_NAMES)


def nuc_pair(u):
    """The base class itself: distances between atom pairs of the two strands."""
    from MDAnalysis.analysis.nucleicacids import NucPairDist
    s1, s2 = _rna_strands(u)
    return NucPairDist([r.atoms.select_atoms("name N1 N3")[:1] for r in s1],
                       [r.atoms.select_atoms("name N1 N3")[:1] for r in s2])


def radius_of_gyration(u):
    protein = u.select_atoms("protein")
    return AnalysisFromFunction(lambda ag: ag.radius_of_gyration(), u.trajectory, protein)


class CentreOfMassDrift(AnalysisBase):
    """A user's own class that opts in to parallel runs: the protein's centre of
    mass per frame (stacked) and the sum of its squared displacement (summed)."""
    _analysis_algorithm_is_parallelizable = True

    @classmethod
    def get_supported_backends(cls):
        return ("serial", "multiprocessing", "dask")

    def __init__(self, atomgroup, **kwargs):
        super().__init__(atomgroup.universe.trajectory, **kwargs)
        self.ag = atomgroup
        self.origin = atomgroup.center_of_mass()

    def _prepare(self):
        self.results.com = np.zeros((self.n_frames, 3))
        self.results.sq_sum = 0.0

    def _single_frame(self):
        com = self.ag.center_of_mass()
        self.results.com[self._frame_index] = com
        self.results.sq_sum += float(((com - self.origin) ** 2).sum())

    def _get_aggregator(self):
        return ResultsGroup(lookup={"com": ResultsGroup.ndarray_vstack,
                                    "sq_sum": ResultsGroup.ndarray_sum})

    def _conclude(self):
        self.results.msd = self.results.sq_sum / self.n_frames


def user_class(u):
    return CentreOfMassDrift(u.select_atoms("protein"))


def transformed(u):
    """The user's class on a trajectory the factory transforms on the fly (MDAnalysis
    applies the shift to every frame read, and to the frame the class starts from)."""
    from MDAnalysis.transformations import translate
    u.trajectory.add_transformations(translate([10.0, -5.0, 2.5]))
    return CentreOfMassDrift(u.select_atoms("protein"))


class SerialOnly(AnalysisBase):
    """A user class that does not opt in."""

    def _single_frame(self):
        pass


def serial_only(u):
    return SerialOnly(u.trajectory)


def einstein_msd(u):
    """Serial-only in MDAnalysis (its MSD needs every frame at once): refused."""
    from MDAnalysis.analysis.msd import EinsteinMSD
    return EinsteinMSD(u, select="name CA")


def helanal(u):
    """Serial-only in MDAnalysis: refused."""
    from MDAnalysis.analysis.helix_analysis import HELANAL
    return HELANAL(u, select="name CA and resnum 161-187")


def raises(u):
    raise RuntimeError("this factory is broken on purpose")


def not_an_analysis(u):
    return u.select_atoms("name CA")


class FailsLate(CentreOfMassDrift):
    """A user's class whose per-frame code raises from frame 60 on: past the local
    trial's first frames, so it fails on the pilot, where it must not be retried."""

    def _single_frame(self):
        if self._ts.frame >= 60:
            raise ValueError(f"frame {self._ts.frame}: this analysis fails late on purpose")
        super()._single_frame()


def fails_late(u):
    return FailsLate(u.select_atoms("protein"))


class RadiusOfGyration(AnalysisBase):
    """A user's radius of gyration per frame; on a selection that matches nothing
    MDAnalysis raises on the first frame ("AtomGroup is empty.")."""
    _analysis_algorithm_is_parallelizable = True

    @classmethod
    def get_supported_backends(cls):
        return ("serial", "multiprocessing", "dask")

    def __init__(self, atomgroup, **kwargs):
        super().__init__(atomgroup.universe.trajectory, **kwargs)
        self.ag = atomgroup

    def _prepare(self):
        self.results.rgyr = np.zeros(self.n_frames)

    def _single_frame(self):
        self.results.rgyr[self._frame_index] = self.ag.radius_of_gyration()

    def _get_aggregator(self):
        return ResultsGroup(lookup={"rgyr": ResultsGroup.ndarray_hstack})


class NoRuleForTotal(RadiusOfGyration):
    """A parallel class whose aggregator forgets one of its results (`total`)."""

    def _prepare(self):
        super()._prepare()
        self.results.total = 0.0

    def _single_frame(self):
        super()._single_frame()
        self.results.total += self.results.rgyr[self._frame_index]


def no_rule_for_a_result(u):
    return NoRuleForTotal(u.select_atoms("protein"))


def empty_selection(u):
    return RadiusOfGyration(u.select_atoms("resname NOSUCHRESIDUE"))


def every_atom_rgyr(u):
    return RadiusOfGyration(u.atoms)


def protein_rgyr(u):
    return RadiusOfGyration(u.select_atoms("protein"))


class FailsEarly(CentreOfMassDrift):
    """A user's class that cannot analyse frames before 50 (say, its ligand is not bound
    yet): right with start=50, and its trial must try those frames, not frame 0."""

    def _single_frame(self):
        if self._ts.frame < 50:
            raise ValueError(f"frame {self._ts.frame}: nothing to analyse before frame 50")
        super()._single_frame()


def fails_early(u):
    return FailsEarly(u.select_atoms("protein"))


def mda_rmsf(u):
    """MDAnalysis' own RMSF class, serial-only there: trajflow runs it merged over blocks."""
    from MDAnalysis.analysis.rms import RMSF
    return RMSF(u.select_atoms("name CA"))


def mda_pca(u, align=True):
    """MDAnalysis' own PCA class, serial-only there: trajflow runs it merged over blocks."""
    from MDAnalysis.analysis.pca import PCA
    return PCA(u, select="backbone and resid 10:40", align=align)


# MDAnalysis' parallelisable classes (tasks/mda_analyses.parallelisable_classes) -> the
# factory here that builds one on a file of MDAnalysisTests'. A class MDAnalysis adds
# fails the generated test until it has one here.
FOR_CLASS = {
    "AnalysisFromFunction": "radius_of_gyration", "AtomicDistances": "atomic_distances",
    "BAT": "bat", "Contacts": "contacts", "DSSP": "dssp", "DensityAnalysis": "density",
    "Dihedral": "dihedral", "DistanceMatrix": "distance_matrix", "GNMAnalysis": "gnm",
    "HydrogenBondAnalysis": "hbonds", "InterRDF": "interrdf", "InterRDF_s": "interrdf_s",
    "Janin": "janin", "LinearDensity": "linear_density", "MajorPairDist": "major_pair",
    "MinorPairDist": "minor_pair", "NucPairDist": "nuc_pair",
    "PersistenceLength": "persistence_length", "RMSD": "mda_rmsd",
    "Ramachandran": "ramachandran", "WatsonCrickDist": "watson_crick",
    "closeContactGNMAnalysis": "close_contact_gnm",
}
# the data each factory needs beyond AdK's PSF/DCD (conftest's fixtures of those names)
NEEDS = {"solvated": ("interrdf", "interrdf_s", "density", "linear_density"),
         "polymer": ("persistence_length",),
         "rna": ("watson_crick", "minor_pair", "major_pair", "nuc_pair")}
