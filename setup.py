"""Build: compile the Cython core against the installed grpcio, and the third_party/ schemas with grpcio-tools."""

import glob
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_protos() -> None:
    """Generate grpc_retry/_proto/*_pb2.py from third_party/*.proto (never committed)."""
    import grpc_tools
    from grpc_tools import protoc  # build requirement

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    out = os.path.join(HERE, "grpc_retry", "_proto")
    for proto in sorted(glob.glob(os.path.join(HERE, "third_party", "*.proto"))):
        rc = protoc.main(["protoc", f"-I{os.path.join(HERE, 'third_party')}", f"-I{include}",
                          f"--python_out={out}", proto])
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")


# The per-call Python of the drivers, compiled as it is (Cython's pure-Python mode: the .py stays the source,
# read, typed and tested as Python; annotations are not taken as C types, so it behaves as it reads).
COMPILED_MODULES = ["grpc_retry._driver", "grpc_retry._method", "grpc_retry._grpc_internals", "grpc_retry._waiters",
                    "grpc_retry._timer", "grpc_retry._telemetry", "grpc_retry.aio._call", "grpc_retry.aio._channel",
                    "grpc_retry.aio._timers", "grpc_retry.sync._call", "grpc_retry.sync._hedged",
                    "grpc_retry.sync._request_stream", "grpc_retry.sync._channel", "grpc_retry._backends.subchannels",
                    "grpc_retry._backends.sync", "grpc_retry._backends.aio"]


# Cython's translation and the C compiler's runs, in parallel: the build is most of a fresh install's time.
JOBS = os.cpu_count() or 1


def _stale(generated: str, source: str) -> bool:
    """Whether `generated` is older than `source`, which Cython's own dependency tracking does not see."""
    return os.path.exists(generated) and os.path.getmtime(generated) < os.path.getmtime(source)


def extensions():
    from Cython.Build import cythonize

    # The core's declarations live in the package (grpc_retry/_core.pxd, cimported by the drivers), not beside
    # its .pyx, where cythonize looks for them: a changed .pxd would otherwise leave a stale _core.c behind.
    core_pxd = os.path.join("grpc_retry", "_core.pxd")
    core = cythonize([Extension("grpc_retry._core", [os.path.join("_cython", "_core.pyx")])], language_level=3,
                     compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True,
                                          "embedsignature": True}, nthreads=JOBS,
                     force=_stale(os.path.join("_cython", "_core.c"), core_pxd))
    drivers = cythonize([Extension(name, [name.replace(".", os.sep) + ".py"]) for name in COMPILED_MODULES],
                        language_level=3, compiler_directives={"annotation_typing": False, "binding": True},
                        nthreads=JOBS)
    return core + drivers


compile_protos()
setup(ext_modules=extensions(), options={"build_ext": {"parallel": JOBS}})
