"""Build: compile the Cython core against the installed grpcio, and the third_party/ schemas with grpcio-tools."""

import glob
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_protos() -> None:
    """Generate grpc_retry/_proto/*_pb2.py from third_party/*.proto (never committed)."""
    from grpc_tools import protoc  # build requirement
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    out = os.path.join(HERE, "grpc_retry", "_proto")
    for proto in sorted(glob.glob(os.path.join(HERE, "third_party", "*.proto"))):
        rc = protoc.main(["protoc", f"-I{os.path.join(HERE, 'third_party')}", f"-I{include}",
                          f"--python_out={out}", proto])
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")


def extensions():
    from Cython.Build import cythonize

    ext = Extension("grpc_retry._core", [os.path.join("_cython", "_core.pyx")])
    return cythonize([ext], language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "cdivision": True, "embedsignature": True,
    })


compile_protos()
setup(ext_modules=extensions())
