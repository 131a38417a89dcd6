"""The peer harness of ``benchmarks/run.py --peers``, without JAX or TensorFlow.

A fake peer (a small LSTM in torch autograd, in the peers' input-major layout) goes
through the same path as the real ones: layout mapping, ``cross_check`` against
lstmcy, ``compare.setup_case`` (which decides what gets timed), ratios and the
report. The correct fake must pass; each deliberately wrong one (a gate order, a
dropped bias, a kernel gradient not transposed or reshaped, a direction, a mask, a cotangent)
must fail the cross-check and not be timed.
"""
import os
import sys
import types

import numpy as np
import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import cases  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402
from peers import PeerRun, compare, layout, load_peers, parse_peers  # noqa: E402
from peers.check import cross_check, lstmcy_results  # noqa: E402

GATE_SLICES = {"ifgo": (0, 1, 2, 3), "figo": (1, 0, 2, 3)}  # where i, f, g, o sit in the 4H block


def fake_lstm(x, h0, c0, weights, mask, num_layers, num_directions, gates="ifgo", reverse=True):
    """Input-major LSTM in torch ops (``weights`` as ``layout.to_input_major``), masked like the peers."""
    T = x.shape[0]
    layer_in, h_n, c_n = x, [], []
    for layer in range(num_layers):
        outs = []
        for direction in range(num_directions):
            k = layer * num_directions + direction
            kernel, recurrent, bias = weights[k]
            h, c = h0[k], c0[k]
            ys = [None] * T
            for t in (range(T - 1, -1, -1) if direction and reverse else range(T)):
                z = torch.chunk(layer_in[t] @ kernel + h @ recurrent + bias, 4, dim=-1)
                i, f, g, o = (z[j] for j in GATE_SLICES[gates])
                c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h_new = torch.sigmoid(o) * torch.tanh(c_new)
                if mask is not None:
                    m = mask[t]
                    ys[t] = torch.where(m, h_new, torch.zeros_like(h_new))
                    h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
                else:
                    ys[t], h, c = h_new, h_new, c_new
            outs.append(torch.stack(ys))
            h_n.append(h)
            c_n.append(c)
        layer_in = torch.cat(outs, dim=-1)
    return layer_in, torch.stack(h_n), torch.stack(c_n)


def fake_setup(case, inp, mistake=None):
    """A :class:`peers.PeerRun` of :func:`fake_lstm`, with one deliberate ``mistake`` (or none)."""
    def tensor(a):
        return torch.from_numpy(np.array(a)).requires_grad_()

    mapped = layout.to_input_major(inp["params"], case.L, case.D)
    if mistake == "bias_ih_only":  # forgets PyTorch's second bias
        mapped = [(k, r, inp["params"][4 * n + 2]) for n, (k, r, _) in enumerate(mapped)]
    weights = [tuple(tensor(a) for a in triple) for triple in mapped]
    x, h0, c0 = tensor(inp["x"]), tensor(inp["h0"]), tensor(inp["c0"])
    mask = None
    if case.packed and mistake != "ignore_mask":
        mask = torch.from_numpy(layout.active_mask(case.T, inp["lengths"])[:, :, None])
    cotangents = [torch.from_numpy(inp[k]) for k in ("dy", "dh", "dc")]
    if mistake == "drop_dc":
        cotangents[2] = torch.zeros_like(cotangents[2])
    flat = [w for triple in weights for w in triple]

    def forward():
        return fake_lstm(x, h0, c0, weights, mask, case.L, case.D,
                         gates="figo" if mistake == "gate_order" else "ifgo",
                         reverse=mistake != "reverse_not_reversed")

    def forward_backward():
        out = forward()
        return out, torch.autograd.grad(list(out), [x, h0, c0] + flat, cotangents)

    def results():
        (y, h_n, c_n), grads = forward_backward()
        grads = [g.numpy() for g in grads]
        triples = [grads[3 + k:6 + k] for k in range(0, len(grads) - 3, 3)]
        if mistake == "kernel_not_transposed":
            dparams = [a for dk, dr, db in triples for a in (dk, dr.T, db, db)]
        elif mistake == "kernel_reshaped":  # PyTorch's shape, not its layout
            dparams = [a for dk, dr, db in triples for a in (dk.reshape(dk.shape[::-1]), dr.T, db, db)]
        else:
            dparams = layout.grads_to_torch(triples)
        return {"y": y.detach().numpy(), "h_n": h_n.detach().numpy(), "c_n": c_n.detach().numpy(),
                "dx": grads[0], "dh0": grads[1], "dc0": grads[2], "dparams": dparams}

    return PeerRun(forward=forward, forward_backward=forward_backward, backward=None, results=results,
                   label=f"fake ({mistake or 'correct'})")


def fake_module(mistake=None, prepare=None):
    module = types.ModuleType(f"fake_peer_{mistake}")
    module.prepare = prepare or (lambda threads: {"version": "0", "threads": threads})
    module.setup = lambda case, inp: fake_setup(case, inp, mistake)
    return module


CASES = {
    "f32": cases.Case("f32", 6, 3, 5, 4),
    "bidir2-f64": cases.Case("bidir2-f64", 5, 3, 4, 4, 2, bidirectional=True, dtype="float64"),
    "packed-f32": cases.Case("packed-f32", 6, 4, 3, 5, packed=True),
    "packed-bidir2-f64": cases.Case("packed-bidir2-f64", 6, 4, 4, 4, 2, bidirectional=True,
                                    dtype="float64", packed=True),
}


def problem(name):
    case = CASES[name]
    inp = cases.make_inputs(case, seed=3)
    return case, inp, lstmcy_results(*run.lstmcy_setup(case, inp, packed=case.packed))


@pytest.mark.parametrize("name", list(CASES))
def test_correct_fake_peer_passes(name):
    case, inp, ours = problem(name)
    check = cross_check(case, inp, ours, fake_setup(case, inp).results())
    assert check["ok"], check
    assert not check["problems"]
    assert check["max_rel_err"] < (1e-5 if case.dtype == "float32" else 1e-12)
    # every output and every parameter gradient was compared
    assert len(check["errors"]) == 6 + len(inp["params"])


@pytest.mark.parametrize("mistake, name", [
    ("gate_order", "f32"),
    ("bias_ih_only", "f32"),
    ("kernel_reshaped", "bidir2-f64"),  # the right shape, the wrong values
    ("kernel_not_transposed", "f32"),   # a shape mismatch, reported
    ("reverse_not_reversed", "bidir2-f64"),
    ("ignore_mask", "packed-f32"),
    ("ignore_mask", "packed-bidir2-f64"),
    ("drop_dc", "packed-bidir2-f64"),
])
def test_wrong_fake_peer_fails(mistake, name):
    case, inp, ours = problem(name)
    check = cross_check(case, inp, ours, fake_setup(case, inp, mistake).results())
    assert not check["ok"]
    assert check["max_rel_err"] > 1e3 * check["tolerance"]
    if mistake == "kernel_not_transposed":
        assert any(p.startswith("dW_ih") and "shape" in p for p in check["problems"])


def test_a_missing_gradient_fails():
    case, inp, ours = problem("f32")
    theirs = fake_setup(case, inp).results()
    theirs["dparams"] = theirs["dparams"][:-1]
    check = cross_check(case, inp, ours, theirs)
    assert not check["ok"]
    assert any("missing" in p for p in check["problems"])


def test_only_peers_that_pass_are_timed():
    case, inp, ours = problem("packed-f32")

    def broken(case, inp):
        raise RuntimeError("no kernel for this shape")

    erroring = fake_module()
    erroring.setup = broken
    loaded = {"good": (fake_module(), {}), "wrong": (fake_module("gate_order"), {}),
              "erroring": (erroring, {})}
    functions, status = compare.setup_case(case, inp, loaded, ours)
    assert set(functions) == {"good_fwd", "good_fwdbwd"}  # no backward of its own
    assert status["good"]["status"] == "ran"
    assert status["wrong"]["status"] == "failed cross-check"
    assert status["erroring"] == {"status": "error", "error": "RuntimeError: no kernel for this shape"}
    assert functions["good_fwdbwd"]()[1][0].shape == inp["x"].shape


def test_summarise_ratios_derived_backward_and_targets():
    result = {"ratios": {}, "gflops": {}, "flops": {"bwd": 2e9, "fwd": 1e9},
              "peers": {"slow": {"status": "ran"}, "split": {"status": "ran"},
                        "wrong": {"status": "failed cross-check"}}}
    medians = {"lstmcy_fwdbwd": 1.0, "lstmcy_bwd": 0.6, "lstmcy_fwd": 0.4, "torch_fwdbwd": 0.5,
               "slow_fwdbwd": 3.0, "slow_fwd": 1.0, "split_fwdbwd": 2.0, "split_fwd": 0.8, "split_bwd": 1.5}
    compare.summarise(result, medians)
    r = result["ratios"]
    assert r["torch_fwdbwd_ratio"] == 0.5 and r["slow_fwdbwd_ratio"] == 3.0
    assert r["slow_fwd_ratio"] == pytest.approx(2.5)
    assert result["derived_times"] == {"slow_bwd": 2.0}  # (3.0 - 1.0), no backward of its own
    assert r["slow_bwd_ratio"] == pytest.approx(2.0 / 0.6)
    assert r["split_bwd_ratio"] == pytest.approx(1.5 / 0.6)  # measured, not derived
    assert result["gflops"]["slow_bwd"] == pytest.approx(1.0)
    assert "wrong_fwdbwd_ratio" not in r
    met = {t["metric"]: t["met"] for t in result["peer_targets"]}
    assert met == {"torch_fwdbwd_ratio": False, "slow_fwdbwd_ratio": True, "split_fwdbwd_ratio": True}


def test_report_shows_a_failed_peer_and_skipped_one():
    case = cases.Case("c", 2, 1, 1, 1)
    times = {k: {"median": v} for k, v in (("lstmcy_fwdbwd", 1e-3), ("lstmcy_bwd", 6e-4),
                                           ("lstmcy_fwd", 4e-4), ("torch_fwdbwd", 2e-3),
                                           ("ok_fwdbwd", 4e-3), ("ok_fwd", 1e-3))}
    result = {"name": case.name, "label": case.shape_label, "packed": False, "dtype": "float32",
              "times": times, "derived_times": {"ok_bwd": 3e-3},
              "ratios": {"bwd_ratio": 3.0, "fwd_ratio": 1.5, "torch_fwdbwd_ratio": 2.0, "ok_fwdbwd_ratio": 4.0,
                         "ok_fwd_ratio": 2.5, "ok_bwd_ratio": 5.0},
              "gflops": {"lstmcy_fwdbwd": 1.0, "torch_fwdbwd": 0.5, "ok_fwdbwd": 0.25},
              "peers": {"ok": {"status": "ran", "label": "fake ok", "check": {
                  "ok": True, "max_rel_err": 1e-7, "worst": "dx", "tolerance": 1e-4}},
                  "bad": {"status": "failed cross-check", "label": "fake bad", "check": {
                      "ok": False, "max_rel_err": 0.3, "worst": "dh0", "tolerance": 1e-4}}},
              "peer_targets": [{"metric": "ok_fwdbwd_ratio", "measured": 4.0, "met": True}]}
    doc = {"meta": {"peers": {"threads": 2, "loaded": {}, "skipped": {"tf": "not installed"}}},
           "cases": [result]}
    titles = {title: (header, rows, notes) for title, header, rows, notes in report.peer_tables(doc)}
    (fb_header, fb_rows, _), = [v for t, v in titles.items() if t.startswith("Peers: forward+backward")]
    row = dict(zip(fb_header, fb_rows[0]))
    assert row["ok/lstmcy"] == "4.00x" and row["torch/lstmcy"] == "2.00x"
    assert row["bad ms"] == "FAILED check" and row["bad/lstmcy"] == "FAILED check"
    (bw_header, bw_rows, bw_notes), = [v for t, v in titles.items() if t.startswith("Peers: backward")]
    assert dict(zip(bw_header, bw_rows[0]))["ok bwd ms"] == "3.00*"
    assert any(n.startswith("* ok:") for n in bw_notes)
    (_, ck_rows, ck_notes), = [v for t, v in titles.items() if t.startswith("Peers: cross-check")]
    assert ck_rows[0][-1] == "3.0e-01 (dh0) FAILED"
    assert "tf: skipped, not installed" in ck_notes
    assert report.peer_tables({"meta": {}, "cases": [{"name": "no peers"}]}) == []


def test_parse_and_load_peers(monkeypatch):
    assert parse_peers(None) == ["torch"]
    assert parse_peers("tf, jax") == ["torch", "jax", "tf"]
    with pytest.raises(ValueError, match="unknown mxnet; choose from torch, jax, tf"):
        parse_peers("torch,mxnet")

    def absent(threads):
        raise ImportError("No module named 'jax'")

    monkeypatch.setitem(sys.modules, "fake_peer_present", fake_module())
    monkeypatch.setitem(sys.modules, "fake_peer_absent", fake_module(prepare=absent))
    loaded, skipped = load_peers(["torch", "jax", "tf"], 3,
                                 modules={"jax": "fake_peer_absent", "tf": "fake_peer_present"})
    assert list(loaded) == ["tf"] and loaded["tf"][1] == {"version": "0", "threads": 3}
    assert "not installed (No module named 'jax')" in skipped["jax"]
    assert "'.[bench]'" in skipped["jax"]


def test_run_py_rejects_an_unknown_peer(capsys):
    with pytest.raises(SystemExit):
        run.parse_args(["--peers", "jax,theano"])
    assert "unknown theano" in capsys.readouterr().err
    assert run.parse_args([]).peers == ["torch"]
