"""Build lstmcy's Cython extensions.

Compiler directives are set here, once for every module. Set ``LSTMCY_DEBUG=1``
when building to turn on bounds and initialisation checks (and -O0 -g) for debugging.
"""
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

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
# from being fused, so results do not depend on the instruction set. OpenMP runs the two
# halves of a layer's work on two threads.
compile_args = (["-O0", "-g"] if DEBUG else ["-O3"]) + [
    "-fno-trapping-math", "-ffp-contract=off", "-fopenmp"]

extensions = [
    Extension(
        f"lstmcy.{name}",
        [f"src/lstmcy/{name}.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
        extra_compile_args=compile_args,
        extra_link_args=["-fopenmp"],
    )
    for name in ("_blas", "_lstm")
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["src"],
        compiler_directives=directives,
        # A debug build must not reuse C files generated without the checks.
        force=DEBUG,
    ),
)
