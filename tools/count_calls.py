"""Repeated calls of one shape, for valgrind to count (instructions do not depend on the
machine's load, which makes microsecond differences between builds visible).

Run it twice under callgrind, with ``N`` calls and with none; the difference of the two
totals over ``N`` is the count of one call::

    PY=$(python -c "import sys; print(sys.executable)")
    for n in 0 300; do
        PYTHONPATH=<build> OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind \\
            --callgrind-out-file=/dev/null $PY tools/count_calls.py forward $n 2>&1 \\
            | grep Collected
    done

Both runs make the same warm-up calls first. ``--shape T,B,I,H`` (default the suite's
tiny case, 20,1,16,32), float32, one thread.
"""
import argparse

import numpy as np

import lstmcy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["forward", "backward"])
    parser.add_argument("calls", type=int)
    parser.add_argument("--shape", default="20,1,16,32")
    args = parser.parse_args(argv)
    T, B, I, H = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    params = [rng.uniform(-0.1, 0.1, s).astype(np.float32)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    dy = np.ones((T, B, H), np.float32)
    plan = lstmcy.LSTMPlan(n_threads=1)
    saved = plan.forward(x, None, params)[3].saved()
    for _ in range(20):
        plan.forward(x, None, params)
        plan.backward(x, None, params, dy, None, None, *saved)
    for _ in range(args.calls):
        if args.kind == "forward":
            plan.forward(x, None, params)
        else:
            plan.backward(x, None, params, dy, None, None, *saved)


if __name__ == "__main__":
    main()
