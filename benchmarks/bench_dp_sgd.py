"""One DP-SGD step (Opacus, per-sample clipping and noise) with ``lstmcy.torch.LSTM``
against Opacus's ``DPLSTM``, and against non-private steps.

An LSTM classifier (a linear head on ``h_n``, cross-entropy), every model from the same
weights on the same batch; a step is ``zero_grad``, forward, loss, backward,
``optimizer.step()``. Private steps: ``PrivacyEngine.make_private`` with
``grad_sample_mode`` ``hooks`` (per-sample gradients formed) or ``ghost`` (their norms,
then a second backward of the reweighted loss), for lstmcy and for ``DPLSTM``; plain SGD
for lstmcy and ``nn.LSTM``. Rotating rounds (``timing.measure``); the report gives median
ms per step and same-round ratios. Run::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_dp_sgd.py
    python benchmarks/bench_dp_sgd.py --json benchmarks/results/<headline run>.json

``--json`` writes the run as the ``dp_sgd`` section of that file (its other sections kept),
which ``report.py --results-md`` renders.
"""
import argparse
import datetime
import statistics
import sys
import warnings

from _env import reexec_without_openblas_overrides  # (no numpy import)

reexec_without_openblas_overrides(__name__)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import machine  # noqa: E402
from timing import measure  # noqa: E402

SHAPES = [(50, 64, 32, 128), (50, 128, 64, 256)]  # (T, B, I, H)
TITLE = "DP-SGD step with Opacus: lstmcy.torch.LSTM against Opacus's DPLSTM"


class Classifier(nn.Module):
    def __init__(self, lstm, hidden, classes=4):
        super().__init__()
        self.lstm = lstm
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        _, (h_n, _) = self.lstm(x)
        return self.fc(h_n[-1])


def _steps(shape, seed=0):
    """name -> a function running one training step, all on the same weights and batch."""
    import opacus
    from opacus.layers import DPLSTM

    from lstmcy.torch import LSTM

    T, B, I, H = shape
    torch.manual_seed(seed)
    base = Classifier(LSTM(I, H, batch_first=True), H)
    lstm_state, fc_state = base.lstm.state_dict(), base.fc.state_dict()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, I, generator=gen)
    y = torch.randint(0, 4, (B,), generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=B)

    def same_weights(lstm):
        lstm.load_state_dict(lstm_state)  # DPLSTM renames nn.LSTM's keys itself
        model = Classifier(lstm, H)
        model.fc.load_state_dict(fc_state)
        return model

    def private(lstm, mode="hooks"):
        model = same_weights(lstm)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # secure RNG, accountant
            made = opacus.PrivacyEngine().make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                max_grad_norm=1.0, poisson_sampling=False, grad_sample_mode=mode,
                criterion=nn.CrossEntropyLoss())
        # ghost: (module, optimizer, criterion, loader), the criterion runs both backwards
        return made[0], made[1], (made[2] if mode == "ghost" else nn.CrossEntropyLoss())

    def plain(lstm):
        model = same_weights(lstm)
        return model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()

    def step_of(model, optimizer, criterion):
        def step():
            optimizer.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
            optimizer.step()
        return step

    return {"lstmcy DP": step_of(*private(LSTM(I, H, batch_first=True))),
            "lstmcy ghost": step_of(*private(LSTM(I, H, batch_first=True), "ghost")),
            "DPLSTM DP": step_of(*private(DPLSTM(I, H, batch_first=True))),
            "DPLSTM ghost": step_of(*private(DPLSTM(I, H, batch_first=True), "ghost")),
            "lstmcy": step_of(*plain(LSTM(I, H, batch_first=True))),
            "nn.LSTM": step_of(*plain(nn.LSTM(I, H, batch_first=True)))}


def _ratio(times, num, den):
    """Median of the same-round ratios ``num / den``."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def run(shape, rounds):
    steps = _steps(shape)
    before = machine.cpu_snapshot()
    times = measure(steps, repeats=rounds, warm_time=0.0, number=1)
    return {"shape": shape, "times": {k: [s * 1e3 for s in t["samples"]] for k, t in times.items()},
            "others_cores": machine.others_cores(before, machine.cpu_snapshot())}


def print_samples(result):
    """Each step's per-round times (ms), for the record."""
    for name, samples in result["times"].items():
        print(f"{tuple(result['shape'])} {name}: " + " ".join(f"{v:.1f}" for v in samples))


MODES = [("hooks", "DP"), ("ghost", "ghost")]  # (Opacus's grad_sample_mode, step name suffix)


def markdown(results, argv, heading=f"# {TITLE}", meta=None):
    """The Markdown table of ``results`` (:func:`run`'s), run as ``argv``; ``meta`` (the
    JSON file's) adds where and when."""
    if meta is None:
        where = f"{machine.machine_label()}, torch {torch.__version__} ({torch.get_num_threads()} threads)"
    else:
        where = (f"{meta['date']}, lstmcy {meta['lstmcy']}, {meta['machine']}, torch "
                 f"{meta['torch']} ({meta['threads']} threads), opacus {meta['opacus']}, load "
                 f"average {meta['load_before']} before and {meta['load_after']} after")
    lines = [heading, "",
             f"`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python {' '.join(argv)}`; "
             f"{where}.", "",
             "One step: zero_grad, forward, cross-entropy on a linear head over h_n, backward, "
             "optimizer step. DP: `PrivacyEngine.make_private` with `grad_sample_mode` "
             "`hooks` (per-sample gradients formed) or `ghost` (their norms only, and a "
             "second backward of the reweighted loss); per-sample clipping to norm 1, noise "
             "multiplier 1. Median ms per step over the rounds; ratios are medians of "
             "same-round ratios.", "",
             "| (T, B, I, H) | mode | lstmcy DP | DPLSTM DP | lstmcy (no DP) | nn.LSTM (no DP) "
             "| DPLSTM DP / lstmcy DP | lstmcy DP / lstmcy | outside load (cores) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = {k: statistics.median(v) for k, v in r["times"].items()}
        load = r["others_cores"]
        for mode, suffix in MODES:
            ours, theirs = f"lstmcy {suffix}", f"DPLSTM {suffix}"
            lines.append(f"| {tuple(r['shape'])} | {mode} | {t[ours]:.1f} | {t[theirs]:.0f} | "
                         f"{t['lstmcy']:.1f} | {t['nn.LSTM']:.1f} | "
                         f"{_ratio(r['times'], theirs, ours):.1f}x | "
                         f"{_ratio(r['times'], ours, 'lstmcy'):.2f}x | "
                         f"{'-' if load is None else f'{load:.1f}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--shape", action="append", default=None,
                        help="T,B,I,H (repeatable; default: " + " and ".join(map(str, SHAPES)) + ")")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None,
                        help="also write the run as this JSON file's dp_sgd section")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] if args.shape else SHAPES
    stamp = machine.result_stamp()
    results = []
    for shape in shapes:
        results.append(run(shape, args.rounds))
        print_samples(results[-1])
        print(markdown(results, sys.argv), flush=True)
    if args.json:
        import opacus
        meta = {"argv": sys.argv, "date": datetime.datetime.now(datetime.timezone.utc)
                .strftime("%Y-%m-%d %H:%M UTC"), "lstmcy": stamp["lstmcy"],
                "machine": stamp["machine"], "torch": torch.__version__,
                "opacus": opacus.__version__, "threads": torch.get_num_threads(),
                "load_before": stamp["load"], "load_after": machine.result_stamp()["load"]}
        machine.update_result_file(args.json, dp_sgd={"meta": meta, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
