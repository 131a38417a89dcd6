#!/usr/bin/env python
"""The activations' cost: this tree's kernels against another build of them, in one process.

Usage::

    git worktree add /tmp/lstmcy-base main
    (cd /tmp/lstmcy-base && python setup.py -q build_ext --inplace)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/bench_activations.py --against /tmp/lstmcy-base/lstmcy

The kernel module this tree runs (``lstmcy._dispatch.KERNELS``: baseline, avx2 or avx512)
is loaded a second time from the ``--against`` directory, under another name. In
interleaved rounds (``timing.py``: medians, side by side) the script times

* the kernels' test hooks ``_vector_sigmoid`` / ``_vector_tanh`` on ``--n`` elements of
  float32 and float64 (inputs spread over [-20, 20]), in ns per element;
* ``lstm_forward(train=True)`` on benchmark cases (``--shapes``, names from ``cases.py``),
  with ``lstmcy._core``'s kernel module swapped for the other build between calls (the
  Python side is this tree's, so the two builds must share the kernels' interface).

Without ``--against`` only this tree's build is timed. Output: a table on stdout and
``benchmarks/results/activations-<timestamp>.json`` (or ``--json``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _env import reexec_without_openblas_overrides  # noqa: E402  (no numpy import)

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import argparse  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

import lstmcy  # noqa: E402
from lstmcy import _core, _dispatch  # noqa: E402
from cases import make_inputs, select_cases  # noqa: E402
from machine import cpu_snapshot, git_state, lscpu_summary, others_cores, versions  # noqa: E402
from timing import measure  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def load_other_build(directory):
    """The kernel module of this tree's build from ``directory`` (a built ``lstmcy``
    package directory), imported as ``other_kernels._lstm[_build]``."""
    name = "_lstm" if _dispatch.KERNELS == "baseline" else f"_lstm_{_dispatch.KERNELS}"
    paths = glob.glob(os.path.join(directory, f"{name}.*.so")) + glob.glob(
        os.path.join(directory, f"{name}.*.pyd"))
    if not paths:
        raise SystemExit(f"no {name} extension in {directory} (build it in place first)")
    # The module's name must end in its own (the init function is PyInit_<name>).
    spec = importlib.util.spec_from_file_location(f"other_kernels.{name}", paths[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def activation_calls(builds, n):
    """``{label: zero-argument call}`` for each build, activation and dtype."""
    calls = {}
    for dtype in (np.float32, np.float64):
        x = np.linspace(-20, 20, n).astype(dtype)
        for activation in ("sigmoid", "tanh"):
            for build, module in builds.items():
                hook = getattr(module, f"_vector_{activation}")
                out = np.empty_like(x)
                calls[(activation, np.dtype(dtype).name, build)] = (
                    lambda hook=hook, x=x, out=out: hook(x, out))
    return calls


def forward_call(module, inputs):
    """``lstm_forward(train=True)`` of ``inputs`` with ``module`` as the kernels."""
    def call():
        _core._lstm = module
        lstmcy.lstm_forward(inputs["x"], (inputs["h0"], inputs["c0"]), inputs["params"],
                            num_layers=inputs["L"], train=True)
    return call


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="DIR",
                        help="a built lstmcy package directory whose kernels to compare with")
    parser.add_argument("--shapes", default="tiny,small-50x32,large-256,tiny-f64,small-50x32-f64,large-256-f64",
                        help="benchmark cases of the forward (names or patterns from cases.py)")
    parser.add_argument("--n", type=int, default=4096, help="elements per activation call")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=None,
                        help="lstmcy's kernel threads (default: the library's own choice)")
    parser.add_argument("--json", help="where to write the results")
    args = parser.parse_args(argv)

    if args.threads is not None:
        lstmcy.set_num_threads(args.threads)
    builds = {"this": _core._lstm}
    if args.against:
        builds["other"] = load_other_build(os.path.abspath(args.against))
    print(f"kernels: {_dispatch.KERNELS}; builds: "
          + ", ".join(f"{k} = {getattr(m, '__file__', m.__name__)}" for k, m in builds.items()))
    print(f"load average at start: {os.getloadavg()}")
    results = {"activations": [], "forward": []}

    before = cpu_snapshot()
    timed = measure({" ".join(k): f for k, f in activation_calls(builds, args.n).items()},
                    repeats=args.repeats, min_time=0.02)
    load = results["others_cores_activations"] = others_cores(before, cpu_snapshot())
    print(f"\nactivations, ns per element (median of {args.repeats} rounds, n = {args.n}; "
          f"other processes kept {load:.2f} cores busy)")
    for (activation, dtype, build) in activation_calls(builds, 1):
        t = timed[f"{activation} {dtype} {build}"]
        row = dict(activation=activation, dtype=dtype, build=build,
                   ns_per_element=t["median"] / args.n * 1e9,
                   iqr_ns=t["iqr"] / args.n * 1e9)
        results["activations"].append(row)
    _print_rows(results["activations"], ("activation", "dtype"), "ns_per_element", "ns")

    before = cpu_snapshot()
    for case in select_cases(args.shapes):
        inputs = dict(make_inputs(case), L=case.L)
        timed = measure({build: forward_call(module, inputs) for build, module in builds.items()},
                        repeats=args.repeats)
        for build in builds:
            results["forward"].append(dict(case=case.name, shape=case.shape_label, dtype=case.dtype,
                                           build=build, ms=timed[build]["median"] * 1e3,
                                           iqr_ms=timed[build]["iqr"] * 1e3))
    _core._lstm = builds["this"]
    load = results["others_cores_forward"] = others_cores(before, cpu_snapshot())
    print(f"\ntraining forward, ms (median of {args.repeats} rounds; other processes kept "
          f"{load:.2f} cores busy)")
    _print_rows(results["forward"], ("case", "shape"), "ms", "ms")
    print(f"\nload average at end: {os.getloadavg()}")

    results.update(machine=lscpu_summary(), versions=versions(), git=git_state(os.path.dirname(HERE)),
                   git_against=git_state(args.against) if args.against else None,
                   kernels=_dispatch.KERNELS, against=args.against, n=args.n, threads=args.threads,
                   repeats=args.repeats, load_average_end=os.getloadavg(),
                   openblas_unset=os.environ.get("LSTMCY_BENCH_UNSET", ""))
    path = args.json or os.path.join(
        HERE, "results", f"activations-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"wrote {path}")


def _print_rows(rows, keys, value, unit):
    """One line per ``keys`` group: each build's ``value`` and, with two, this / other."""
    groups = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), {})[row["build"]] = row
    for key, by_build in groups.items():
        cells = [f"{b} {r[value]:.3f} {unit} (iqr {r['iqr_' + unit]:.3f})" for b, r in by_build.items()]
        if len(by_build) == 2:
            cells.append(f"this/other {by_build['this'][value] / by_build['other'][value]:.3f}")
        print(f"  {' '.join(map(str, key)):32s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
