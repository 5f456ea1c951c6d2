"""The `trajflow` command: parsing and printing only; the work is the library's."""
from .main import main  # noqa: F401  (the console script's entry point)
