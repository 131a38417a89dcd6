"""One training batch of LSTMClassifier beside one of skorch + nn.LSTM: where a fit's time goes.

``bench_estimators.py`` times whole fits. This script times what a fit repeats, one
training batch, in its parts, on the data of one of its datasets (default ``motions-20k``,
whose batches of 64 make the fit's time mostly the LSTM's):

* ``lstmcy LSTM``: ``lstm_forward`` (training) and ``lstm_backward`` (parameter gradients
  only) on one batch, as the estimator calls them;
* ``lstmcy batch``: all that LSTMClassifier does for one batch (the LSTM, the head, the
  loss, the L2 term, gradient clipping and the Adam update);
* ``torch LSTM``: ``nn.LSTM``'s forward and its backward from the last hidden state;
* ``torch batch``: the same model as a module (``nn.LSTM``, its last hidden state into
  ``nn.Linear``), cross-entropy, ``backward``, ``clip_grad_norm_`` and ``Adam.step``: what
  skorch runs for a batch, without skorch;
* ``skorch batch``: ``NeuralNetClassifier.train_step`` on the same batch (when skorch is
  installed), with the settings of ``bench_estimators.py``.

The five run in rounds whose order rotates, each after 50 ms of untimed calls (PyTorch's
OpenMP workers spin on after its calls), each call on the next batch of a shuffled epoch;
the table gives the medians over rounds, in ms per batch, and each one's ratio to
``lstmcy batch``. A fit's epoch is about its batches times the batch time plus the
validation pass, so the ratio of the batch times is what the fit's speed-up tends to at
many batches per epoch; the LSTM rows show how much of each batch is the recurrent layer
itself, and the GF/s of its forward and backward (``8 T B H (2 I + 3 H)``: forward
``8 T B H (I + H)``, and a backward without dx ``8 T B H (I + 2 H)``).

Usage (the OpenBLAS variables unset in this command only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/estimator_step.py \\
        [--dataset motions-20k] [--threads 1,2] [--rounds 41]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]  # this checkout's lstmcy, also when another one is installed
from _env import reexec_without_openblas_overrides  # noqa: E402  (no numpy import)

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import argparse  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

import lstmcy  # noqa: E402
from bench_estimators import (ALPHA, CLIP, HIDDEN, LEARNING_RATE, _channels_last,  # noqa: E402
                              load_dataset, skorch_inputs, training_plan)
from machine import machine_label  # noqa: E402
from timing import rotating_rounds  # noqa: E402

NAMES = ("lstmcy LSTM", "lstmcy batch", "torch LSTM", "torch batch", "skorch batch")


class Batches:
    """The training set's batches of one shuffled epoch, handed out in turn (cycling)."""

    def __init__(self, n_samples, batch_size, seed=0):
        order = np.random.default_rng(seed).permutation(n_samples)
        self.indices = [order[start:start + batch_size]
                        for start in range(0, n_samples - batch_size + 1, batch_size)]
        self.position = 0

    def next(self):
        index = self.indices[self.position % len(self.indices)]
        self.position += 1
        return index


def lstmcy_calls(X, y, plan, seed):
    """``lstmcy LSTM`` and ``lstmcy batch``: closures over a fitted-for-one-epoch estimator."""
    from lstmcy.estimators import LSTMClassifier

    clf = LSTMClassifier(max_iter=1, n_iter_no_change=None, random_state=seed)
    clf.fit(X, y)  # sets up the parameters, the optimiser and the checked data
    data = clf._validate_X(X, reset=False, dtype=clf.lstm_params_[0].dtype)
    codes = np.searchsorted(clf.classes_, y)
    weights = np.ones(len(y))
    params = clf._all_params()
    batches = Batches(len(y), plan["batch_size"], seed)

    def lstm():
        for part in data.batch(batches.next()).parts:
            out, h_n, _, cache = lstmcy.lstm_forward(
                part.input, None, clf.lstm_params_, train=True, batch_sizes=part.batch_sizes)
            dh = np.zeros_like(h_n)
            dh[-1] = 1.0
            lstmcy.lstm_backward(
                part.input, None, clf.lstm_params_, np.zeros_like(out), dh, None,
                *cache.saved(), batch_sizes=part.batch_sizes, train=True,
                output_mask=(False, False, False, True))

    def step():
        batch = data.batch(batches.next())
        index = batch.sample_index
        _, grads = clf._loss_and_grads(batch, codes[index], weights[index], None)
        clf._clip(grads)
        clf._optimizer.update(params, grads)

    return lstm, step


def torch_calls(X, y, plan, seed):
    """``torch LSTM``, ``torch batch`` and (with skorch) ``skorch batch``."""
    import torch

    torch.manual_seed(seed)
    x_all = torch.from_numpy(np.asarray(skorch_inputs(X, False)))
    classes, codes = np.unique(y, return_inverse=True)
    y_all = torch.from_numpy(codes.astype(np.int64))
    lstm = torch.nn.LSTM(x_all.shape[2], HIDDEN, batch_first=True)
    linear = torch.nn.Linear(HIDDEN, len(classes))
    decay = [p for name, p in lstm.named_parameters() if "weight" in name] + [linear.weight]
    no_decay = [p for name, p in lstm.named_parameters() if "bias" in name] + [linear.bias]
    optimizer = torch.optim.Adam([{"params": decay, "weight_decay": ALPHA / plan["batch_size"]},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=LEARNING_RATE)
    batches = Batches(len(y), plan["batch_size"], seed)

    def lstm_only():
        x = x_all[torch.from_numpy(batches.next())]
        _, (h_n, _) = lstm(x)
        h_n[-1].sum().backward()

    def step():
        index = torch.from_numpy(batches.next())
        optimizer.zero_grad()
        _, (h_n, _) = lstm(x_all[index])
        loss = torch.nn.functional.cross_entropy(linear(h_n[-1]), y_all[index])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(decay + no_decay, CLIP)
        optimizer.step()

    calls = {"torch LSTM": lstm_only, "torch batch": step}
    try:
        import skorch  # noqa: F401
    except ImportError:
        return calls
    from bench_estimators import skorch_net

    net = skorch_net(x_all.shape[2], len(classes), plan, seed)
    net.initialize()
    net.module_.train()

    def skorch_step():
        index = torch.from_numpy(batches.next())
        net.train_step((x_all[index], y_all[index]))

    calls["skorch batch"] = skorch_step
    return calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="motions-20k",
                        help="a dataset of bench_estimators.py whose series have one length")
    parser.add_argument("--threads", default="2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=41, help="timed rounds (default 41)")
    parser.add_argument("--repeats", type=int, default=10, help="batches per timed call")
    args = parser.parse_args(argv)
    import torch

    X, y, _, _, channels_first = load_dataset(args.dataset)
    series = _channels_last(X, channels_first)
    if len({len(s) for s in series}) != 1:
        raise SystemExit(f"{args.dataset}: its series differ in length; this script needs "
                         f"series of one length")
    X = np.stack(series)
    plan = training_plan(y)
    T, I = X.shape[1], X.shape[2]
    B, H = plan["batch_size"], HIDDEN
    gflop = 8.0 * T * B * H * (2 * I + 3 * H) / 1e9
    print(f"{machine_label()}; load average {os.getloadavg()[0]:.2f} at the start; "
          f"{args.dataset}: batches of {B} series of {T} steps, {I} channels, {H} units; "
          f"medians of {args.rounds} rotating rounds of {args.repeats} batches, ms per batch")
    print(f"{'threads':>7} | " + " | ".join(f"{name:>13}" for name in NAMES)
          + " | lstmcy LSTM GF/s")
    for n_threads in (int(n) for n in args.threads.split(",")):
        lstmcy.set_num_threads(n_threads)
        torch.set_num_threads(n_threads)
        lstm, step = lstmcy_calls(X, y, plan, seed=0)
        calls = {"lstmcy LSTM": lstm, "lstmcy batch": step, **torch_calls(X, y, plan, seed=0)}
        medians = {name: statistics.median(times) for name, times in
                   rotating_rounds(calls, args.rounds, args.repeats).items()}
        base = medians["lstmcy batch"]
        cells = [f"{medians[name]:>6.3f} ({medians[name] / base:.2f}x)" if name in medians
                 else f"{'-':>13}" for name in NAMES]
        print(f"{n_threads:>7} | " + " | ".join(cells)
              + f" | {gflop / medians['lstmcy LSTM'] * 1e3:>7.1f}", flush=True)
    lstmcy.set_num_threads(None)


if __name__ == "__main__":
    main()
