"""Build lstmcy's Cython extensions.

Compiler directives are set here, once for every module. Set ``LSTMCY_DEBUG=1``
when building to turn on bounds and initialisation checks (and -O0 -g) for debugging, and
the test hooks (``LSTMCY_TEST_HOOKS``: see ``src/lstmcy/_threadpool.h``).

Set ``LSTMCY_SANITIZE`` to a comma-separated list of GCC sanitizers (``address,undefined``
or ``thread``) to build every extension instrumented, with the test hooks; the interpreter
must then preload the sanitizer's runtime (``tools/build_tests.sh`` and
docs/guarantees.md give the exact commands).
"""
import glob
import os
import platform
import subprocess

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("LSTMCY_DEBUG", "0") not in ("", "0")

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": False,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}

# -fno-trapping-math lets the compiler vectorise the branch-free exp/tanh (it may then
# evaluate both sides of a select); it changes no result. -ffp-contract=off keeps a*b+c
# from being fused except where the code asks for it (the packed GEMM, the activations'
# polynomials), so the AVX2 and AVX-512 builds give the same bits. The kernels' threads are
# lstmcy's own (pthreads): no OpenMP runtime, whose thread pool hangs a forked child.
compile_args = (["-O0", "-g", "-DLSTMCY_TEST_HOOKS"] if DEBUG else ["-O3"]) + [
    "-fno-trapping-math", "-ffp-contract=off", "-pthread"]
link_args = ["-pthread"]

SANITIZERS = {"address", "undefined", "thread"}
SANITIZE = [name for name in os.environ.get("LSTMCY_SANITIZE", "").split(",") if name]
if set(SANITIZE) - SANITIZERS or ("thread" in SANITIZE and "address" in SANITIZE):
    raise SystemExit(f"LSTMCY_SANITIZE={','.join(SANITIZE)}: expected 'address', "
                     "'undefined', 'address,undefined' or 'thread'")
if SANITIZE:
    # -O1 keeps the reports' stacks readable at a tolerable speed; -fno-sanitize-recover
    # makes every UBSan finding abort the process, so a test run cannot pass over one.
    flags = [f"-fsanitize={','.join(SANITIZE)}", "-fno-omit-frame-pointer", "-g"]
    if "undefined" in SANITIZE:
        flags.append("-fno-sanitize-recover=all")
    compile_args = ["-O1", "-DLSTMCY_TEST_HOOKS"] + compile_args[1:] + flags
    link_args = link_args + flags
# GCC only: a loop that reads and writes many arrays through plain raw pointers is
# vectorised behind runtime checks that the arrays do not overlap, and by default GCC gives
# up beyond 10 checks and leaves the loop scalar. (The cell rows, forward and backward,
# take their written arrays as restrict pointers and need no checks; this keeps any other
# such loop vectorised.)
GCC_ONLY_ARGS = ["--param=vect-max-version-for-alias-checks=400"]


def _is_gcc(executable):
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = getattr(self.compiler, "compiler_so", None)
        if compiler and _is_gcc(compiler[0]):
            for ext in self.extensions:
                ext.extra_compile_args = list(ext.extra_compile_args) + GCC_ONLY_ARGS
        super().build_extensions()


# The C headers the extensions include: editing one rebuilds them (cythonize tracks only
# the Cython files).
HEADERS = sorted(glob.glob("src/lstmcy/*.h"))


def extension(name, source, flags=()):
    return Extension(
        f"lstmcy.{name}",
        [f"src/lstmcy/{source}.pyx"],
        include_dirs=[np.get_include(), "src/lstmcy"],
        depends=HEADERS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
        extra_compile_args=compile_args + list(flags),
        extra_link_args=link_args,
    )


extensions = [extension("_blas", "_blas"), extension("_threadpool", "_threadpool"),
              extension("_lstm", "_lstm")]
# The elementwise passes (exp, tanh, gate gradients) vectorise; wider vectors pay off, so
# the kernels are also built for AVX2 and AVX-512 and lstmcy._engine.dispatch picks the best one
# the CPU supports at import time (no -march=native: the wheel runs on any x86-64).
if platform.machine().lower() in ("x86_64", "amd64") and not DEBUG:
    extensions += [
        extension("_lstm_avx2", "_lstm_avx2", ["-mavx2", "-mfma"]),
        # -mfma: -mavx512f alone does not define __FMA__, which _fastmath.pxd tests.
        extension("_lstm_avx512", "_lstm_avx512",
                  ["-mavx512f", "-mfma", "-mavx512cd", "-mavx512vl", "-mavx512bw", "-mavx512dq",
                   "-mprefer-vector-width=512"]),
    ]

setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions,
        include_path=["src"],
        compiler_directives=directives,
        # A debug build must not reuse C files generated without the checks.
        force=DEBUG or bool(SANITIZE),
    ),
)
