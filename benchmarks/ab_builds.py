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

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/ab_builds.py \\
        --a /path/to/old/tree --b . --shapes small-32x16,large-256 --threads 1,2
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

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
    code = CHILD.format(bench=HERE, shape=shape, threads=threads, reps=reps, clock=CLOCKS[clock])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.abspath(root), timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{root} {shape}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[0]
    rows, raw = [], []
    for shape in args.shapes.split(","):
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
          f"{'rounds B/A: median':>18} {'[25 %, 75 %]':>14}")
    for shape, threads, kind, a, b, ratio, pair, low, high in rows:
        print(f"{shape:<16} {threads or 'auto':>7} {kind:<9} {a * 1e3:9.3f} {b * 1e3:9.3f} {ratio:6.3f}   "
              f"{pair:18.3f}   [{low:.3f}, {high:.3f}]")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"a": args.a, "b": args.b, "clock": args.clock, "load": [load_before, load_after],
                       "runs": raw}, fh, indent=1)


if __name__ == "__main__":
    main()
