"""Side-by-side timing of two builds of lstmcy (an A/B of a change), in one run.

Each build is a source tree with its extensions built in place (``python setup.py
build_ext --inplace``). For every shape and thread count, rounds alternate between the
builds, each round a fresh interpreter importing one build that times the training
forward and the backward (``lstm_forward`` / ``lstm_backward``, median of ``--reps`` calls
after warm-up); the report gives each build's median over the rounds and the ratio
B / A (below 1: B is faster). ``--clock cpu`` times the process's CPU time instead of
the wall clock: for one thread on a loaded machine it leaves out the time other work held
the core (with more threads it is their total work, not the elapsed time). Each round's
B / A (its two interpreters back to back) is reported too: the median of the rounds'
ratios, and their quartiles as a measure of the noise.

``--same-process`` (one thread only) imports both builds into one interpreter instead and
alternates single calls of A and B: for calls of tens of microseconds the rounds' noise
would hide differences of a few. (Not on more threads: the two builds' thread pools would
take each other's cores.)

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python tools/ab_builds.py \\
        --a /path/to/old/tree --b . --shapes small-32x16,large-256 --threads 1,2
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

#: benchmarks/: the suite's cases (``cases.py``) that both builds time.
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

# The timed part, run in a child interpreter with PYTHONPATH set to one build.
CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    sys.path.insert(0, {bench!r})
    import lstmcy
    from cases import CASES, make_inputs, lstm_kwargs
    case = {{c.name: c for c in CASES}}[{shape!r}]
    inp = make_inputs(case)
    kw = lstm_kwargs(case)
    lstmcy.set_num_threads({threads})
    hx = (inp["h0"], inp["c0"])
    def fwd():
        return lstmcy.lstm_forward(inp["x"], hx, inp["params"], **kw)
    y, h_n, c_n, cache = fwd()
    def bwd():
        return lstmcy.lstm_backward(inp["x"], hx, inp["params"], inp["dy"], inp["dh"],
                                    inp["dc"], *cache.saved(), **kw)
    out = {{}}
    for name, f in (("forward", fwd), ("backward", bwd)):
        warm = time.perf_counter() + 0.3  # warm-up: at least 0.3 s and 5 calls
        for k in range(10 ** 6):
            f()
            if k >= 4 and time.perf_counter() > warm:
                break
        times = []
        clock = time.{clock}
        for _ in range({reps}):
            start = clock()
            f()
            times.append(clock() - start)
        out[name] = float(np.median(times))
    out["build"] = lstmcy.__file__
    print(json.dumps(out))
""")


CLOCKS = {"wall": "perf_counter", "cpu": "process_time"}


def time_build(root, shape, threads, reps, clock="wall"):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    code = CHILD.format(bench=BENCH, shape=shape, threads=threads, reps=reps, clock=CLOCKS[clock])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.abspath(root), timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{root} {shape}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _import_build(root):
    """lstmcy from source tree ``root``, imported apart from any other copy."""
    import importlib
    saved = {k: v for k, v in sys.modules.items() if k == "lstmcy" or k.startswith("lstmcy.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, os.path.abspath(root))
    try:
        module = importlib.import_module("lstmcy")
        # One small call while this build's modules are the ones imported: whatever it
        # imports on first use is its own.
        module.set_num_threads(1)
        x = np.zeros((2, 1, 1), np.float32)
        params = [np.zeros(s, np.float32) for s in [(4, 1), (4, 1), (4,), (4,)]]
        y, _, _, cache = module.lstm_forward(x, None, params)
        module.lstm_backward(x, None, params, np.ones_like(y), None, None, *cache.saved())
    finally:
        sys.path.remove(os.path.abspath(root))
        for k in [k for k in sys.modules if k == "lstmcy" or k.startswith("lstmcy.")]:
            del sys.modules[k]  # the next import finds the other build
        sys.modules.update(saved)
    return module


def same_process(a_root, b_root, shapes, calls):
    """Rows ``(shape, 1, pass, a, b, b / a, b / a, nan, nan)``: medians of ``calls``
    single calls of each build on one thread, A and B alternating (B first every other
    pair)."""
    import time

    sys.path.insert(0, BENCH)
    from cases import CASES, lstm_kwargs, make_inputs
    builds = {"a": _import_build(a_root), "b": _import_build(b_root)}
    for which, module in builds.items():
        print(f"build {which.upper()}: {module.__file__}")
    rows = []
    for shape in shapes:
        case = {c.name: c for c in CASES}[shape]
        inp = make_inputs(case)
        kw = lstm_kwargs(case)
        hx = (inp["h0"], inp["c0"])
        passes = {}
        for which, lstmcy in builds.items():
            lstmcy.set_num_threads(1)
            cache = lstmcy.lstm_forward(inp["x"], hx, inp["params"], **kw)[3]
            passes[which] = {
                "forward": lambda m=lstmcy: m.lstm_forward(inp["x"], hx, inp["params"], **kw),
                "backward": lambda m=lstmcy, c=cache: m.lstm_backward(
                    inp["x"], hx, inp["params"], inp["dy"], inp["dh"], inp["dc"], *c.saved(), **kw)}
        for kind in ("forward", "backward"):
            times = {"a": [], "b": []}
            warm = time.perf_counter() + 0.5
            while time.perf_counter() < warm:
                passes["a"][kind]()
                passes["b"][kind]()
            for k in range(calls):
                for which in (("a", "b") if k % 2 == 0 else ("b", "a")):
                    start = time.perf_counter()
                    passes[which][kind]()
                    times[which].append(time.perf_counter() - start)
            a, b = float(np.median(times["a"])), float(np.median(times["b"]))
            rows.append((shape, 1, kind, a, b, b / a, b / a, float("nan"), float("nan")))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="source tree of build A (the baseline)")
    parser.add_argument("--b", required=True, help="source tree of build B")
    parser.add_argument("--shapes", default="small-32x16,small-50x32,large-256,braun")
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated thread counts; 'auto' is the automatic count")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: elapsed time; cpu: the process's CPU time")
    parser.add_argument("--json", help="write the rounds' medians here")
    parser.add_argument("--same-process", action="store_true",
                        help="one thread: both builds in this interpreter, single calls alternating")
    parser.add_argument("--calls", type=int, default=2000,
                        help="with --same-process: calls of each build per shape and pass")
    args = parser.parse_args(argv)
    if args.same_process and args.threads != "1":
        parser.error("--same-process times one thread only (give --threads 1)")
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[0]
    rows, raw = [], []
    if args.same_process:
        rows = same_process(args.a, args.b, args.shapes.split(","), args.calls)
    for shape in ([] if args.same_process else args.shapes.split(",")):
        for threads in (None if t == "auto" else int(t) for t in args.threads.split(",")):
            times = {"a": {"forward": [], "backward": []}, "b": {"forward": [], "backward": []}}
            for round_ in range(args.rounds):
                order = ("a", "b") if round_ % 2 == 0 else ("b", "a")
                for which in order:
                    got = time_build(getattr(args, which), shape, threads, args.reps, args.clock)
                    for kind in ("forward", "backward"):
                        times[which][kind].append(got[kind])
            raw.append({"shape": shape, "threads": threads, "times": times})
            for kind in ("forward", "backward"):
                a = float(np.median(times["a"][kind]))
                b = float(np.median(times["b"][kind]))
                # Each round times A and B back to back: the round's ratio is free of the
                # machine's slower drifts, and the spread of the rounds' ratios shows the noise.
                pairs = np.array(times["b"][kind]) / np.array(times["a"][kind])
                rows.append((shape, threads, kind, a, b, b / a, float(np.median(pairs)),
                             float(np.percentile(pairs, 25)), float(np.percentile(pairs, 75))))
    with open("/proc/loadavg") as fh:
        load_after = fh.read().split()[0]
    print(f"A = {args.a}, B = {args.b}; {args.clock} clock; load average {load_before} before, "
          f"{load_after} after")
    print(f"{'shape':<16} {'threads':>7} {'pass':<9} {'A ms':>9} {'B ms':>9} {'B/A':>6}   "
          + ("(single calls alternating in one process)" if args.same_process
             else f"{'rounds B/A: median':>18} {'[25 %, 75 %]':>14}"))
    for shape, threads, kind, a, b, ratio, pair, low, high in rows:
        print(f"{shape:<16} {threads or 'auto':>7} {kind:<9} {a * 1e3:9.3f} {b * 1e3:9.3f} {ratio:6.3f}   "
              + (f"{pair:18.3f}   [{low:.3f}, {high:.3f}]" if low == low else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"a": args.a, "b": args.b, "clock": args.clock, "load": [load_before, load_after],
                       "runs": raw}, fh, indent=1)


if __name__ == "__main__":
    main()
