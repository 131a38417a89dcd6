"""Step-by-step calls: lstmcy against PyTorch where each call is one small time step.

Float32, input 16, hidden 32, side by side in one process (``timing.measure``): a stream of
inference steps (each step's states are the next one's input; gradients off around the
loop, as ``torch.no_grad`` around a stream does) through the numpy API (``lstm_forward``, ``LSTMPlan.step``) against
``nn.LSTMCell``; ``lstmcy.torch.LSTM`` against ``nn.LSTM`` at T=1; ``lstmcy.torch.LSTMCell``
against ``nn.LSTMCell``, one step and 20 steps unrolled forward and backward (B=1, B=32);
``lstmcy.torch.LSTM`` against ``nn.LSTM`` called on one step at a time for 20 steps,
forward and backward (a decoder's loop); a numpy training step at T=1. The report names the kernels that ran and the cores other
processes kept busy (a run under outside load is not valid for the targets). Run:
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_step.py``;
``--json benchmarks/results/<headline run>.json`` writes the run as that file's ``step``
section (RESULTS.md's "Step-by-step calls").
"""
import argparse
import datetime
import os

from _env import reexec_without_openblas_overrides

reexec_without_openblas_overrides(__name__)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lstmcy  # noqa: E402
import lstmcy.torch as lt  # noqa: E402
from lstmcy._engine.dispatch import kernels  # noqa: E402
import machine  # noqa: E402
from machine import cpu_snapshot, others_cores  # noqa: E402
from report import LOAD_LIMIT  # noqa: E402  (outside load above which targets are not graded)
from timing import measure  # noqa: E402

TITLE = "Step-by-step calls and the LSTM cell"
#: The ratios the issue asks for: (case, lstmcy's variant, PyTorch's, at least).
TARGETS = [
    ("numpy step", "lstmcy.lstm_forward", "nn.LSTMCell", 4.0),
    ("numpy step", "LSTMPlan.step", "nn.LSTMCell", 4.0),
    ("torch LSTM T=1", "lstmcy.torch.LSTM", "nn.LSTM", 5.0),
    ("torch cell", "lstmcy.torch.LSTMCell", "nn.LSTMCell", 2.0),
    ("unrolled B=1", "lstmcy.torch.LSTMCell", "nn.LSTMCell", 5.0),
    ("unrolled B=32", "lstmcy.torch.LSTMCell", "nn.LSTMCell", 5.0),
    ("unrolled LSTM T=1 B=1", "lstmcy.torch.LSTM", "nn.LSTM", None),  # no target: shown
]


#: The inference cases: measured with gradients off (``torch.no_grad`` around the loop).
INFERENCE = ("numpy step", "torch LSTM T=1", "torch cell")


def cases(I=16, H=32, steps=20):
    """name -> {variant: zero-argument callable}."""
    rng = np.random.default_rng(0)
    params = [(rng.standard_normal(s) * 0.1).astype(np.float32)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    x = rng.standard_normal((1, 1, I)).astype(np.float32)
    h = np.zeros((1, 1, H), np.float32)
    c = np.zeros((1, 1, H), np.float32)
    plan = lstmcy.LSTMPlan()
    torch.manual_seed(0)
    ref, cell = torch.nn.LSTMCell(I, H), lt.LSTMCell(I, H)
    cell.load_state_dict(ref.state_dict())
    xt, ht, ct = torch.randn(1, I), torch.zeros(1, H), torch.zeros(1, H)

    def stream(step, state):
        """One step of a stream: the states a step returns are the next step's input."""
        box = [state]

        def run():
            box[0] = step(box[0])
        return run

    def train_np():
        y, _, _, cache = lstmcy.lstm_forward(x, (h, c), params)
        cache.backward(y)

    out = {
        "numpy step": {
            "lstmcy.lstm_forward": stream(
                lambda s: lstmcy.lstm_forward(x, s, params, train=False)[1:3], (h, c)),
            "LSTMPlan.step": stream(lambda s: plan.step(x[0], s, params), (h[0], c[0])),
            "nn.LSTMCell": stream(lambda s: ref(xt, s), (ht, ct)),
        },
        "numpy train T=1": {"lstmcy.lstm_forward + backward": train_np},
    }
    torch.manual_seed(0)
    ref_lstm = torch.nn.LSTM(I, H)
    lstm = lt.LSTM(I, H)
    lstm.load_state_dict(ref_lstm.state_dict())
    x3, h3, c3 = torch.randn(1, 1, I), torch.zeros(1, 1, H), torch.zeros(1, 1, H)
    out["torch LSTM T=1"] = {
        "lstmcy.torch.LSTM": stream(lambda s: lstm(x3, s)[1], (h3, c3)),
        "nn.LSTM": stream(lambda s: ref_lstm(x3, s)[1], (h3, c3)),
    }
    out["torch cell"] = {
        "lstmcy.torch.LSTMCell": stream(lambda s: cell(xt, s), (ht, ct)),
        "nn.LSTMCell": stream(lambda s: ref(xt, s), (ht, ct)),
    }
    for B in (1, 32):
        xs = torch.randn(steps, B, I)

        def unrolled(module, xs=xs, B=B):
            def run():
                hh = cc = torch.zeros(B, H)
                for x_t in xs:
                    hh, cc = module(x_t, (hh, cc))
                hh.sum().backward()
            return run
        out[f"unrolled B={B}"] = {"lstmcy.torch.LSTMCell": unrolled(cell),
                                  "nn.LSTMCell": unrolled(ref)}
    # A decoder's loop: the LSTM module called on one time step at a time, with gradients.
    xs3 = torch.randn(steps, 1, 1, I)

    def unrolled_lstm(module):
        def run():
            state = (torch.zeros(1, 1, H), torch.zeros(1, 1, H))
            for x_t in xs3:
                y, state = module(x_t, state)
            (y.sum() + state[1].sum()).backward()
        return run
    out["unrolled LSTM T=1 B=1"] = {"lstmcy.torch.LSTM": unrolled_lstm(lstm),
                                    "nn.LSTM": unrolled_lstm(ref_lstm)}
    return out


def _openblas_cores():
    import threadpoolctl
    return ", ".join(sorted({f"{e.get('internal_api')} {e.get('architecture')}"
                             for e in threadpoolctl.threadpool_info()
                             if e.get("user_api") == "blas"}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("--out", default=None, help="also write the Markdown report here")
    parser.add_argument("--json", default=None,
                        help="also write the run as this JSON file's step section (the "
                             "headline run's file)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch's intra-op threads (default 1: the steps are far too "
                             "small for more, and on a loaded machine its spinning team "
                             "only slows it down)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    stamp = machine.result_stamp()
    before = cpu_snapshot()
    results = {}
    for name, calls in cases().items():
        # Inference steps run as a stream does: in a loop under no_grad.
        with torch.set_grad_enabled(name not in INFERENCE):
            timed = measure(calls, repeats=args.repeats, min_time=args.min_time)
        results[name] = {variant: {"median": r["median"], "iqr": r["iqr"]}
                         for variant, r in timed.items()}
    meta = {
        "command": (f"python benchmarks/bench_step.py --repeats {args.repeats} "
                    f"--torch-threads {args.torch_threads}"
                    + (f" (`LSTMCY_KERNELS={os.environ['LSTMCY_KERNELS']}`)"
                       if os.environ.get("LSTMCY_KERNELS") else "")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "lstmcy": stamp["lstmcy"], "machine": stamp["machine"],
        "kernels": kernels.__name__, "blas": _openblas_cores(),
        "torch": (f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
                  f"{torch.backends.cpu.get_cpu_capability()}"),
        "outside_load": others_cores(before, cpu_snapshot())}
    text = markdown(results, meta)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    if args.json:
        machine.update_result_file(args.json, step={"meta": meta, "results": results})


def markdown(results, meta, heading=f"# {TITLE}"):
    """The run as Markdown: machine, kernels, load, the times and the target ratios."""
    load = meta["outside_load"]
    lines = [heading, "",
             f"Measured with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE {meta['command']}`"
             f", {meta['date']}, lstmcy {meta['lstmcy']}.", "",
             f"- machine: {meta['machine']}",
             f"- lstmcy kernels: `{meta['kernels']}`; BLAS (threadpoolctl): {meta['blas']}",
             f"- {meta['torch']}",
             "- outside load: " + ("unknown" if load is None else
                                   f"{load:.2f} cores kept busy by other processes")
             + (" — **under outside load: not valid for the targets**"
                if load is None or load > LOAD_LIMIT else ""),
             "", "Inference cases are streams (each step's states are the next one's input, "
             "gradients off around the loop); the unrolled cases train 20 steps forward and "
             "backward.", "",
             "| case | variant | median µs | IQR µs |", "|---|---|---|---|"]
    for name, by_variant in results.items():
        for variant, r in by_variant.items():
            lines.append(f"| {name} | {variant} | {r['median'] * 1e6:.1f} | "
                         f"{r['iqr'] * 1e6:.1f} |")
    lines += ["", "| case | speed-up (PyTorch / lstmcy, same-run medians) | target | met |",
              "|---|---|---|---|"]
    for name, ours, theirs, target in TARGETS:
        if name not in results:  # a run from before the case was added
            continue
        ratio = results[name][theirs]["median"] / results[name][ours]["median"]
        if target is None:
            lines.append(f"| {name} | {theirs} / {ours} = {ratio:.2f}x | - | - |")
            continue
        lines.append(f"| {name} | {theirs} / {ours} = {ratio:.2f}x | >= {target:g}x | "
                     f"{'yes' if ratio >= target else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
