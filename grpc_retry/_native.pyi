"""Types of grpc_retry._native (_cython/_native.pyx): every compiled module of grpc_retry in one library."""

import importlib.machinery
import types
from typing import FrozenSet

NAMES: FrozenSet[str]

def create(spec: importlib.machinery.ModuleSpec) -> types.ModuleType: ...
def exec_module(module: types.ModuleType) -> None: ...
