"""Runs on a cluster driven over SSH: the workstation's half and the cluster's half."""
