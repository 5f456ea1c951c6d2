"""Benchmarks: our kernels, readers and stages against MDAnalysis and other tools, side by side."""
