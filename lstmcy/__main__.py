"""Command line: ``python -m lstmcy {check,demo,bench}`` (also the ``lstmcy`` console script)."""
import argparse
import os
import subprocess
import sys

# Exit status when a command cannot run here (missing optional dependency or file).
EXIT_UNAVAILABLE = 2


def _check(args, extra):
    from lstmcy._cli.check import run_check
    return run_check(n_cases=args.cases, seed=args.seed)


def _demo(args, extra):
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("lstmcy demo needs scikit-learn: pip install scikit-learn "
              "(from lstmcy's checkout: pip install -e '.[sklearn]')", file=sys.stderr)
        return EXIT_UNAVAILABLE
    from lstmcy._cli.demo import run_demo
    result = run_demo(hidden_size=args.hidden_size, max_iter=args.max_iter,
                      learning_rate=args.learning_rate, batch_size=args.batch_size, seed=args.seed,
                      time_budget=args.time_budget, plot=None if args.no_plot else args.plot,
                      verbose=not args.quiet)
    if result["accuracy"] < args.target:
        print(f"Held-out accuracy {result['accuracy']:.2%} is below the target {args.target:.0%}")
        return 1
    print(f"Target reached: {result['accuracy']:.2%} >= {args.target:.0%}")
    return 0


def _benchmark_script():
    """``benchmarks/run.py`` of the source tree this package was imported from."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(package_dir), "benchmarks", "run.py")


def _bench(args, extra):
    script = args.suite or _benchmark_script()
    if not os.path.isfile(script):
        print(f"lstmcy bench needs the benchmark suite at {script}, which is not there: it ships "
              f"with the source tree, not with an installed wheel. Run it from a checkout of "
              f"the repository (pip install -e .).", file=sys.stderr)
        return EXIT_UNAVAILABLE
    command = [sys.executable, script] + ([] if args.full else ["--quick"]) + list(extra)
    print("Running " + " ".join(command), flush=True)
    return subprocess.call(command)


def build_parser():
    """The ``lstmcy`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="lstmcy", description="Fast, exact LSTM forward and backward on the CPU.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="compare gradients with the numpy reference (and PyTorch if installed)")
    check.add_argument("--cases", type=int, default=20, help="number of random configurations")
    check.add_argument("--seed", type=int, default=0)
    check.set_defaults(run=_check)

    demo = commands.add_parser(
        "demo", help="train LSTMClassifier on scikit-learn's digits (read row by row) and report "
                     "held-out accuracy")
    demo.add_argument("--hidden-size", type=int, default=64)
    demo.add_argument("--max-iter", type=int, default=30, help="maximum number of epochs")
    demo.add_argument("--learning-rate", type=float, default=0.01)
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--time-budget", type=float, default=50.0,
                      help="stop starting epochs after this many seconds (default 50)")
    demo.add_argument("--target", type=float, default=0.95,
                      help="held-out accuracy below which the exit status is 1 (default 0.95)")
    demo.add_argument("--plot", default="lstmcy_demo_loss.png",
                      help="loss curve PNG path, written when matplotlib is installed")
    demo.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    demo.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    demo.set_defaults(run=_demo)

    bench = commands.add_parser(
        "bench", help="quick run of the benchmark suite (benchmarks/run.py --quick); other "
                      "arguments are passed to run.py")
    bench.add_argument("--full", action="store_true", help="run the full suite, not --quick")
    bench.add_argument("--suite", metavar="RUN_PY",
                       help="the suite's script to run (default: benchmarks/run.py of the "
                            "source tree lstmcy is imported from)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv=None):
    """Entry point of the ``lstmcy`` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":
        parser.error("unrecognized arguments: " + " ".join(extra))
    return args.run(args, extra)


if __name__ == "__main__":
    sys.exit(main())
