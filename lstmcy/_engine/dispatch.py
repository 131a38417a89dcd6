"""Pick the build of the kernels for this CPU.

``_lstm`` is built for the platform's baseline; on x86-64 ``_lstm_avx2`` and
``_lstm_avx512`` hold the same code compiled for wider vectors. The AVX2 and AVX-512 builds
give bitwise identical results; the baseline one rounds the recurrent products and the
activations' polynomials without fused multiply-adds, so it agrees with them to rounding.
``LSTMCY_KERNELS=baseline|avx2|avx512`` forces a build (for testing).

A loaded build is told two facts of the CPU: the one its products' speed depends on
beyond the instruction set (``set_weights_rows_in_place``; the rule is
:func:`lstmcy._engine.schedule.weights_rows_in_place`; results do not depend on it), and
where PyTorch's float64 tanh reaches 1 on it (``set_tanh_one_from``;
:func:`lstmcy._engine.saturation.tanh_one_from`).
"""
import functools
import importlib
import os
import platform
import re

from lstmcy._engine.saturation import tanh_one_from
from lstmcy._engine.schedule import weights_rows_in_place

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


@functools.lru_cache(maxsize=1)
def cpu_vendor_family():
    """(vendor, family) of this CPU as CPUID gives them, e.g. ``("AuthenticAMD", 25)``;
    each None where the operating system does not say (read once: every build loaded
    asks)."""
    try:
        with open("/proc/cpuinfo") as f:  # Linux: the first processor's lines
            info = {}
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
        return info.get("vendor_id"), int(info["cpu family"]) if "cpu family" in info else None
    except (OSError, ValueError):
        pass
    # Windows: "AMD64 Family 25 Model 97 Stepping 2, AuthenticAMD"
    found = re.search(r"Family (\d+) .*, (\w+)$", platform.processor() or "")
    return (found.group(2), int(found.group(1))) if found else (None, None)


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
        module = importlib.import_module("lstmcy._lstm")
    elif name not in dict(_BUILDS):
        raise ValueError(f"LSTMCY_KERNELS must be one of baseline, avx2, avx512; got {name!r}")
    elif name not in available_builds():
        raise ImportError(f"the {name} build of lstmcy's kernels cannot run on this CPU "
                          f"or was not built")
    else:
        module = importlib.import_module(f"lstmcy._lstm_{name}")
    set_cpu_facts(module, name)
    return module


def set_cpu_facts(module, name):
    """Tell the kernel build ``module`` (named ``name``: baseline, avx2, avx512) the facts
    of this CPU it needs (see the top of this module); what :func:`load` does, and what a
    test that changed them puts back."""
    vendor, family = cpu_vendor_family()
    module.set_weights_rows_in_place(weights_rows_in_place(name, vendor, family))
    module.set_tanh_one_from(tanh_one_from(vendor, cpu_features().get("AVX512F"),
                                           os.environ.get("MKL_ENABLE_INSTRUCTIONS")))


kernels = load()
KERNELS = kernels.__name__.rpartition("_lstm")[2].lstrip("_") or "baseline"
