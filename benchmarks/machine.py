"""What the benchmark ran on: CPU, BLAS libraries and kernels, and the GEMM peak.

The GEMM peak is measured in the same process as the LSTM timings, with the same
thread settings, for each BLAS the comparison involves: numpy's OpenBLAS
(``numpy.matmul``), scipy's OpenBLAS (``scipy.linalg.blas.?gemm``, the library
lstmcy's Cython kernels call through ``scipy.linalg.cython_blas``) and PyTorch's
MKL (``torch.mm``). The machine's peak for a dtype is the best of them.
"""
import json
import os
import platform
import subprocess
import sys

import numpy as np

from timing import run_batch

#: The checkout holding benchmarks/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["lscpu_summary", "machine_label", "blas_info", "gemm_peak", "versions", "git_state",
           "result_stamp", "update_result_file"]

_LSCPU_KEYS = ("Model name", "Architecture", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
               "Socket(s)", "CPU max MHz", "BogoMIPS", "Hypervisor vendor", "L1d cache", "L2 cache",
               "L3 cache")


def lscpu_summary():
    """A few lines of ``lscpu`` plus the SIMD flags that matter for GEMM."""
    info = {"platform": platform.platform(), "os.cpu_count": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in _LSCPU_KEYS:
            info[key] = value
        elif key == "Flags":
            flags = set(value.split())
            info["simd"] = " ".join(f for f in ("avx", "avx2", "fma", "avx512f", "avx512_bf16",
                                                 "avx512_vnni", "amx_tile") if f in flags)
    return info


def machine_label():
    """One line naming the CPU, its count and its SIMD flags (for result files)."""
    cpu = lscpu_summary()
    return f"{cpu.get('Model name', '?')}, {cpu.get('CPU(s)', '?')} CPUs, {cpu.get('simd', '')}"


def blas_info():
    """BLAS and OpenMP runtimes loaded in this process (threadpoolctl) and PyTorch's backends.

    Call after numpy, scipy (through lstmcy) and torch are imported.
    """
    import threadpoolctl
    import torch

    pools = []
    for entry in threadpoolctl.threadpool_info():
        pools.append({k: entry.get(k) for k in ("user_api", "internal_api", "prefix", "version",
                                                 "architecture", "threading_layer", "num_threads",
                                                 "filepath")})
    torch_info = {
        "version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "mkldnn_available": bool(torch.backends.mkldnn.is_available()),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "mkl_available": bool(torch.backends.mkl.is_available()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "config": [ln.strip(" -") for ln in torch.__config__.show().replace(",", "\n").splitlines()
                   if any(k in ln for k in ("MKL", "OpenMP", "OPENMP", "CPU capability", "BLAS_INFO"))],
    }
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("OPENBLAS", "OMP_", "MKL", "GOMP", "KMP", "DNNL", "ONEDNN"))}
    return {"threadpoolctl": pools, "torch": torch_info, "env": env,
            "unset_by_run_py": os.environ.get("LSTMCY_BENCH_UNSET", "")}


def describe_pools(info):
    """One line per BLAS/OpenMP runtime: ``prefix internal_api version architecture threads``."""
    lines = []
    for p in info["threadpoolctl"]:
        arch = p.get("architecture") or "-"
        lines.append(f"{p['prefix']} ({p['internal_api']} {p.get('version') or ''}): "
                     f"kernel={arch}, threads={p['num_threads']}, {p.get('threading_layer') or ''}".rstrip(", "))
    t = info["torch"]
    lines.append(f"torch {t['version']}: cpu_capability={t['cpu_capability']}, "
                 f"mkldnn={t['mkldnn_available'] and t['mkldnn_enabled']}, mkl={t['mkl_available']}, "
                 f"threads={t['num_threads']} (MKL/oneDNN are linked statically: threadpoolctl sees "
                 f"only its libgomp)")
    return lines


def gemm_peak(dtype, sizes=(1024, 2048), repeats=5):
    """GF/s of square GEMMs of each size in numpy, scipy and torch; the best is the peak:
    ``{"peak_gflops": float, "best": "lib@n", "runs": {"numpy.matmul@1024": gflops, ...},
    "median_runs": {...}}``. Each library and size is timed ``repeats`` times; its GF/s is
    that of the fastest call (a peak, so the least disturbed call counts), the median is
    kept too."""
    import scipy.linalg.blas as sblas
    import torch

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(1)
    gemm = sblas.sgemm if dtype == np.float32 else sblas.dgemm
    runs, median_runs = {}, {}
    for n in sizes:
        a = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
        b = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
        c = np.empty((n, n), dtype=dtype, order="F")
        ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
        cc = np.empty((n, n), dtype=dtype)
        ta, tb = torch.from_numpy(ac), torch.from_numpy(bc)
        tc = torch.empty((n, n), dtype=ta.dtype)
        flops = 2.0 * n ** 3
        candidates = {
            "numpy.matmul": lambda: np.matmul(ac, bc, out=cc),
            "scipy.blas": lambda: gemm(1.0, a, b, c=c, overwrite_c=True),
            "torch.mm": lambda: torch.mm(ta, tb, out=tc),
        }
        for name, fn in candidates.items():
            fn()
            times = sorted(run_batch(fn, 1)[0] for _ in range(repeats))
            runs[f"{name}@{n}"] = flops / times[0] / 1e9
            median_runs[f"{name}@{n}"] = flops / times[len(times) // 2] / 1e9
    best = max(runs, key=runs.get)
    return {"peak_gflops": runs[best], "best": best, "runs": runs, "median_runs": median_runs}


def versions():
    import scipy
    import threadpoolctl
    import torch

    import lstmcy
    return {"python": sys.version.split()[0], "numpy": np.__version__, "scipy": scipy.__version__,
            "torch": torch.__version__, "lstmcy": lstmcy.__version__,
            "lstmcy_path": os.path.dirname(lstmcy.__file__), "threadpoolctl": threadpoolctl.__version__}


def git_state(path):
    """Commit and whether the work tree has changes under lstmcy/ or src/ (None outside git)."""
    try:
        commit = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--", "lstmcy", "src"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": commit, "kernel_changes_uncommitted": dirty.splitlines()}


def result_stamp():
    """Where a result file was measured: ``load``, the load average now; ``machine``;
    ``lstmcy``, this checkout's commit, abbreviated, with "+" when lstmcy/ or src/ have
    changes that are not committed (None outside git)."""
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    state = git_state(ROOT)
    commit = state and state["commit"][:7] + ("+" if state["kernel_changes_uncommitted"] else "")
    return {"load": load, "machine": machine_label(), "lstmcy": commit}


def update_result_file(path, **sections):
    """Write ``sections`` (top-level keys) into the JSON file ``path``, keeping its other
    keys: one result file holds several runs (scaling.json the contention run,
    estimators.json the ragged-data run)."""
    doc = {}
    if os.path.exists(path):
        with open(path) as fh:
            doc = json.load(fh)
    doc.update(sections)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=float)


def cpu_snapshot():
    """Jiffies from ``/proc``: all CPUs busy and total, and this process's (all threads)."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
        with open("/proc/self/stat") as fh:
            own = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return {"busy": total - idle, "total": total, "own": int(own[11]) + int(own[12])}


def others_cores(before, after, ncpu=None):
    """Average number of cores other processes kept busy between two :func:`cpu_snapshot`."""
    if before is None or after is None:
        return None
    total = after["total"] - before["total"]
    if total <= 0:
        return None
    others = (after["busy"] - before["busy"]) - (after["own"] - before["own"])
    return max(0.0, others / total * (ncpu or os.cpu_count() or 1))
