"""Command line: ``python -m lstmcy check``."""
import argparse
import sys


def _check(args):
    from lstmcy._check import run_check
    return run_check(n_cases=args.cases, seed=args.seed)


def main(argv=None):
    """Entry point of the ``lstmcy`` console script."""
    parser = argparse.ArgumentParser(prog="lstmcy", description="Fast, exact LSTM backward on the CPU.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="compare gradients with the numpy reference (and PyTorch if installed)")
    check.add_argument("--cases", type=int, default=20, help="number of random configurations")
    check.add_argument("--seed", type=int, default=0)
    check.set_defaults(run=_check)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
