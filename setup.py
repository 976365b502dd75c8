"""Build: compile the Cython core against the installed grpcio, and the third_party/ schemas with grpcio-tools."""

import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_protos() -> None:
    """Write grpc_retry/_proto/*_pb2.py from third_party/*.proto (never committed).

    protoc (grpcio-tools, whichever release has a wheel for this Python) only parses each schema into its
    descriptor; the module is written here. protoc's own modules refuse a protobuf runtime older than the protoc
    that wrote them, so those of a new grpcio-tools would not load on the oldest protobuf grpc_retry supports.
    These hold the same descriptor, built by protobuf's builder as every generated module since 3.20 is."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc  # build requirement

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    out = os.path.join(HERE, "grpc_retry", "_proto")
    for proto in sorted(glob.glob(os.path.join(HERE, "third_party", "*.proto"))):
        descriptors = os.path.join(out, os.path.basename(proto) + ".pb")
        rc = protoc.main(["protoc", f"-I{os.path.join(HERE, 'third_party')}", f"-I{include}",
                          f"--descriptor_set_out={descriptors}", proto])
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")
        with open(descriptors, "rb") as f:
            (schema,) = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
        os.remove(descriptors)
        module = schema.name[:-len(".proto")] + "_pb2"
        imports = "".join(f"import {dependency[:-len('.proto')].replace('/', '.')}_pb2  # noqa: F401 (in the pool)\n"
                          for dependency in schema.dependency)
        _write(os.path.join(out, module + ".py"),
               f'"""{schema.name}, built from third_party/{schema.name} by setup.py."""\n\n'
               "from google.protobuf import descriptor_pool\nfrom google.protobuf.internal import builder\n\n"
               f"{imports}\nDESCRIPTOR = descriptor_pool.Default().AddSerializedFile({schema.SerializeToString()!r})\n"
               "builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, globals())\n"
               f"builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'grpc_retry._proto.{module}', globals())\n")


# The per-call Python of the drivers, compiled as it is (Cython's pure-Python mode: the .py stays the source,
# read, typed and tested as Python; annotations are not taken as C types, so it behaves as it reads). The .pxd
# beside a module declares its extension types' attributes (then read and set as C struct fields, not looked up by
# name) and its C functions (cpdef where another module cimports them: by name, each call would cost a lookup).
COMPILED_MODULES = ["grpc_retry._driver", "grpc_retry._method", "grpc_retry._waiters", "grpc_retry._timer",
                    "grpc_retry._telemetry", "grpc_retry._transport.ends", "grpc_retry._transport.grpc_private",
                    "grpc_retry._transport.batches", "grpc_retry._transport.direct", "grpc_retry._transport.direct_aio",
                    "grpc_retry._transport.direct_streams", "grpc_retry.aio._driver", "grpc_retry.aio._call",
                    "grpc_retry.aio._channel", "grpc_retry.aio._timers", "grpc_retry.sync._attempts",
                    "grpc_retry.sync._driver", "grpc_retry.sync._caller", "grpc_retry.sync._call", "grpc_retry.sync._channel",
                    "grpc_retry._backends.subchannels", "grpc_retry._backends.sync", "grpc_retry._backends.aio"]


# Cython's translation and the C compiler's runs, in parallel: the build is most of a fresh install's time.
JOBS = os.cpu_count() or 1


def _stale(generated: str, source: str) -> bool:
    """Whether `generated` is older than `source`, which Cython's own dependency tracking does not see."""
    return os.path.exists(generated) and os.path.getmtime(generated) < os.path.getmtime(source)


NATIVE = os.path.join("build", "native")  # the modules' C as linked into one library (written here)
INCLUDED = {}  # each file written in NATIVE: the module's C it includes


def _write(path: str, text: str) -> None:
    """Write `text` unless the file holds it already (its time then stays, and nothing depending on it rebuilds)."""
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def native(modules):
    """grpc_retry._native (_cython/_native.pyx): every compiled module in one library. `modules`: each module's
    dotted name and its C. Each is compiled from a file that renames its init function (the last part of a name is
    not unique: aio._call, sync._call) and includes its C; _native.pyx makes the modules from the list of those
    init functions, native_modules.h."""
    os.makedirs(NATIVE, exist_ok=True)
    wrappers, entries = [], []
    for name, c_file in modules:
        init = "grpc_retry_init_" + name.replace(".", "__")
        wrapper = os.path.join(NATIVE, name + ".c")
        include = os.path.relpath(c_file, NATIVE).replace(os.sep, "/")
        _write(wrapper, f"/* {name}, linked into grpc_retry._native (written by setup.py) */\n"
                        f"#define PyInit_{name.rsplit('.', 1)[1]} {init}\n#include \"{include}\"\n")
        wrappers.append(wrapper)
        INCLUDED[wrapper] = c_file
        entries.append(f'    GRPC_RETRY_MODULE({init}, "{name}")')
    _write(os.path.join(NATIVE, "native_modules.h"),
           "/* grpc_retry._native's modules (written by setup.py) */\n#define GRPC_RETRY_MODULES \\\n"
           + " \\\n".join(entries) + "\n")
    return Extension("grpc_retry._native", [os.path.join("_cython", "_native.pyx")] + wrappers,
                     include_dirs=[NATIVE], depends=[c_file for _, c_file in modules])


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
    # Translated to C only: the C is compiled into grpc_retry._native.
    return cythonize([native([(ext.name, ext.sources[0]) for ext in core + drivers])], language_level=3)


class BuildExt(build_ext):
    """Compiles an extension's C files in parallel, the largest first (setuptools compiles one extension's files
    one by one, and grpc_retry._native is all of them), saying how far it is (pip shows it with -v)."""

    def build_extension(self, ext):
        compile_files = self.compiler.compile
        if self.compiler.compiler_type == "unix" and "CFLAGS" not in os.environ:
            # Without debug info and at -O2, as the release wheels: Python's own -g -O3 doubles the compile time
            # and makes a 37 MB library. A CFLAGS of one's own replaces these.
            ext.extra_compile_args = [*ext.extra_compile_args, "-g0", "-O2"]

        def compile_in_parallel(sources, **kwargs):
            for source in sources:  # (the directories first: made concurrently, they race)
                os.makedirs(os.path.dirname(self.compiler.object_filenames([source], output_dir=kwargs.get(
                    "output_dir") or "")[0]) or ".", exist_ok=True)
            done = []

            def compile_one(source):
                objects = compile_files([source], **kwargs)
                done.append(source)
                print(f"grpc_retry: compiled {len(done)}/{len(sources)}: {_compiled_name(source)}", file=sys.stderr,
                      flush=True)
                return objects

            print(f"grpc_retry: compiling the core ({len(sources)} C files, {JOBS} at a time)", file=sys.stderr,
                  flush=True)
            with ThreadPoolExecutor(JOBS) as pool:
                # The largest first: started last, one of them would leave the other cores idle at the end.
                running = {source: pool.submit(compile_one, source)
                           for source in sorted(sources, key=_compile_size, reverse=True)}
                return [obj for source in sources for obj in running[source].result()]

        self.compiler.compile = compile_in_parallel
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile


def _compiled_name(source: str) -> str:
    """What a file of grpc_retry._native compiles: its module's name, or the library's own C."""
    return os.path.splitext(os.path.basename(source))[0] if NATIVE in source else "grpc_retry._native"


def _compile_size(source: str) -> int:
    """The size of the C a file compiles (a module's file in build/native includes it)."""
    return os.path.getsize(INCLUDED.get(source, source))


compile_protos()
setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
