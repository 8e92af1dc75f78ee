"""Where things are, for the tests that read files of the tree or start programs in it."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent   # tests/support: helpers, stand-ins, scripts run in processes of their own
TESTS = SUPPORT.parent                      # tests/
ORACLES = TESTS / "oracles"                 # reference implementations and PyTorch's stored answers
ROOT = TESTS.parent                         # the repository
STANDIN = SUPPORT / "cupy_standin"          # the CPU stand-in for CuPy: first on PYTHONPATH, it is ``cupy``
