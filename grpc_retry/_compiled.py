"""Where grpc_retry's compiled modules come from: one shared library, grpc_retry._native (_cython/_native.pyx says
why), that holds them all. A finder ahead of Python's own gives each of them, by its usual name, from that library;
their .py sources beside them are what Cython compiled, never imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Optional, Sequence

from grpc_retry import _native


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        module: types.ModuleType = _native.create(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _native.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """grpc_retry's compiled modules, from grpc_retry._native; nothing else."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _native.NAMES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _LOADER, origin=_native.__file__)
        spec.has_location = True  # __file__: the library's
        return spec


_LOADER = _Loader()


def install() -> None:
    """Put the finder first (once; a reload of grpc_retry finds it there)."""
    if not any(type(finder).__qualname__ == "_Finder" and type(finder).__module__ == __name__
               for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
