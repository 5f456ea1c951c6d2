"""Where the tests' own files are, whichever layer a test module is in."""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
FACTORIES = os.path.join(TESTS, "analyses", "factories.py")
EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
