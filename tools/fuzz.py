#!/usr/bin/env python
"""Fuzz lstmcy's public API with random valid and malformed calls, in a child process.

Each case is a random valid configuration (sizes 0-4, 1-3 layers, both directions, every
layout, every dtype, dropout) whose arguments are then broken by one or two random
malformations from ``tests/hostile.py`` (or left intact). The forward and the backward of
the case are called and the outcome classified:

* **ok**: returned normally; for intact cases the results also match ``lstmcy.reference``.
* **rejected**: raised ValueError or TypeError (the only exceptions bad input may cause).
* **error**: any other exception, a valid call that raised, or a result that differs from
  the reference (a "silent wrong answer").
* **crash**: the child process died by a signal (segfault, abort, ...) or stopped making
  progress (``--hang-timeout``). The parent restarts the child after the crashing case.

Cases are reproducible: case ``k`` of seed ``S`` only depends on ``(S, k)``;
``--replay K`` runs that one case in this process and prints what it does.

Examples
--------
Short run (what CI does, through ``tests/test_fuzz.py``)::

    python tools/fuzz.py --time 15

Long run (documented in the README; 100-400 cases per second, depending on the machine)::

    python tools/fuzz.py --time 3600 --seed 1 --malloc-check

Reproduce case 1234 of seed 1::

    python tools/fuzz.py --seed 1 --replay 1234

Exit status: 0 when there were no errors and no crashes, 1 otherwise.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def _tolerance(dtype):
    import numpy as np
    if dtype == np.float64:
        return 1e-9
    if dtype == np.float32:
        return 1e-4
    return 5e-2  # float16 / bfloat16: computed in float32 here, in float64 by the reference


def _max_rel_err(actual, expected):
    import numpy as np
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    if a.shape != e.shape:
        return np.inf, f"shape {a.shape} != reference {e.shape}"
    if a.size == 0:
        return 0.0, ""
    finite_a, finite_e = np.isfinite(a), np.isfinite(e)
    if not np.array_equal(finite_a, finite_e):
        return np.inf, "non-finite positions differ from the reference"
    if not finite_e.any():
        return 0.0, ""
    scale = max(np.abs(e[finite_e]).max(), 1.0)
    return float(np.abs(a[finite_e] - e[finite_e]).max() / scale), ""


def build_case(seed, index, valid_fraction):
    """Case ``index`` of ``seed``: ``(call, mutation names, descriptions)``."""
    import numpy as np
    import hostile
    rng = np.random.default_rng([seed, index])
    cfg = hostile.random_config(rng)
    call = hostile.make_call(cfg, rng, seed=int(rng.integers(1 << 31)))
    names, descriptions = [], []
    if rng.random() >= valid_fraction:
        all_names = sorted(hostile.MUTATIONS)
        for _ in range(1 if rng.random() < 0.7 else 2):
            name = all_names[rng.integers(len(all_names))]
            names.append(name)
            descriptions.append(hostile.apply_mutation(call, name, rng))
    return call, names, descriptions


def compare_with_reference(call):
    """Problems (list of str) of lstmcy's results against the reference on an intact call."""
    import lstmcy
    from lstmcy import reference
    problems = []
    tol = _tolerance(call.cfg.dtype)
    ours = lstmcy.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    ref = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    for name, a, b in zip(("y", "h_n", "c_n"), ours[:3], ref[:3]):
        err, why = _max_rel_err(a, b)
        if err > tol:
            problems.append(f"forward {name}: rel err {err:.3g} {why}")
    ours = lstmcy.lstm_backward(*call.bwd_args, **call.bwd_kwargs)
    ref = reference.lstm_backward(*call.bwd_args, **call.bwd_kwargs)
    pairs = list(zip(("dx", "dh_prev", "dc_prev"), ours[:3], ref[:3]))
    pairs += [(f"dparams[{k}]", a, b) for k, (a, b) in enumerate(zip(ours[3], ref[3]))]
    if len(ours[3]) != len(ref[3]):
        problems.append(f"dparams has {len(ours[3])} arrays, reference {len(ref[3])}")
    for name, a, b in pairs:
        err, why = _max_rel_err(a, b)
        if err > tol:
            problems.append(f"backward {name}: rel err {err:.3g} {why}")
    return problems


def run_case(seed, index, valid_fraction, check_reference=True):
    """Run one case; return ``(status, detail)`` with status ok / rejected / error."""
    import hostile
    call, names, descriptions = build_case(seed, index, valid_fraction)
    must_succeed = all(n in hostile.MUST_SUCCEED for n in names)
    statuses, details = [], []
    for which in ("fwd", "bwd"):
        try:
            hostile.run_call(call, which)
            statuses.append("ok")
        except (ValueError, TypeError) as exc:
            if must_succeed:
                return "error", (f"{which} of a valid call ({descriptions or 'intact'}) raised "
                                 f"{type(exc).__name__}: {exc}")
            statuses.append("rejected")
            details.append(f"{which}: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - anything else is a bug
            return "error", (f"{which} ({descriptions or 'intact'}) raised "
                             f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    if not names and check_reference:
        problems = compare_with_reference(call)
        if problems:
            return "error", f"intact call differs from the reference: {problems}"
    status = "rejected" if "rejected" in statuses else "ok"
    return status, "; ".join(descriptions + details)


def child_main(args):
    """Run cases ``start ..`` until ``count`` or the deadline; report each on stdout."""
    sys.path.insert(0, TESTS)
    warnings.simplefilter("ignore")  # NaN/Inf cases legitimately warn
    import faulthandler
    faulthandler.enable()
    import numpy as np  # noqa: F401 (import before the first START line)
    import hostile  # noqa: F401
    out = sys.stdout
    index = args.start
    end = args.start + args.count if args.count else None
    crash_at = os.environ.get("LSTMCY_FUZZ_SELFTEST_CRASH_AT")  # tests the harness itself
    while (end is None or index < end) and time.time() < args.deadline:
        out.write(f"START {index}\n")
        out.flush()
        if crash_at is not None and index == int(crash_at):
            os.kill(os.getpid(), signal.SIGSEGV)
        status, detail = run_case(args.seed, index, args.valid_fraction, not args.no_reference)
        out.write(json.dumps({"index": index, "status": status, "detail": detail[:2000]}) + "\n")
        out.flush()
        index += 1
    out.write("DONE\n")
    out.flush()
    return 0


def _child_env(malloc_check):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, env.get("PYTHONPATH")]))
    # Fill freed and fresh heap blocks with a pattern, so reads of freed memory misbehave early.
    tunables = ["glibc.malloc.perturb=165"]
    if malloc_check:
        for lib in ("/lib/x86_64-linux-gnu/libc_malloc_debug.so.0",
                    "/usr/lib64/libc_malloc_debug.so.0", "/usr/lib/libc_malloc_debug.so.0"):
            if os.path.exists(lib):
                env["LD_PRELOAD"] = os.pathsep.join(filter(None, [lib, env.get("LD_PRELOAD")]))
                tunables.append("glibc.malloc.check=3")
                break
    env["GLIBC_TUNABLES"] = ":".join(tunables)
    return env


def parent_main(args):
    """Drive children over the whole budget; print a summary; return the exit status."""
    start_time = time.time()
    deadline = start_time + args.time if args.time else float("inf")
    counts = {"ok": 0, "rejected": 0, "error": 0, "crash": 0}
    failures = []
    index = 0
    env = _child_env(args.malloc_check)
    while (not args.count or index < args.count) and time.time() < deadline:
        remaining = args.count - index if args.count else 0
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--seed", str(args.seed),
               "--start", str(index), "--count", str(remaining),
               "--deadline", repr(deadline if deadline != float("inf") else 1e18),
               "--valid-fraction", str(args.valid_fraction)]
        if args.no_reference:
            cmd.append("--no-reference")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
        stderr_chunks = []
        import threading
        reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()),
                                  daemon=True)
        reader.start()
        current = None
        done = False
        last_progress = time.time()
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        hung = False
        while True:
            ready = sel.select(timeout=1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                if time.time() - last_progress > args.hang_timeout:
                    hung = True
                    proc.kill()
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            last_progress = time.time()
            line = line.strip()
            if line.startswith("START "):
                current = int(line.split()[1])
            elif line == "DONE":
                done = True
            elif line.startswith("{"):
                record = json.loads(line)
                counts[record["status"]] += 1
                if record["status"] == "error":
                    failures.append(record)
                    if args.verbose:
                        print(f"ERROR case {record['index']}: {record['detail']}", flush=True)
                current = None
                index = record["index"] + 1
        sel.close()
        proc.wait()
        reader.join(timeout=5)
        if done and not hung:
            break
        # The child died (or hung) in the middle of case ``current``.
        rc = proc.returncode
        if current is None:  # died between cases (start-up or after the last record)
            if rc == 0:
                break
            current = index
        signame = (signal.Signals(-rc).name if rc is not None and rc < 0
                   and -rc in signal.Signals._value2member_map_ else f"exit status {rc}")
        why = "no progress for %gs (killed)" % args.hang_timeout if hung else signame
        tail = "".join(stderr_chunks)[-3000:]
        counts["crash"] += 1
        failures.append({"index": current, "status": "crash", "detail": f"{why}\n{tail}"})
        print(f"CRASH case {current} ({why}); reproduce with: python tools/fuzz.py --seed "
              f"{args.seed} --replay {current}", flush=True)
        index = current + 1
    elapsed = time.time() - start_time
    total = sum(counts.values())
    print(f"fuzz seed {args.seed}: {total} cases in {elapsed:.1f} s: {counts['ok']} ok, "
          f"{counts['rejected']} rejected (ValueError/TypeError), {counts['error']} errors, "
          f"{counts['crash']} crashes")
    for record in failures[:20]:
        print(f"--- case {record['index']} ({record['status']}); reproduce with: "
              f"python tools/fuzz.py --seed {args.seed} --replay {record['index']}")
        print(record["detail"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seed": args.seed, "cases": total, "seconds": elapsed, "counts": counts,
                       "failures": failures}, fh, indent=1)
    return 1 if counts["error"] or counts["crash"] else 0


def replay_main(args):
    """Run one case in this process, printing the configuration and the outcome."""
    sys.path.insert(0, TESTS)
    import faulthandler
    faulthandler.enable()
    call, names, descriptions = build_case(args.seed, args.replay, args.valid_fraction)
    print(f"case {args.replay} of seed {args.seed}: {call.cfg}")
    print(f"malformations: {descriptions or 'none (intact call)'}")
    sys.stdout.flush()
    status, detail = run_case(args.seed, args.replay, args.valid_fraction, not args.no_reference)
    print(f"status: {status}\n{detail}")
    return 0 if status != "error" else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=0,
                        help="number of cases (0: until --time runs out; default 0)")
    parser.add_argument("--time", type=float, default=0,
                        help="time budget in seconds (0: no limit; default 0, or 30 s when "
                             "--count is 0 too)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case generator")
    parser.add_argument("--valid-fraction", type=float, default=0.25,
                        help="fraction of intact (valid) cases, checked against the reference")
    parser.add_argument("--no-reference", action="store_true",
                        help="do not compare intact cases with lstmcy.reference")
    parser.add_argument("--hang-timeout", type=float, default=60.0,
                        help="seconds without progress after which a child counts as crashed")
    parser.add_argument("--malloc-check", action="store_true",
                        help="run children with glibc's malloc consistency checks")
    parser.add_argument("--json", help="write the summary and failures to this file")
    parser.add_argument("--replay", type=int, help="run only this case, in this process")
    parser.add_argument("-v", "--verbose", action="store_true", help="print errors as they occur")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=1e18, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.replay is not None:
        return replay_main(args)
    if not args.count and not args.time:
        args.time = 30.0
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
