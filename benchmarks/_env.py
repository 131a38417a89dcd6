"""Run the benchmark without OpenBLAS's kernel overrides (imported before numpy).

Some environments set ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE``,
which make OpenBLAS pick older, slower kernels. OpenBLAS reads them once, when
the library is loaded (on ``import numpy`` / ``import scipy``), so unsetting them
later in the process has no effect: the script re-executes itself with a clean
environment instead. Tests and CI keep the variables.
"""
import os
import sys

UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_MARK = "LSTMCY_BENCH_REEXEC"

#: What ``--avx2-proxy`` sets: lstmcy's AVX2 kernels, OpenBLAS's Haswell kernels and
#: PyTorch's AVX2 code (ATen, MKL, oneDNN). On an AVX-512 CPU this runs the code an
#: AVX2-only CPU runs, on cores that are not an AVX2-only CPU's (their caches and, on
#: Zen 4, their 256-bit units serve both): a check of the AVX2 code paths, not a
#: measurement of such a machine.
AVX2_PROXY = {"LSTMCY_KERNELS": "avx2", "OPENBLAS_CORETYPE": "Haswell",
              "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              "DNNL_MAX_CPU_ISA": "AVX2"}

__all__ = ["reexec_without_openblas_overrides", "use_avx2_proxy", "UNSET", "AVX2_PROXY"]


def use_avx2_proxy(argv, module="__main__"):
    """With ``--avx2-proxy`` in ``argv``, set :data:`AVX2_PROXY` in this process's
    environment (call it after :func:`reexec_without_openblas_overrides`, before numpy,
    scipy, torch or lstmcy is imported: each reads its variable when it loads)."""
    if module != "__main__" or "--avx2-proxy" not in argv:
        return
    loaded = [m for m in ("numpy", "scipy", "torch", "lstmcy") if m in sys.modules]
    if loaded:
        raise SystemExit(f"{', '.join(loaded)} imported before the AVX2 proxy's variables were set")
    os.environ.update(AVX2_PROXY)


def reexec_without_openblas_overrides(module="__main__"):
    """Replace this process by the same command without the variables in ``UNSET``
    (passed on in ``LSTMCY_BENCH_UNSET`` for the report), before numpy or scipy is imported.

    Does nothing when none of them is set, or when ``module`` (the caller's ``__name__``)
    is not ``"__main__"``: a script imported by tests or tools leaves its process alone.
    """
    present = {name: os.environ[name] for name in UNSET if name in os.environ}
    if not present or module != "__main__":
        return
    if os.environ.get(_MARK) == "1":
        raise SystemExit(f"{', '.join(present)} still set after re-exec; run the benchmark as "
                         "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/run.py`")
    loaded = [m for m in ("numpy", "scipy") if m in sys.modules]
    if loaded:
        raise SystemExit(f"{', '.join(loaded)} imported before the OpenBLAS variables were removed")
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env[_MARK] = "1"
    env["LSTMCY_BENCH_UNSET"] = " ".join(f"{k}={v}" for k, v in present.items())
    argv = [sys.executable] + list(getattr(sys, "orig_argv", [sys.executable] + sys.argv)[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
