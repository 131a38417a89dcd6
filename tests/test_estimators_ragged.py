"""Tests of lstmcy.estimators on ragged data: cost in proportion to the real time steps,
and a sample's prediction independent of the samples predicted with it.

Memory is numpy's peak allocation during a call (tracemalloc: numpy reports its buffers to
it), after ``lstmcy.release_workspaces()`` so that the kernels' work buffers count too.
"""
import tracemalloc
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from estimator_helpers import quiet_fit, ragged_sequences  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import lstmcy  # noqa: E402
from lstmcy.estimators._sequences import MAX_PADDING, Sequences, cut  # noqa: E402
from lstmcy.estimators import LSTMClassifier, LSTMRegressor  # noqa: E402


def peak_bytes(call):
    """Peak bytes numpy allocated during ``call()``, the kernels' work buffers included."""
    lstmcy.release_workspaces()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def short_and_long(n_short, long_steps, features, seed=0):
    rng = np.random.default_rng(seed)
    short = [rng.standard_normal((5, features)) for _ in range(n_short)]
    return short, [rng.standard_normal((long_steps, features))]


# 1023 sequences of 5 steps and one of 400: padded to the long one, the batch would hold
# 1024 * 400 steps; packed, it holds 5515.
@pytest.mark.parametrize("settings", [dict(head="mean"), dict(head="last", num_layers=2,
                                                                bidirectional=True)], ids=repr)
def test_predict_costs_the_real_time_steps(settings):
    short, long = short_and_long(1023, 400, features=4)
    model = quiet_fit(LSTMRegressor(hidden_size=16, max_iter=1, random_state=0, **settings),
                      short[:50] + long, np.zeros(51))
    peak_short = peak_bytes(lambda: model.predict(short))
    peak_long = peak_bytes(lambda: model.predict(long))
    peak_both = peak_bytes(lambda: model.predict(short + long))
    # The long sequence costs about what it costs alone (the padded batch: ~60 times more).
    assert peak_both < 1.5 * (peak_short + peak_long)


def test_fit_costs_the_real_time_steps():
    short, long = short_and_long(255, 400, features=8)
    settings = dict(hidden_size=16, max_iter=1, batch_size=256, early_stopping=False,
                    random_state=0)
    y_short, y_long = np.zeros(len(short)), np.zeros(1)

    def fit(X, y):
        return lambda: quiet_fit(LSTMRegressor(**settings), X, y)

    peak_short = peak_bytes(fit(short, y_short))
    peak_long = peak_bytes(fit(long, y_long))
    peak_both = peak_bytes(fit(short + long, np.concatenate([y_short, y_long])))
    # One mini-batch of all of them: padded, its input, saved activations and gradients
    # would hold 256 * 400 steps (~30 times more).
    assert peak_both < 1.5 * (peak_short + peak_long)


def test_a_batch_is_cut_where_padding_would_double_its_steps():
    assert cut(np.array([9, 8, 5, 3, 1])) == [(0, 5)]  # 45 padded for 26 real steps
    assert cut(np.array([400, 5, 5, 5])) == [(0, 2), (2, 4)]
    assert cut(np.array([6, 6, 6, 6, 6]), max_samples=2) == [(0, 2), (2, 4), (4, 5)]
    assert cut(np.array([6, 6, 6, 6, 6]), max_tokens=13) == [(0, 2), (2, 4), (4, 5)]
    assert cut(np.array([50, 6, 6]), max_tokens=10) == [(0, 1), (1, 2), (2, 3)]
    lengths = np.sort(np.random.default_rng(0).integers(1, 300, 500))[::-1]
    bounds = cut(lengths)
    assert [b[0] for b in bounds[1:]] == [b[1] for b in bounds[:-1]] and bounds[-1][1] == 500
    for start, stop in bounds:
        assert lengths[start] * (stop - start) <= MAX_PADDING * lengths[start:stop].sum()


def test_batch_parts_hold_the_samples_packed():
    seqs = [np.full((length, 2), float(k)) for k, length in enumerate([2, 400, 3, 5, 1])]
    batch = Sequences.from_arrays(seqs).batch(np.arange(5))
    np.testing.assert_array_equal(batch.sample_index, [1, 3, 2, 0, 4])
    assert [part.lengths.tolist() for part in batch.parts] == [[400, 5], [3, 2, 1]]
    for part in batch.parts:
        assert len(part.input) == part.lengths.sum() == part.batch_sizes.sum()
        # packed row r holds step t of the sequence at position positions[r]
        values = np.array([seqs[i][0, 0] for i in part.sample_index])
        np.testing.assert_array_equal(part.input[:, 0], values[part.positions])
    part = Sequences.from_arrays(seqs).part(np.array([3]), min_size=4)  # padded to 4 sequences
    np.testing.assert_array_equal(part.batch_sizes, [4, 1, 1, 1, 1])
    np.testing.assert_array_equal(part.input[:4, 0], [3, 0, 0, 0])
    np.testing.assert_array_equal(part.sample_index, [3])


# ----------------------------------------------------------------- independent predictions

CONFIGS = {
    "last": dict(head="last"),
    "mean": dict(head="mean"),
    "mean-bidirectional-2-layers": dict(head="mean", bidirectional=True, num_layers=2),
    "last-bidirectional-2-layers": dict(head="last", bidirectional=True, num_layers=2),
}


@pytest.mark.parametrize("ragged", [False, True], ids=["equal-lengths", "ragged"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_prediction_does_not_depend_on_the_other_samples(config, ragged):
    rng = np.random.default_rng(5)
    X = ragged_sequences(n=40, features=3, seed=5) if ragged else rng.standard_normal((40, 7, 3))
    y = np.arange(40) % 3
    clf = quiet_fit(LSTMClassifier(hidden_size=8, max_iter=2, random_state=0, **CONFIGS[config]),
                    X, y)
    together = clf.decision_function(X)
    alone = np.concatenate([clf.decision_function(X[i:i + 1]) for i in range(40)])
    np.testing.assert_array_equal(together, alone)
    order = rng.permutation(40)[:17]
    others = clf.decision_function([X[i] for i in order] if ragged else X[order])
    np.testing.assert_array_equal(others, together[order])


def test_a_regression_does_not_depend_on_the_other_samples_through_blas_products():
    # w_ih of 4 * 96 * 400 float64 values is over FUSED_INPUT_BYTES: the forward's input
    # product is a BLAS GEMM over many sequences' rows.
    X = ragged_sequences(n=12, features=400, seed=2)
    y = np.random.default_rng(2).standard_normal((12, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = LSTMRegressor(hidden_size=96, max_iter=1, random_state=0).fit(X, y)
    together = model.predict(X)
    alone = np.concatenate([model.predict(X[i:i + 1]) for i in range(12)])
    np.testing.assert_array_equal(together, alone)


def test_ragged_benchmark_measures_and_reports():
    """``benchmarks/bench_estimators.py --ragged`` (its RESULTS.md row) on a small set."""
    import os
    import sys
    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import bench_estimators as bench
    records = [dict(bench.ragged_measure(kind, memory, n=32, epochs=1), others_cores=0.0)
               for kind in bench.RAGGED_KINDS for memory in (False, True)]
    assert {r["steps"] for r in records} == {32 * bench.RAGGED_EQUAL}
    meta = {"command": "c", "date": "d", "commit": "x", "machine": "m", "versions": "v",
            "repeats": 1, "cpus": 2, "loadavg_start": 0.0, "loadavg_end": 0.0}
    text = bench.ragged_markdown(records, meta)
    rows = [line for line in text.splitlines() if line.startswith("| one long")]
    assert len(rows) == 2 and rows[0].startswith(f"| one long | {32 * bench.RAGGED_EQUAL} (")
    assert "The machine was quiet." in text
