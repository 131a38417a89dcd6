"""Pick the build of the kernels for this CPU.

``_lstm`` is built for the platform's baseline; on x86-64 ``_lstm_avx2`` and
``_lstm_avx512`` hold the same code compiled for wider vectors. The AVX2 and AVX-512 builds
give bitwise identical results; the baseline one rounds the recurrent products and the
activations' polynomials without fused multiply-adds, so it agrees with them to rounding.
``LSTMCY_KERNELS=baseline|avx2|avx512`` forces a build (for testing).
"""
import importlib
import os

# (name, CPU features it needs), best first. numpy reports features the OS has enabled.
_BUILDS = (
    ("avx512", ("AVX512F", "AVX512CD", "AVX512VL", "AVX512BW", "AVX512DQ", "FMA3")),
    ("avx2", ("AVX2", "FMA3")),
)


def cpu_features():
    """The CPU features numpy detected (empty if this numpy does not say)."""
    for path in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return dict(importlib.import_module(path).__cpu_features__)
        except (ImportError, AttributeError):
            continue
    return {}


def available_builds():
    """Names of the kernel builds this CPU can run, best first (always ends with baseline)."""
    features = cpu_features()
    names = []
    for name, needed in _BUILDS:
        if all(features.get(f) for f in needed):
            try:
                importlib.import_module(f"lstmcy._lstm_{name}")
            except ImportError:  # not built on this platform
                continue
            names.append(name)
    return names + ["baseline"]


def load(name=None):
    """The kernel module ``name`` (default: ``$LSTMCY_KERNELS`` or the best available)."""
    name = name or os.environ.get("LSTMCY_KERNELS") or available_builds()[0]
    if name == "baseline":
        return importlib.import_module("lstmcy._lstm")
    if name not in dict(_BUILDS):
        raise ValueError(f"LSTMCY_KERNELS must be one of baseline, avx2, avx512; got {name!r}")
    if name not in available_builds():
        raise ImportError(f"the {name} build of lstmcy's kernels cannot run on this CPU "
                          f"or was not built")
    return importlib.import_module(f"lstmcy._lstm_{name}")


kernels = load()
KERNELS = kernels.__name__.rpartition("_lstm")[2].lstrip("_") or "baseline"
