"""Old module paths that still import, and old names that still read, with a warning: the one
mechanism every layer uses.

A package that moved modules calls ``install(package, {old: new})`` once (names relative to the
package, dots allowed: ``{"training": "app.training.trainer"}``). Importing ``package.old`` then
emits a ``DeprecationWarning`` naming the new path and gives the very module now at ``package.new``
(the same object, imported on first use), so attributes set through either name act on one module.
A module that renamed a public name calls ``renamed(__name__, {old: new})`` at its end: reading
``module.old`` (``from module import old`` too) then warns and gives ``new``. The old paths and
names are listed in CHANGELOG.md and go in 0.2; the project's own code uses the new ones (its test
suite turns this warning into an error).

Pure Python, no arrays: it lives in the lowest layer so that kernels/, the engine and models/ share it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.2"


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``PACKAGE.OLD`` for every OLD in ``moved`` and loads it as the module ``PACKAGE.moved[OLD]``."""

    def __init__(self, package: str, moved: dict):
        self.package, self.moved = package, dict(moved)

    def new_name(self, fullname: str) -> str | None:
        """The module path that ``fullname`` moved to, or None where it did not move here."""
        prefix = self.package + "."
        if not fullname.startswith(prefix) or fullname[len(prefix):] not in self.moved:
            return None
        return prefix + self.moved[fullname[len(prefix):]]

    def find_spec(self, fullname, path=None, target=None):
        if self.new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = self.new_name(spec.name)
        warnings.warn(f"{spec.name} is deprecated and will be removed in {REMOVED_IN}; import {new} instead",
                      DeprecationWarning, stacklevel=_caller_level())
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the old name's: restored below
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed under its own name

    def is_package(self, fullname) -> bool:
        return False

    def get_code(self, fullname):
        """``python -m OLD`` does not run the moved module (its relative imports would resolve from
        the old place): an ImportError that names the new path to run."""
        raise ImportError(f"{fullname} moved: run python -m {self.new_name(fullname)}")

def _caller_level() -> int:
    """The stack level of the first frame outside the import machinery (the importing line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


class MovedModuleProxy(types.ModuleType):
    """An old path whose last name the package also exports as something else (the function
    ``tinygrad_caps.models.routing_statistics``): it stands in ``sys.modules`` only, so importing it
    never rebinds the package's export, and forwards every attribute, with the warning, to the new module."""

    def __init__(self, old: str, new: str):
        super().__init__(old)
        self.__dict__["_moved_to"] = new

    def __getattr__(self, name):
        if name.startswith("__"):  # tools that walk sys.modules (Hypothesis, inspect) ask for dunders
            raise AttributeError(name)
        new = self.__dict__["_moved_to"]
        warnings.warn(f"{self.__name__} is deprecated and will be removed in {REMOVED_IN}; import {new} instead",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)


def install(package: str, moved: dict) -> MovedModuleFinder:
    """Let the old module paths in ``moved`` (relative to ``package``) be imported, with a warning;
    once per package (a second call adds to the first's table). Returns the package's finder. An old
    path whose last name the package exports as something else gets a ``MovedModuleProxy``."""
    exports = vars(sys.modules[package])
    for old, new in moved.items():
        if "." not in old and old in exports and not isinstance(exports[old], types.ModuleType):
            sys.modules.setdefault(f"{package}.{old}", MovedModuleProxy(f"{package}.{old}", f"{package}.{new}"))
    for finder in sys.meta_path:
        if isinstance(finder, MovedModuleFinder) and finder.package == package:
            finder.moved.update(moved)
            return finder
    finder = MovedModuleFinder(package, moved)
    sys.meta_path.insert(0, finder)  # before the path finders: an old package alias must not load its modules anew
    return finder


def moved_modules() -> dict:
    """{old full path: new full path} of every package's moved modules (for CHANGELOG.md and its test)."""
    return {f"{f.package}.{old}": f"{f.package}.{new}" for f in sys.meta_path if isinstance(f, MovedModuleFinder)
            for old, new in f.moved.items()}


_RENAMED: dict = {}  # module name -> {old attribute name: its replacement, as renamed() takes it}


def renamed(module_name: str, names: dict) -> None:
    """Let module ``module_name`` answer each old attribute name of ``names`` ({old: new}) until 0.2,
    with a DeprecationWarning naming the new one. ``new`` is a name in the same module, or a full
    dotted path ("package.module.name"; ending in "()" where the old constant is now the value of
    that function, called on each read). Sets the module's ``__getattr__``; a second call adds to
    the first's names."""
    module = sys.modules[module_name]
    table = _RENAMED.setdefault(module_name, {})
    table.update(names)

    def __getattr__(name):
        if name not in table:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        warnings.warn(f"{module_name}.{name} is deprecated and will be removed in {REMOVED_IN}; use "
                      f"{_full_name(module_name, table[name])} instead", DeprecationWarning, stacklevel=_caller_level())
        return _value(module_name, table[name])

    module.__getattr__ = __getattr__


def _full_name(module_name: str, new: str) -> str:
    """``new`` as a full dotted path: a bare name is one of ``module_name``'s."""
    return new if "." in new.removesuffix("()") else f"{module_name}.{new}"


def _value(module_name: str, new: str):
    """What ``new`` (as ``renamed`` takes it) names: the attribute, or the function's value for "...()"."""
    owner, _, name = _full_name(module_name, new).removesuffix("()").rpartition(".")
    value = getattr(importlib.import_module(owner), name)
    return value() if new.endswith("()") else value


def renamed_names() -> dict:
    """{old full name: new full name} of every renamed attribute (for CHANGELOG.md and its test)."""
    return {f"{module_name}.{old}": _full_name(module_name, new)
            for module_name, table in _RENAMED.items() for old, new in table.items()}
