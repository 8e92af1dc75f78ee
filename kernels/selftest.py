"""The name this module had before kernels/checking/: it is :mod:`tinygrad_caps.kernels.checking.selftest`
under its old name, for imports and for ``python -m tinygrad_caps.kernels.selftest``."""
import sys

from .checking import selftest as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module  # one module under both names: the same objects, the same state
