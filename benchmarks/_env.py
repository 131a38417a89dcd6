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

__all__ = ["reexec_without_openblas_overrides", "UNSET"]


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
