#!/usr/bin/env python
"""LSTMClassifier's defaults against skorch + torch.nn.LSTM with the same settings.

Usage (docs/benchmarks.md: what each run measures and where it goes)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE nice -n 15 python benchmarks/bench_estimators.py
    python benchmarks/bench_estimators.py --datasets BasicMotions,digits --seeds 2
    python benchmarks/bench_estimators.py --ragged        # one long sequence among short ones
    python benchmarks/bench_estimators.py --timeseries    # sktime's and aeon's classifiers
    python benchmarks/bench_estimators.py --timeseries --kinds lstmcy   # rerun some rows

Needs torch and the ``bench`` extra (skorch; sktime, whose wheel ships the UCR/UEA sets;
numba). For every dataset and seed, a default ``LSTMClassifier(random_state=seed)`` and a
skorch ``NeuralNetClassifier`` with the same model and training settings (the constants
below), both reading the series in the patches of ``patch_size='auto'``, are fitted, each
in a fresh worker process, the order alternating. ``--ragged`` times and measures the
memory of ragged data against equal lengths; ``--timeseries`` fits lstmcy's sktime and aeon
classifiers beside MiniRocket, an interval and a dictionary classifier, twice per fresh
process (numba's compilation counted on the first fit); ``--kinds`` keeps the other
classifiers' records. Every run goes into ``benchmarks/results/estimators.json`` (or
``--out``; its own section, the others kept), which ``report.py --estimators`` renders.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this checkout's lstmcy (also when another one is installed) and its tests' data loaders
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "tests")]
from _env import reexec_without_openblas_overrides  # noqa: E402  (no numpy import)

if __name__ == "__main__":
    reexec_without_openblas_overrides()

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import machine  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "estimators.json")
UCR = ("BasicMotions", "JapaneseVowels", "ItalyPowerDemand", "GunPoint")
DATASETS = UCR + ("digits", "motions-20k")

# The shared settings: LSTMClassifier's defaults, spelled out for skorch.
HIDDEN = 64
LEARNING_RATE = 1e-3
ALPHA = 1e-4
CLIP = 5.0
MAX_EPOCHS = 200
PATIENCE = 10  # n_iter_no_change: stop once the count of epochs without improvement exceeds it
TOL = 1e-4
VALIDATION_FRACTION = 0.1


# --------------------------------------------------------------------------- data

def load_dataset(name):
    """``(X_train, y_train, X_test, y_test, channels_first)``.

    UCR/UEA data comes as sktime gives it: a 3-D ``(n, channels, timepoints)`` array, or
    a list of ``(channels, timepoints_i)`` arrays for variable lengths.
    """
    if name in UCR:
        from timeseries_data import packaged
        return (*packaged(name, "train"), *packaged(name, "test"), True)
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        digits = load_digits()
        X_train, X_test, y_train, y_test = train_test_split(
            digits.images / 16.0, digits.target, test_size=0.25, random_state=0,
            stratify=digits.target)
        return X_train, y_train, X_test, y_test, False
    if name == "motions-20k":
        from estimator_helpers import motions
        return (*motions(20000, seed=0), *motions(5000, seed=1), False)
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def describe(X, channels_first):
    """``(channels, min length, max length)`` of a dataset."""
    arrays = _channels_last(X, channels_first)
    return arrays[0].shape[1], min(len(a) for a in arrays), max(len(a) for a in arrays)


def training_plan(X, y, channels_first):
    """Batch size, early stopping and patches of ``LSTMClassifier()`` on ``X`` and ``y``."""
    from lstmcy.estimators._base import _AUTO_MIN_VALIDATION, auto_batch_size, auto_patch_size
    n = len(y)
    n_validation = math.ceil(VALIDATION_FRACTION * n)
    _, counts = np.unique(y, return_counts=True)
    holds_out = (n_validation >= _AUTO_MIN_VALIDATION and counts.min() >= 2
                 and min(n_validation, n - n_validation) >= len(counts))
    n_train = n - n_validation if holds_out else n
    lengths = [len(a) for a in _channels_last(X, channels_first)]
    return {"batch_size": auto_batch_size(n_train), "early_stopping": holds_out,
            "patch_size": auto_patch_size(lengths)}


# --------------------------------------------------------------------------- workers

def fit_lstmcy(X, y, seed, channels_first, plan):
    from lstmcy.estimators import LSTMClassifier
    clf = LSTMClassifier(channels_first=channels_first, random_state=seed)
    start = time.perf_counter()
    clf.fit(X, y)
    seconds = time.perf_counter() - start
    assert (clf.validation_scores_ is not None) == plan["early_stopping"]
    assert clf.patch_size_ == plan["patch_size"]
    return clf, seconds, clf.n_iter_


def _channels_last(X, channels_first):
    arrays = [np.asarray(x, dtype=np.float32) for x in X]
    return [a.T if channels_first else a for a in arrays]


def _patches(array, k):
    """``array [T, F]`` in patches of ``k`` time steps, as LSTMClassifier's ``patch_size``:
    ``[ceil(T / k), k * F]``, the last patch completed by repeating the last step."""
    array = np.concatenate([array, np.repeat(array[-1:], -len(array) % k, axis=0)])
    return array.reshape(len(array) // k, k * array.shape[1])


def skorch_inputs(X, channels_first, patch_size=1):
    """A 3-D float32 array, or ``{"x": zero-padded array, "lengths": ...}`` for ragged data,
    in patches of ``patch_size`` time steps."""
    arrays = [_patches(a, patch_size) for a in _channels_last(X, channels_first)]
    lengths = np.array([len(a) for a in arrays])
    if (lengths == lengths[0]).all():
        return np.stack(arrays)
    padded = np.zeros((len(arrays), lengths.max(), arrays[0].shape[1]), dtype=np.float32)
    for i, a in enumerate(arrays):
        padded[i, :len(a)] = a
    return {"x": padded, "lengths": lengths}


def skorch_net(input_size, n_classes, plan, seed):
    """skorch's NeuralNetClassifier of the shared model and settings (not yet initialised)."""
    import torch
    from skorch import NeuralNetClassifier
    from skorch.callbacks import Callback, GradientNormClipping
    from skorch.dataset import ValidSplit

    class StopLikeLSTMClassifier(Callback):
        """LSTMClassifier's (and MLP's) rule: the best loss is the lowest so far, an epoch
        improves on it by more than ``TOL`` or counts, and training stops once the count
        exceeds ``PATIENCE``; with a validation set, the lowest epoch's parameters are
        restored. (skorch's EarlyStopping measures from the last improvement instead, so
        it runs on through slow declines.)"""

        def __init__(self, monitor, restore):
            self.monitor, self.restore = monitor, restore

        def initialize(self):
            self.best, self.count, self.state = np.inf, 0, None
            return self

        def on_epoch_end(self, net, **kwargs):
            loss = net.history[-1, self.monitor]
            self.count = 0 if loss < self.best - TOL else self.count + 1
            if loss < self.best:
                self.best = loss
                if self.restore:
                    self.state = {k: v.clone() for k, v in net.module_.state_dict().items()}
            if self.count > PATIENCE:
                raise KeyboardInterrupt  # skorch's way to end training early

        def on_train_end(self, net, **kwargs):
            if self.state is not None:
                net.module_.load_state_dict(self.state)

    class LSTMHead(torch.nn.Module):
        def __init__(self, input_size, n_classes):
            super().__init__()
            self.lstm = torch.nn.LSTM(input_size, HIDDEN, batch_first=True)
            self.linear = torch.nn.Linear(HIDDEN, n_classes)

        def forward(self, x, lengths=None):
            if lengths is not None:
                x = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                            enforce_sorted=False)
            _, (h_n, _) = self.lstm(x)
            return self.linear(h_n[-1])

    torch.manual_seed(seed)
    early_stopping = plan["early_stopping"]
    return NeuralNetClassifier(
        LSTMHead, module__input_size=input_size, module__n_classes=n_classes,
        criterion=torch.nn.CrossEntropyLoss, optimizer=torch.optim.Adam, lr=LEARNING_RATE,
        # LSTMClassifier's L2 term: alpha / batch_size * W in the gradient, not on biases
        optimizer__weight_decay=ALPHA / plan["batch_size"],
        optimizer__param_groups=[("*bias*", {"weight_decay": 0.0})],
        batch_size=plan["batch_size"], max_epochs=MAX_EPOCHS, iterator_train__shuffle=True,
        train_split=(ValidSplit(VALIDATION_FRACTION, stratified=True, random_state=seed)
                     if early_stopping else None),
        callbacks=[GradientNormClipping(CLIP),
                   StopLikeLSTMClassifier("valid_loss" if early_stopping else "train_loss",
                                          restore=early_stopping)],
        verbose=0, device="cpu")


def fit_skorch(X, y, seed, channels_first, plan):
    inputs = skorch_inputs(X, channels_first, plan["patch_size"])
    input_size = (inputs["x"] if isinstance(inputs, dict) else inputs).shape[2]
    classes, codes = np.unique(y, return_inverse=True)
    net = skorch_net(input_size, len(classes), plan, seed)
    start = time.perf_counter()
    net.fit(inputs, codes.astype(np.int64))
    seconds = time.perf_counter() - start

    class Predictor:
        def score(self, X_test, y_test):
            predicted = classes[net.predict(skorch_inputs(X_test, channels_first,
                                                          plan["patch_size"]))]
            return float(np.mean(predicted == y_test))

    return Predictor(), seconds, len(net.history)


def worker(library, dataset, seed, threads):
    """Fit one model; print one JSON line with accuracy, fit time, epochs and load."""
    if threads:
        if library == "lstmcy":
            import lstmcy
            lstmcy.set_num_threads(threads)
        else:
            import torch
            torch.set_num_threads(threads)
    X_train, y_train, X_test, y_test, channels_first = load_dataset(dataset)
    plan = training_plan(X_train, y_train, channels_first)
    fit = fit_lstmcy if library == "lstmcy" else fit_skorch
    before = machine.cpu_snapshot()
    model, seconds, epochs = fit(X_train, y_train, seed, channels_first, plan)
    others = machine.others_cores(before, machine.cpu_snapshot())
    accuracy = float(model.score(X_test, y_test))
    print(json.dumps({"library": library, "dataset": dataset, "seed": seed, "accuracy": accuracy,
                      "fit_seconds": seconds, "epochs": epochs, "others_cores": others,
                      "loadavg": os.getloadavg()[0], **plan}))


# --------------------------------------------------------------------------- driver

def summarise(records, dataset):
    out = {}
    for library in ("lstmcy", "skorch"):
        rows = [r for r in records if r["dataset"] == dataset and r["library"] == library]
        accuracy = np.array([r["accuracy"] for r in rows])
        out[library] = {"accuracy": accuracy.mean(), "accuracy_sd": accuracy.std(),
                        "accuracies": accuracy, "seconds": np.median([r["fit_seconds"] for r in rows]),
                        "epochs": np.median([r["epochs"] for r in rows]),
                        "per_epoch": np.median([r["fit_seconds"] / r["epochs"] for r in rows])}
    paired = {(r["seed"], r["library"]): r["fit_seconds"] for r in records if r["dataset"] == dataset}
    seeds = sorted({seed for seed, _ in paired})
    out["ratios"] = [paired[s, "skorch"] / paired[s, "lstmcy"] for s in seeds]
    out["speedup"] = out["skorch"]["seconds"] / out["lstmcy"]["seconds"]
    return out


def versions(threads):
    import sklearn
    import skorch
    import sktime
    import torch

    import lstmcy
    return (f"lstmcy {lstmcy.__version__}, torch {torch.__version__}, threads "
            f"{threads or 'default'} (torch's default: {torch.get_num_threads()}), skorch "
            f"{skorch.__version__}, scikit-learn "
            f"{sklearn.__version__}, sktime {sktime.__version__}, numpy {np.__version__}")


def run_meta(argv):
    """The command as run (under nice or not), the date and this checkout's commit."""
    niceness = os.nice(0)
    state = machine.git_state(ROOT)
    return {"command": "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
                       + (f"nice -n {niceness} " if niceness else "")
                       + "python benchmarks/bench_estimators.py" + "".join(f" {a}" for a in argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": state["commit"][:7] if state else "unknown"}


def outside_load(records, during, cpus, meta, verdicts):
    """The sentences on the cores other processes kept busy during the records' ``during``
    (with ``meta``, the load average at the start and the end), and ``verdicts[0]`` when
    the median is 0.3 cores or more, else ``verdicts[1]``."""
    others = [r["others_cores"] for r in records if r.get("others_cores") is not None]
    text = (f"Outside load: other processes kept {np.median(others):.1f} cores busy during the "
            f"median {during} (from {min(others):.1f} to {max(others):.1f}; the machine has "
            f"{cpus})")
    if meta:
        text += (f"; load average {meta['loadavg_start']:.2f} at the start and "
                 f"{meta['loadavg_end']:.2f} at the end")
    return f"{text}. " + verdicts[0 if np.median(others) >= 0.3 else 1]


TITLE = "Estimators: LSTMClassifier's defaults against skorch + torch.nn.LSTM"


def estimators_markdown(records, datasets, meta, heading="## " + TITLE):
    """The run's Markdown: the command, the settings, a table row per dataset and the
    outside load (``heading`` on top, none when empty)."""
    lines = [heading, ""] if heading else []
    # runs before patch_size='auto' read every time step alone (no patch_size in their plan)
    patched = any("patch_size" in meta["datasets"][d] for d in datasets)
    lines += [
        f"`{meta['command']}` — {meta['date']}, lstmcy {meta['commit']}, {meta['seeds']} seeds per "
        f"dataset ({meta['large_seeds']} for motions-20k), each fit in its own process. "
        f"{meta['versions']}.",
        "",
        "Both sides fit the same model (one LSTM layer of 64 units"
        + (" reading the patches of `patch_size='auto'`" if patched else "")
        + ", its last hidden state into a linear layer) with the same "
        "settings, LSTMClassifier's defaults: Adam at 1e-3, the batch "
        "size of `batch_size='auto'`, gradient clipping at 5, the L2 term, and 10 epochs without "
        "improvement (validation loss on a held-out, stratified 10 % and the best epoch restored "
        "where `early_stopping='auto'` holds one out; else the training loss), at most 200 "
        "epochs. Accuracy on the dataset's test split: mean ± standard deviation over seeds. "
        "Fit time: median over seeds; speed-up: skorch's median over lstmcy's (per-seed ratios "
        "in brackets); the two stop on the same rule (skorch through a callback that applies "
        "LSTMClassifier's), but not after the same number of epochs, so the median time per "
        "epoch is shown too.",
        "",
        "| dataset | train / test | channels × steps | classes | batch, early stopping"
        + (", patch" if patched else "") + " | "
        "lstmcy accuracy | skorch accuracy | lstmcy fit | skorch fit | speed-up | "
        "epochs (lstmcy / skorch) | per epoch (lstmcy / skorch) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dataset in datasets:
        info = meta["datasets"][dataset]
        s = summarise(records, dataset)
        steps = (f"{info['min_len']}" if info["min_len"] == info["max_len"]
                 else f"{info['min_len']}–{info['max_len']}")
        plan = f"{info['batch_size']}, {'yes' if info['early_stopping'] else 'no'}" + (
            f", {info['patch_size']}" if patched else "")
        ratios = ", ".join(f"{r:.1f}" for r in s["ratios"])
        lines.append(
            f"| {dataset} | {info['n_train']} / {info['n_test']} | {info['channels']} × {steps} | "
            f"{info['classes']} | {plan} | {s['lstmcy']['accuracy']:.3f} ± "
            f"{s['lstmcy']['accuracy_sd']:.3f} | {s['skorch']['accuracy']:.3f} ± "
            f"{s['skorch']['accuracy_sd']:.3f} | {s['lstmcy']['seconds']:.1f} s | "
            f"{s['skorch']['seconds']:.1f} s | **{s['speedup']:.1f}×** ({ratios}) | "
            f"{s['lstmcy']['epochs']:.0f} / {s['skorch']['epochs']:.0f} | "
            f"{1e3 * s['lstmcy']['per_epoch']:.0f} / {1e3 * s['skorch']['per_epoch']:.0f} ms |")
    lines += ["", outside_load(records, "fit", meta.get("cpus", "?"), meta, (
        "The machine was under outside load: the times are not a clean measurement, and "
        "a burst hits whichever fit runs at the time.", "The machine was quiet."))]
    if "timeseries" in meta:
        lines += ["", timeseries_markdown(meta["timeseries"])]
    return "\n".join(lines)


# --------------------------------------------------------------------------- sktime and aeon

TS_TITLE = "sktime and aeon: lstmcy beside MiniRocket, an interval and a dictionary classifier"
TS_DATASETS = ("BasicMotions", "JapaneseVowels", "GunPoint", "ArrowHead", "ItalyPowerDemand")
TS_ROUTES = {  # kind: (module.Class, parameters besides random_state and n_jobs)
    "sktime": {"lstmcy": ("lstmcy.sktime.LSTMClassifier", {}),
               "MiniRocket": ("sktime.classification.kernel_based.RocketClassifier",
                              {"rocket_transform": "minirocket"}),
               "interval": ("sktime.classification.interval_based.TimeSeriesForestClassifier",
                            {}),
               "dictionary": ("sktime.classification.dictionary_based.MUSE", {})},
    "aeon": {"lstmcy": ("lstmcy.aeon.LSTMClassifier", {}),
             "MiniRocket": ("aeon.classification.convolution_based.MiniRocketClassifier", {}),
             "interval": ("aeon.classification.interval_based.TimeSeriesForestClassifier", {}),
             "dictionary": ("aeon.classification.dictionary_based.MUSE", {})}}
AEON_PYTHON = os.path.join(os.environ.get("TMPDIR") or "/tmp", "lstmcy-aeon-venv/bin/python")


def ts_worker(route, kind, dataset, seed):
    """Fit one classifier twice in this process, score the second: one JSON line."""
    import importlib

    from timeseries_data import packaged
    path, params = TS_ROUTES[route][kind]
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    params = dict(params, random_state=seed, **({"n_jobs": -1} if "n_jobs" in
                                                 cls().get_params() else {}))
    (X, y), (X_test, y_test) = packaged(dataset, "train"), packaged(dataset, "test")
    if isinstance(X, list) and cls.get_class_tag("capability:unequal_length"):
        if route == "sktime":  # as its loader gives them: nested DataFrames
            from sktime.datasets import load_UCR_UEA_dataset
            X, X_test = (load_UCR_UEA_dataset(dataset, split=s)[0] for s in ("train", "test"))
    elif isinstance(X, list):  # zeros after the end, as sktime's PaddingTransformer
        n = max(x.shape[1] for x in X + X_test)
        X, X_test = (np.stack([np.pad(x, ((0, 0), (0, n - x.shape[1]))) for x in Xs])
                     for Xs in (X, X_test))
    make = lambda: cls(**params)  # noqa: E731
    if (isinstance(X, np.ndarray) and X.shape[1] > 1
            and not cls.get_class_tag("capability:multivariate")):
        from sktime.transformations.colconcat import ColumnConcatenator  # channels end to end
        make = lambda: ColumnConcatenator() * cls(**params)  # noqa: E731
    before, seconds = machine.cpu_snapshot(), []
    for _ in range(2):
        clf, start = make(), time.perf_counter()
        clf.fit(X, y)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({
        "route": route, "kind": kind, "name": name, "dataset": dataset, "seed": seed,
        "accuracy": float(np.mean(clf.predict(X_test) == y_test)), "first_fit": seconds[0],
        "fit": seconds[1], "others_cores": machine.others_cores(before, machine.cpu_snapshot()),
        "version": f"{route} {importlib.import_module(route).__version__}"}))


def timeseries_markdown(ts):
    """The ``--timeseries`` run's Markdown (a subsection of the estimators section)."""
    records, routes = ts["records"], sorted({r["route"] for r in ts["records"]}, reverse=True)
    datasets = [d for d in TS_DATASETS if d in {r["dataset"] for r in records}]

    def cell(route, kind, dataset):
        rows = [r for r in records
                if (r["route"], r["kind"], r["dataset"]) == (route, kind, dataset)]
        return {"name": rows[0]["name"], "accuracy": np.mean([r["accuracy"] for r in rows]),
                "sd": np.std([r["accuracy"] for r in rows]),
                **{k: np.median([r[k] for r in rows]) for k in ("first_fit", "fit")}}

    def seconds(x):
        return f"{x:.2f}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"

    lines = [
        f"### {TS_TITLE}", "",
        f"`{ts['command']}` — {ts['date']}, lstmcy {ts['commit']}, {ts['machine']} "
        f"({'AVX-512' if 'avx512f' in ts['machine'] else 'AVX2 only'}), {ts['seeds']} seeds. "
        f"{', '.join(sorted({r['version'] for r in records}))}.", "",
        "Each library's classifiers with their defaults (`n_jobs=-1` where they take it, as "
        "lstmcy uses all cores; sktime's MiniRocket is `RocketClassifier(rocket_transform="
        "'minirocket')`) on the datasets sktime and aeon package, with their own "
        "train/test splits; JapaneseVowels zero-padded to its longest series for all but "
        "lstmcy, sktime's univariate TimeSeriesForestClassifier reading the channels end to "
        "end (`ColumnConcatenator`). Accuracy: mean ± standard deviation over seeds. Fit: "
        "median over seeds of the first fit in a fresh process with an empty numba cache "
        "(what a user sees on first use, numba's compilation included) / of a second fit in "
        "that process."] + ([
        "", f"The {', '.join(ts['rerun']['kinds'])} rows were rerun alone: "
            f"`{ts['rerun']['command']}` — {ts['rerun']['date']}, lstmcy {ts['rerun']['commit']}; "
            f"the others are from the run above."] if "rerun" in ts else []) + ["",
        "| dataset | classifier | " + " | ".join(f"{r} accuracy | {r} fit" for r in routes)
        + " |", "| --- | --- |" + " --- | --- |" * len(routes)]
    for dataset in datasets:
        for kind in TS_ROUTES["sktime"]:
            cells = [cell(route, kind, dataset) for route in routes]
            names = " / ".join(dict.fromkeys(c["name"] for c in cells))
            lines.append(f"| {dataset} | {kind}: {names} | "
                         + " | ".join(f"{c['accuracy']:.3f} ± {c['sd']:.3f} | "
                                      f"{seconds(c['first_fit'])} / {seconds(c['fit'])} s"
                                      for c in cells) + " |")
    lines += ["", "Target: accuracy within 0.03 of MiniRocket's on the multivariate sets with a "
                  "fit at least as fast (first fits / later fits):", ""]
    for dataset, route in [(d, r) for d in datasets if d in TS_DATASETS[:2] for r in routes]:
        ours, rocket = cell(route, "lstmcy", dataset), cell(route, "MiniRocket", dataset)
        verdict = ["met" if ok else "**missed**" for ok in (
            ours["accuracy"] >= rocket["accuracy"] - 0.03,
            ours["first_fit"] <= rocket["first_fit"], ours["fit"] <= rocket["fit"])]
        lines.append(
            f"- {dataset}, {route}: accuracy {ours['accuracy']:.3f} against "
            f"{rocket['accuracy']:.3f} ({verdict[0]}); fit {seconds(ours['first_fit'])} / "
            f"{seconds(ours['fit'])} s against {seconds(rocket['first_fit'])} / "
            f"{seconds(rocket['fit'])} s ({verdict[1]} / {verdict[2]}).")
    rerun = [r["others_cores"] for r in records if "rerun" in ts
             and r["kind"] in ts["rerun"]["kinds"] and r["others_cores"] is not None]
    lines += ["", outside_load(records, "run", ts["cpus"], None, (
        "The machine was shared with other jobs: the times are under load, not a clean "
        "measurement, and not graded.", "It was quiet."))]
    if rerun:
        lines[-1] += (f" The rerun rows' median run had {np.median(rerun):.1f} cores busy "
                      f"(from {min(rerun):.1f} to {max(rerun):.1f}).")
    return "\n".join(lines)


def run_timeseries(args, argv):
    """Every classifier, dataset and seed in a fresh process; the records go into
    ``meta['timeseries']`` of the estimators' JSON file ``args.out``."""
    import tempfile

    pythons = {"sktime": sys.executable, "aeon": args.aeon_python}
    with open(args.out) as fh:
        meta = json.load(fh)["meta"]
    run = dict(run_meta(argv), machine=machine.machine_label(), seeds=args.seeds,
               cpus=os.cpu_count())
    wanted = args.kinds.split(",") if args.kinds else list(TS_ROUTES["sktime"])
    previous = meta.get("timeseries")
    if args.kinds and previous is not None:  # the other kinds' records are kept
        if previous["seeds"] != args.seeds or previous["machine"] != run["machine"]:
            raise SystemExit(f"--kinds reruns part of the run of {previous['seeds']} seeds on "
                             f"{previous['machine']}: use the same seeds and machine")
        ts = meta["timeseries"] = dict(
            previous, rerun=dict(run, kinds=wanted),
            records=[r for r in previous["records"] if r["kind"] not in wanted])
    else:
        ts = meta["timeseries"] = dict(run, records=[])
    for dataset, seed in [(d, s) for d in TS_DATASETS for s in range(args.seeds)]:
        for route in [r for r in TS_ROUTES if os.path.exists(pythons[r])]:
            kinds = [k for k in TS_ROUTES[route] if k in wanted]
            for kind in kinds[seed % len(kinds):] + kinds[:seed % len(kinds)]:  # rotating
                with tempfile.TemporaryDirectory() as cache:  # numba compiles as on first use
                    record = _run(["--ts-worker", route, kind, dataset, str(seed)],
                                  pythons[route], NUMBA_CACHE_DIR=cache)
                ts["records"].append(record)
                print(f"{dataset} seed {seed} {route} {record['name']}: accuracy "
                      f"{record['accuracy']:.3f}, fit {record['first_fit']:.2f} s first, "
                      f"{record['fit']:.2f} s later", flush=True)
        if not args.kinds:  # a partial rerun is written whole, at the end
            machine.update_result_file(args.out, meta=meta)
    machine.update_result_file(args.out, meta=meta)
    print(f"wrote {args.out}")


# --------------------------------------------------------------------------- ragged data

RAGGED_TITLE = ("Estimators on ragged data: one long sequence among short ones, against the "
                "same time steps in equal lengths")
# 1023 sequences of 5 steps and one of 2053: 7168 steps, as 1024 sequences of 7.
RAGGED_N, RAGGED_SHORT, RAGGED_EQUAL = 1024, 5, 7
RAGGED_FEATURES = 16
RAGGED_EPOCHS = 3
RAGGED_BATCH = 64  # batch_size='auto' for 1024 sequences
RAGGED_KINDS = ("one long", "equal")


def ragged_data(kind, n=RAGGED_N, seed=0):
    """``(X, y)``: ``n`` sequences of ``RAGGED_FEATURES`` features, one long among
    ``RAGGED_SHORT``-step ones (``kind='one long'``) or all of ``RAGGED_EQUAL`` steps, the
    same steps in all."""
    rng = np.random.default_rng(seed)
    if kind == "equal":
        lengths = [RAGGED_EQUAL] * n
    else:
        lengths = [RAGGED_SHORT] * (n - 1) + [RAGGED_EQUAL * n - RAGGED_SHORT * (n - 1)]
    return ([rng.standard_normal((length, RAGGED_FEATURES)) for length in lengths],
            rng.integers(0, 2, n))


def ragged_measure(kind, memory, n=RAGGED_N, epochs=RAGGED_EPOCHS):
    """One ``LSTMClassifier`` fit (``epochs`` epochs, no early stopping) and predict on
    :func:`ragged_data`: their seconds, or with ``memory`` numpy's peak bytes in each
    (tracemalloc, which slows the calls), and the process's peak RSS."""
    import resource
    import tracemalloc

    from lstmcy.estimators import LSTMClassifier
    X, y = ragged_data(kind, n)
    clf = LSTMClassifier(max_iter=epochs, n_iter_no_change=None, early_stopping=False,
                         random_state=0)
    out = {"kind": kind, "steps": int(sum(len(x) for x in X)), "sequences": n,
           "max_len": max(len(x) for x in X)}
    for name, call in (("fit", lambda: clf.fit(X, y)), ("predict", lambda: clf.predict(X))):
        if memory:
            tracemalloc.start()
            call()
            out[f"{name}_peak"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            start = time.perf_counter()
            call()
            out[f"{name}_seconds"] = time.perf_counter() - start
    out["max_rss" if not memory else "max_rss_traced"] = \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def ragged_worker(kind, memory):
    before = machine.cpu_snapshot()
    record = ragged_measure(kind, memory)
    record["others_cores"] = machine.others_cores(before, machine.cpu_snapshot())
    print(json.dumps(record))


def _run(args, python=sys.executable, **env):
    """This script with ``args`` in a fresh process of ``python`` (this checkout's lstmcy,
    ``env`` added to the environment): the JSON of its last line."""
    command = [python, os.path.abspath(__file__)] + args
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **env)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ragged_markdown(records, meta, heading="## " + RAGGED_TITLE):
    """The ragged run's Markdown: a row per kind of data and their ratio."""
    def median(kind, key):
        return float(np.median([r[key] for r in records if r["kind"] == kind and key in r]))

    mib = 1 << 20
    long_len = next(r["max_len"] for r in records if r["kind"] == "one long")
    longest_batch = long_len + (RAGGED_BATCH - 1) * RAGGED_SHORT
    lines = [heading, ""] if heading else []
    lines += [
        f"`{meta['command']}` — {meta['date']}, lstmcy {meta['commit']}, {meta['machine']}. "
        f"{meta['versions']}.",
        "",
        f"`LSTMClassifier(max_iter={RAGGED_EPOCHS}, n_iter_no_change=None, "
        f"early_stopping=False)` (64 units, head 'last', batches of {RAGGED_BATCH}) fitted on "
        f"{RAGGED_N} sequences of {RAGGED_FEATURES} features, then predicting them: "
        f"{RAGGED_N - 1} of {RAGGED_SHORT} steps and one long one, against {RAGGED_N} of "
        f"{RAGGED_EQUAL} steps, the same time steps in all. Times: medians of "
        f"{meta['repeats']} fresh processes per kind, the kinds alternating. Memory: numpy's "
        f"peak during the call (tracemalloc, a separate process) and the process's peak "
        f"RSS (interpreter and libraries included). A fit's peak is that of its largest "
        f"mini-batch: the one holding the long sequence has {longest_batch} time steps, "
        f"against {RAGGED_BATCH * RAGGED_EQUAL} in any batch of equal lengths; its "
        f"sequences run as kernel calls padded to at most twice their steps (padded to the "
        f"long one, the batch would hold {RAGGED_BATCH * long_len}). The long sequence's "
        f"{long_len} steps run one after the other, one or two sequences a step, where the "
        f"equal lengths' {RAGGED_EQUAL} steps run {RAGGED_BATCH} sequences at a time.",
        "",
        "| data | steps (longest) | fit | predict | fit peak (numpy) | predict peak (numpy) "
        "| peak RSS |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    cells = {}
    for kind in RAGGED_KINDS:
        steps = next(r["steps"] for r in records if r["kind"] == kind)
        longest = next(r["max_len"] for r in records if r["kind"] == kind)
        cells[kind] = [median(kind, "fit_seconds"), median(kind, "predict_seconds"),
                       median(kind, "fit_peak") / mib, median(kind, "predict_peak") / mib,
                       median(kind, "max_rss") / mib]
        c = cells[kind]
        lines.append(f"| {kind} | {steps} ({longest}) | {c[0]:.2f} s | {1e3 * c[1]:.0f} ms | "
                     f"{c[2]:.1f} MiB | {c[3]:.1f} MiB | {c[4]:.0f} MiB |")
    ratio = [a / b for a, b in zip(cells["one long"], cells["equal"])]
    lines.append("| one long / equal | | " + " | ".join(f"{r:.2f}×" for r in ratio) + " |")
    lines += ["", outside_load(records, "run", meta.get("cpus", "?"), meta, (
        "A run under outside load: the times are not a clean measurement (the memory is).",
        "The machine was quiet."))]
    return "\n".join(lines)


def run_ragged(out, repeats, argv):
    """Both kinds of data, alternating, each measurement in a fresh process; the run goes
    into the ``ragged`` section of the estimators' JSON file ``out``."""
    meta = dict(run_meta(argv), machine=machine.machine_label(), versions=ragged_versions(),
                repeats=repeats, loadavg_start=os.getloadavg()[0], cpus=os.cpu_count())
    records = []
    for repeat in range(repeats):
        kinds = RAGGED_KINDS if repeat % 2 == 0 else RAGGED_KINDS[::-1]
        for kind in kinds:
            for memory in (False, True) if repeat == 0 else (False,):
                record = _run(["--ragged-worker", kind, "memory" if memory else "time"])
                records.append(record)
                print(json.dumps(record), flush=True)
    meta["loadavg_end"] = os.getloadavg()[0]
    print(ragged_markdown(records, meta))
    machine.update_result_file(out, ragged={"meta": meta, "records": records})
    print(f"wrote {out}")


def ragged_versions():
    import sklearn

    import lstmcy
    return f"lstmcy {lstmcy.__version__}, scikit-learn {sklearn.__version__}, numpy {np.__version__}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"comma-separated, from {', '.join(DATASETS)} (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per dataset (default 3)")
    parser.add_argument("--large-seeds", type=int, default=1,
                        help="seeds for motions-20k (default 1)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="the JSON file to write the run into (its other runs kept)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of each library (default 0: their own default, 2 here)")
    parser.add_argument("--worker", nargs=4, metavar=("LIBRARY", "DATASET", "SEED", "THREADS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--ragged", action="store_true",
                        help="measure ragged data against equal lengths instead (see above)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed processes per kind of data with --ragged (default 5)")
    parser.add_argument("--ragged-worker", nargs=2, metavar=("KIND", "WHAT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--timeseries", action="store_true",
                        help="run the sktime and aeon route instead (see above)")
    parser.add_argument("--aeon-python", default=AEON_PYTHON,
                        help=f"aeon's venv's python for --timeseries (default {AEON_PYTHON})")
    parser.add_argument("--kinds", default="",
                        help="with --timeseries: rerun only these classifiers (comma-separated, "
                             f"from {', '.join(TS_ROUTES['sktime'])}), keeping the others' "
                             "records from the last run")
    parser.add_argument("--ts-worker", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        library, dataset, seed, threads = args.worker
        worker(library, dataset, int(seed), int(threads))
        return
    if args.ragged_worker:
        kind, what = args.ragged_worker
        ragged_worker(kind, what == "memory")
        return
    if args.ts_worker:
        route, kind, dataset, seed = args.ts_worker
        ts_worker(route, kind, dataset, int(seed))
        return
    argv = argv if argv is not None else sys.argv[1:]
    if args.timeseries:
        run_timeseries(args, argv)
        return
    if args.ragged:
        run_ragged(args.out, args.repeats, argv)
        return
    datasets = [d for d in args.datasets.split(",") if d]
    meta = dict(run_meta(argv), versions=versions(args.threads), seeds=args.seeds,
                large_seeds=args.large_seeds, loadavg_start=os.getloadavg()[0],
                cpus=os.cpu_count(), datasets={})
    if os.path.exists(args.out):  # keep the --timeseries run
        with open(args.out) as fh:
            meta.update({k: v for k, v in json.load(fh)["meta"].items() if k == "timeseries"})
    records = []
    for dataset in datasets:
        X_train, y_train, X_test, y_test, channels_first = load_dataset(dataset)
        channels, min_len, max_len = describe(X_train, channels_first)
        meta["datasets"][dataset] = {
            "n_train": len(y_train), "n_test": len(y_test), "channels": channels,
            "min_len": min_len, "max_len": max_len, "classes": len(np.unique(y_train)),
            **training_plan(X_train, y_train, channels_first)}
        for seed in range(args.large_seeds if dataset == "motions-20k" else args.seeds):
            order = ("lstmcy", "skorch") if seed % 2 == 0 else ("skorch", "lstmcy")
            for library in order:
                record = _run(["--worker", library, dataset, str(seed), str(args.threads)])
                records.append(record)
                print(f"{dataset:>16} seed {seed} {library:>6}: accuracy {record['accuracy']:.3f}, "
                      f"fit {record['fit_seconds']:6.1f} s, {record['epochs']:3d} epochs, "
                      f"outside load {record['others_cores'] or 0:.1f} cores", flush=True)
        # Written after every dataset, so that a long run leaves its finished part behind.
        meta["loadavg_end"] = os.getloadavg()[0]
        machine.update_result_file(args.out, meta=meta, datasets=list(meta["datasets"]),
                                   records=records)
    print(estimators_markdown(records, list(meta["datasets"]), meta))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
