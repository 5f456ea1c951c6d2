"""Every shipped resource config checked against RADICAL-Pilot's own entry for that
machine (read from the installed RADICAL-Pilot's configs): its launch methods are
ones RADICAL-Pilot configures for that machine, and the machine's cores per node,
batch system and access schemas agree with RADICAL-Pilot's where it states them.
A label RADICAL-Pilot does not know (this machine's SLURMs, Stampede3) carries the
whole entry itself. None of these clusters has been run on for real yet (README)."""
import os

import pytest
import radical.pilot
import radical.utils as ru

from trajflow.workflows.run import resources

RP_CONFIGS = os.path.join(os.path.dirname(radical.pilot.__file__), "configs")


def shipped():
    for path in resources.shipped_config_files():
        facility = os.path.basename(path)[len("resource_"):-len(".json")]
        theirs_path = os.path.join(RP_CONFIGS, f"resource_{facility}.json")
        theirs = ru.read_json(theirs_path) if os.path.exists(theirs_path) else {}
        for name, ours in ru.read_json(path).items():
            yield f"{facility}.{name}", ours, theirs.get(name)


LABELS = {label: (ours, theirs) for label, ours, theirs in shipped()}
# its one node is this machine, with as many cores as it has (single_node.sh: CPUs=$(nproc))
NODE_OF_ANY_SIZE = {"local.slurm"}


@pytest.mark.parametrize("label", sorted(LABELS))
def test_a_shipped_config_agrees_with_radical_pilots_own_entry(label):
    ours, theirs = LABELS[label]
    order = ours["launch_methods"]["order"]
    assert set(order) <= set(ours["launch_methods"]) - {"order"}, label
    if theirs is None:  # a machine of ours alone: the entry is whole
        for key in ("resource_manager", "schemas", "default_schema", "cores_per_node",
                    "default_queue"):
            assert key in ours or (key == "cores_per_node" and label in NODE_OF_ANY_SIZE), \
                (label, key)
        assert ours["default_schema"] in ours["schemas"]
        return
    known = set(theirs.get("launch_methods", {})) - {"order"}
    assert set(order) <= known, (f"{label}: launch methods {sorted(set(order) - known)} are not "
                                 f"configured by RADICAL-Pilot for this machine ({sorted(known)})")
    for key in ("cores_per_node", "gpus_per_node", "resource_manager", "default_schema"):
        if key in ours and key in theirs:
            assert ours[key] == theirs[key], (label, key, ours[key], theirs[key])
    assert "cores_per_node" in ours or "cores_per_node" in theirs or label == "local.localhost", \
        f"{label}: no cores per node anywhere: the pilot's node count cannot be computed"
    for schema in ours.get("schemas", {}):
        assert schema in theirs.get("schemas", {}) or schema == "batch", (label, schema)


def test_every_shipped_label_is_checked():
    assert {"access.expanse", "access.bridges2", "ncsa.delta", "purdue.anvil", "tacc.frontera",
            "tacc.stampede3", "local.localhost", "local.slurm", "local.vcluster"} <= set(LABELS)
