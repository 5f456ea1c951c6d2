"""Campaigns: factors with levels expanded into experiments, run over several resources."""
