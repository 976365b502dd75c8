"""Where grpc_retry's compiled modules come from: one shared library, grpc_retry._native (_cython/_native.pyx says
why), that holds them all. A finder ahead of Python's own gives each of them, by its usual name, from that library;
their .py sources beside them are what Cython compiled.

With GRPC_RETRY_PURE_PYTHON=1 the modules compiled from .py are imported from their sources as plain Python (for
pdb, coverage and a quick edit); the call machine (grpc_retry._core, written in Cython) still comes compiled."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, Optional, Sequence


def _not_built(error: ImportError) -> ImportError:
    """What to do when the library is missing: most often Python was started in the checkout's root, whose
    uncompiled grpc_retry/ shadows the installed package (Python puts the current directory first)."""
    package = os.path.dirname(os.path.abspath(__file__))
    built = [name for name in os.listdir(package) if name.startswith("_native.") and name.endswith((".so", ".pyd"))]
    if any("_native" + suffix in built for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return ImportError(f"grpc_retry's compiled core in {package} does not load: {error}")
    if built:
        return ImportError(f"grpc_retry's compiled core in {package} was built for another Python ({built[0]}): "
                           'build it for this one with pip install -e "." (from the checkout\'s root)')
    return ImportError(
        f"grpc_retry's compiled core is not built in {package}: this is its source tree, which Python imports "
        "ahead of any installed copy when started from the checkout's root. Build it in place with "
        'pip install -e "." (from the root), or run from another directory.')


try:
    from grpc_retry import _native
except ImportError as error:
    raise _not_built(error) from None

PURE_PYTHON_ENV = "GRPC_RETRY_PURE_PYTHON"
CORE = "grpc_retry._core"  # the one compiled module with no .py source


def pure_python() -> bool:
    """Whether the modules written in .py run as plain Python (GRPC_RETRY_PURE_PYTHON=1)."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        module: types.ModuleType = _native.create(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _native.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """grpc_retry's compiled modules, from grpc_retry._native; nothing else. `pure`: only the core."""

    def __init__(self, pure: bool) -> None:
        self._pure = pure

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _native.NAMES or (self._pure and fullname != CORE):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _LOADER, origin=_native.__file__)
        spec.has_location = True  # __file__: the library's
        return spec


_LOADER = _Loader()


def install() -> None:
    """Put the finder first (once; a reload of grpc_retry finds it there)."""
    if not any(type(finder).__qualname__ == "_Finder" and type(finder).__module__ == __name__
               for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(pure_python()))
