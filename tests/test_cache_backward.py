"""The cache carries the call: ``cache.backward(dy)``, and the vendor-shaped backward that
refuses to disagree with the forward whose saved arrays it is handed.

* ``LSTMCache.backward`` against PyTorch float64 autograd (1e-10) over layers, directions,
  layouts (padded and packed), dropout with its masks and projections, and through an
  ``LSTMPlan``; every dtype gives the vendor-shaped call's bits.
* ``lstm_backward`` handed a forward's own saved arrays with any setting changed or left
  out (each keyword, the lengths, the input, states, parameters and masks) raises a
  ValueError naming the argument and the forward's value.
* The cache refers to the caller's arrays (no copies, measured with tracemalloc); a cache
  outliving later calls on its plan still gives the right gradients.
* ``LSTMConfig``: checked once, frozen, one object for the numpy API.
* The README's numpy section, docs/api.md and ``help(LSTMCache.backward)`` show this form
  first, and the README's training loop runs and learns.
"""
import dataclasses
import gc
import itertools
import pathlib
import re
import threading
import tracemalloc

import numpy as np
import pytest

import lstmcy
from lstmcy import reference

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from torch_oracle import LAYOUTS, make_case, norm_rel_err, torch_lstm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def with_projection(case, P):
    """``case`` with a projection of size P: parameters with ``w_hr``, h-sized arrays cut
    to P (values from the case's own streams)."""
    rng = np.random.default_rng([case.seed, 7])
    D = 2 if case.bidirectional else 1
    H, I = case.H, case.x.shape[-1]
    params = []
    for layer in range(case.num_layers):
        in_size = I if layer == 0 else D * P
        for _ in range(D):
            params += [rng.uniform(-0.8, 0.8, (4 * H, in_size)), rng.uniform(-0.8, 0.8, (4 * H, P))]
            if case.has_bias:
                params += [rng.uniform(-0.5, 0.5, 4 * H), rng.uniform(-0.5, 0.5, 4 * H)]
            params.append(rng.uniform(-0.8, 0.8, (P, H)))
    dtype = case.x.dtype
    return dataclasses.replace(
        case, params=[p.astype(dtype) for p in params], h0=case.h0[..., :P].copy(),
        dh=case.dh[..., :P].copy(), dy=case.dy[..., :D * P].copy())


def assert_matches_oracle(grads, case, cache, tol=1e-10):
    """``grads`` (an LSTMGradients) equals PyTorch float64 autograd on ``case`` replaying
    the cache's dropout masks."""
    expected = torch_lstm(case.x, case.hx, case.params, dy=case.dy, dh=case.dh, dc=case.dc,
                          dropout_masks=cache.dropout_masks, **case.kwargs())
    got = {"dx": grads.dx, "dh0": grads.dh0, "dc0": grads.dc0}
    want = {"dx": expected.dx, "dh0": expected.dh_prev, "dc0": expected.dc_prev}
    got.update({f"dparams[{k}]": g for k, g in enumerate(grads.dparams)})
    want.update({f"dparams[{k}]": g for k, g in enumerate(expected.dparams)})
    assert len(grads.dparams) == len(case.params)
    errors = {name: norm_rel_err(got[name], want[name]) for name in want}
    bad = {name: f"{e:.3g}" for name, e in errors.items() if not e <= tol}
    assert not bad, f"relative error above {tol:g} in {bad}"


GRID = list(itertools.product((1, 2), (False, True), LAYOUTS, (0.0, 0.5), (0, 2)))
GRID_IDS = [f"L{L}-{'bi' if bi else 'uni'}-{lay}-p{p}-proj{P}" for L, bi, lay, p, P in GRID]


@pytest.mark.parametrize("num_layers, bidirectional, layout, dropout, proj", GRID, ids=GRID_IDS)
def test_cache_backward_matches_torch_float64(num_layers, bidirectional, layout, dropout, proj):
    case = make_case(700 + num_layers, T=5, B=3, I=4, H=5, num_layers=num_layers,
                     bidirectional=bidirectional, layout=layout, dropout=dropout)
    if proj:
        case = with_projection(case, proj)
    y, h_n, c_n, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, dropout=dropout,
                                             seed=case.seed, proj_size=proj, **case.kwargs())
    if dropout and num_layers > 1:
        assert cache.dropout_masks is not None  # the case really has masks to replay
    grads = cache.backward(case.dy, case.dh, case.dc)
    assert isinstance(grads, lstmcy.LSTMGradients)
    assert grads.dx.shape == case.x.shape and grads.dx.dtype == np.float64
    assert_matches_oracle(grads, case, cache)


@pytest.mark.parametrize("layout", ["packed", "batch_first"])
def test_plan_cache_backs_onto_its_plan(layout):
    """A plan's cache runs its backward on that plan (its trace records the calls) and
    matches PyTorch."""
    case = make_case(31, T=6, B=4, I=3, H=4, num_layers=2, bidirectional=True, layout=layout,
                     dropout=0.3)
    plan = lstmcy.LSTMPlan()
    cfg = lstmcy.LSTMConfig(num_layers=2, bidirectional=True, dropout=0.3,
                            batch_first=case.batch_first)
    *_, cache = plan.forward(case.x, case.hx, case.params, config=cfg,
                             batch_sizes=case.batch_sizes, seed=1)
    assert cache.config is cfg
    plan.trace = []
    grads = cache.backward(case.dy, case.dh, case.dc)
    assert [kind for kind, _, _ in plan.trace] == ["backward", "backward"]
    assert_matches_oracle(grads, case, cache)


def test_cache_outliving_later_calls_on_its_plan_stays_right():
    """Later forwards and backwards on the same plan (larger shapes, then the same shape
    with other values) neither change nor invalidate an earlier cache."""
    plan = lstmcy.LSTMPlan()
    first = make_case(41, T=5, B=3, I=4, H=6, num_layers=2, bidirectional=True, dropout=0.4)
    kw = dict(num_layers=2, bidirectional=True, dropout=0.4)
    *_, cache = plan.forward(first.x, first.hx, first.params, seed=2, **kw)
    for seed, (T, B) in ((42, (9, 7)), (43, (5, 3))):  # buffers grown, then reused
        other = make_case(seed, T=T, B=B, I=4, H=6, num_layers=2, bidirectional=True)
        y, *_, later = plan.forward(other.x, other.hx, other.params, seed=3, **kw)
        later.backward(np.ones_like(y))
        del y, later
    assert_matches_oracle(cache.backward(first.dy, first.dh, first.dc), first, cache)


def test_cache_backward_on_another_thread_uses_that_threads_plan():
    case = make_case(51, T=4, B=3, I=3, H=4, num_layers=2, dropout=0.5)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, num_layers=2, dropout=0.5,
                                    seed=0)
    results = []
    worker = threading.Thread(target=lambda: results.append(cache.backward(case.dy)))
    worker.start()
    worker.join()
    here = cache.backward(case.dy)
    for a, b in zip(results[0][:3] + tuple(results[0].dparams), here[:3] + tuple(here.dparams)):
        np.testing.assert_array_equal(a, b)


LOW = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("layout", ["time_major", "packed", "padded_2d"])
def test_cache_backward_is_the_vendor_call_in_every_dtype(dtype, layout):
    """Every dtype: the cache's backward gives the bits of the vendor-shaped call handed
    the forward's arguments, and the output mask is honoured."""
    case = make_case(61, T=5, B=3, I=4, H=5, num_layers=2, bidirectional=True, layout=layout,
                     dropout=0.5, dtype=dtype)
    kw = dict(dropout=0.5, **case.kwargs())
    y, h_n, c_n, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, seed=4, **kw)
    mask = (True, False, True, True)
    grads = cache.backward(case.dy, case.dh, case.dc, output_mask=mask)
    vendor = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, case.dh, case.dc,
                                  *cache.saved(), dropout_masks=cache.dropout_masks,
                                  output_mask=mask, **kw)
    assert grads.dh0 is None and vendor.dh0 is None
    assert grads.dx.dtype == dtype and grads.dx.shape == case.x.shape
    for a, b in zip((grads.dx, grads.dc0, *grads.dparams), (vendor.dx, vendor.dc0, *vendor.dparams)):
        assert a.tobytes() == b.tobytes()


def test_reference_cache_backward_and_vjp():
    """The numpy reference's cache has the same backward; lstm_vjp is forward plus
    cache.backward."""
    case = make_case(71, T=4, B=2, I=3, H=4, num_layers=2, layout="packed", dropout=0.5)
    kw = dict(dropout=0.5, **case.kwargs())
    *_, cache = reference.lstm_forward(case.x, case.hx, case.params, seed=5, **kw)
    assert_matches_oracle(cache.backward(case.dy, case.dh, case.dc), case, cache)

    y, (h_n, c_n), vjp = lstmcy.lstm_vjp(case.x, case.hx, case.params, seed=5, **kw)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, seed=5, **kw)
    for a, b in zip(vjp(case.dy).dparams, cache.backward(case.dy).dparams):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"lstm_vjp needs a training forward \(train=True\)"):
        lstmcy.lstm_vjp(case.x, case.hx, case.params, train=False, **case.kwargs())


def test_hand_made_cache_has_no_backward():
    cache = lstmcy.LSTMCache(*([[]] * 7))
    with pytest.raises(ValueError, match=r"records no forward call.*use lstm_backward"):
        cache.backward(np.zeros((1, 1, 1)))


def test_cache_backward_checks_the_gradients():
    case = make_case(81, T=3, B=2, I=3, H=4)
    *_, cache = lstmcy.lstm_forward(case.x, None, case.params)
    with pytest.raises(ValueError, match=r"\bdy\b.*shape \(3, 2, 4\)"):
        cache.backward(case.dy[:, :1])
    with pytest.raises(ValueError, match=r"\bdh\b.*shape \(1, 2, 4\)"):
        cache.backward(case.dy, case.dh[:, :1])


# ---------------------------------------------------------------------------
# The vendor-shaped call refuses a backward that describes another forward
# ---------------------------------------------------------------------------

# Every setting away from its default, so that leaving it out changes it; 3-D padded
# batch-first input with lengths (leaving batch_sizes out is no shape error then).
T, B, I, H, P, L = 4, 3, 5, 6, 2, 2
FORWARD = dict(num_layers=L, bidirectional=True, batch_first=True, has_bias=False, dropout=0.5,
               proj_size=P, batch_sizes=np.array([3, 2, 2, 1]))


@pytest.fixture(scope="module")
def forward_call():
    rng = np.random.default_rng(5)
    D = 2
    params = []
    for layer in range(L):
        for _ in range(D):
            params += [rng.uniform(-0.5, 0.5, (4 * H, I if layer == 0 else D * P)),
                       rng.uniform(-0.5, 0.5, (4 * H, P)), rng.uniform(-0.5, 0.5, (P, H))]
    x = rng.standard_normal((B, T, I))
    hx = (rng.standard_normal((L * D, B, P)), rng.standard_normal((L * D, B, H)))
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, seed=3, **FORWARD)
    dy = rng.standard_normal(y.shape)
    args = [x, hx, params, dy, None, None, *cache.saved()]
    kwargs = dict(FORWARD, dropout_masks=cache.dropout_masks)
    return args, kwargs, cache


def _other(array):
    return array + 1.0


# (id, change to the backward's keywords or arguments, name in the message, forward's value)
MISMATCHES = [
    ("num_layers-omitted", {"num_layers": None}, r"\bnum_layers\b", r"num_layers=2"),
    ("num_layers-changed", {"num_layers": 3}, r"\bnum_layers\b", r"num_layers=2"),
    ("bidirectional-omitted", {"bidirectional": None}, r"\bbidirectional\b", r"bidirectional=True"),
    ("batch_first-omitted", {"batch_first": None}, r"\bbatch_first\b", r"batch_first=True"),
    ("has_bias-omitted", {"has_bias": None}, r"\bhas_bias\b", r"has_bias=False"),
    ("proj_size-omitted", {"proj_size": None}, r"\bproj_size\b", r"proj_size=2"),
    ("proj_size-changed", {"proj_size": 1}, r"\bproj_size\b", r"proj_size=2"),
    ("dropout-omitted", {"dropout": None, "dropout_masks": None}, r"\bdropout\b", r"dropout=0\.5"),
    ("dropout-changed", {"dropout": 0.3}, r"\bdropout\b", r"dropout=0\.5"),
    ("train-false", {"train": False, "dropout_masks": None}, r"\btrain\b", r"train=True"),
    ("batch_sizes-omitted", {"batch_sizes": None}, r"\bbatch_sizes\b", r"batch_sizes=\[3, 2, 2, 1\]"),
    ("batch_sizes-changed", {"batch_sizes": np.array([3, 3, 2, 1])}, r"\bbatch_sizes\b",
     r"batch_sizes=\[3, 2, 2, 1\]"),
    ("config-changed", {"config": "dropout=0.0"}, r"\bdropout\b", r"dropout=0\.5"),
    ("dropout_masks-omitted", {"dropout_masks": None}, r"\bdropout_masks\b", r"cache\.dropout_masks"),
    ("dropout_masks-other", {"dropout_masks": "other"}, r"\bdropout_masks\b",
     r"cache\.dropout_masks"),
    ("input-other-values", {"arg0": "other"}, r"\binput\b", r"shape \(3, 4, 5\) .*as input"),
    ("input-other-shape", {"arg0": "short"}, r"\binput\b", r"shape \(3, 4, 5\) .*as input"),
    ("hx-omitted", {"arg1": None}, r"\bhx\b", r"hx=\(h0, c0\)"),
    ("h0-other", {"arg1": "other-h0"}, r"hx\[0\] \(h0\)", r"shape \(4, 3, 2\).*as h0"),
    ("params-other", {"arg2": "other-w_hr"}, r"params\[2\]", r"shape \(2, 6\).*as params\[2\]"),
    ("params-short", {"arg2": "short"}, r"\bparams\b", r"12 params"),
]


def _apply(change, args, kwargs, cache):
    args, kwargs = list(args), dict(kwargs)
    for key, value in change.items():
        if key == "config":  # the forward's config with one setting changed
            name, text = value.split("=")
            cfg = cache.config.replace(**{name: float(text)})
            for setting in cfg.keywords():
                kwargs.pop(setting, None)
            kwargs["config"] = cfg
        elif key.startswith("arg"):
            k = int(key[3:])
            if value is None:
                args[k] = None
            elif value == "other":
                args[k] = _other(args[k])
            elif value == "short":
                args[k] = args[k][:, :-1] if k == 0 else args[k][:-1]
            elif value == "other-h0":
                args[k] = (_other(args[k][0]), args[k][1])
            elif value == "other-w_hr":
                args[k] = [(_other(p) if j == 2 else p) for j, p in enumerate(args[k])]
        elif value is None:
            kwargs.pop(key)
        elif isinstance(value, str):  # "other" masks
            kwargs[key] = [1.0 - m for m in kwargs[key]]
        else:
            kwargs[key] = value
    return args, kwargs


@pytest.mark.parametrize("change, name_re, forward_re",
                         [pytest.param(*m[1:], id=m[0]) for m in MISMATCHES])
def test_backward_refuses_another_forwards_settings(forward_call, change, name_re, forward_re):
    """The forward's own saved arrays with one setting changed or left out: a ValueError
    naming the argument and the forward's value, before anything runs (these calls were
    silently wrong where they passed the argument checks: dropout, batch_sizes, hx,
    input, parameters, masks)."""
    args, kwargs, cache = forward_call
    args, kwargs = _apply(change, args, kwargs, cache)
    with pytest.raises(ValueError) as info:
        lstmcy.lstm_backward(*args, **kwargs)
    message = str(info.value)
    assert re.search(name_re, message), message
    assert re.search(r"forward that saved these arrays ran with .*" + forward_re, message), message


def test_backward_given_the_forwards_arguments_runs(forward_call):
    """The base of the table above is valid: the same call (or copies of its arrays, or
    zeros for None states) gives the cache's gradients."""
    args, kwargs, cache = forward_call
    want = cache.backward(args[3])
    got = lstmcy.lstm_backward(*args, **kwargs)
    copied = [args[0].copy(), tuple(a.copy() for a in args[1]), [p.copy() for p in args[2]]]
    again = lstmcy.lstm_backward(*copied, *args[3:], **dict(
        kwargs, dropout_masks=[m.copy() for m in kwargs["dropout_masks"]]))
    for grads in (got, again):
        for a, b in zip(grads[:3] + tuple(grads.dparams), want[:3] + tuple(want.dparams)):
            np.testing.assert_array_equal(a, b)


def test_hx_none_and_zeros_are_the_same_call():
    case = make_case(91, T=3, B=2, I=3, H=4)
    zeros = (np.zeros_like(case.h0), np.zeros_like(case.c0))
    *_, cache = lstmcy.lstm_forward(case.x, None, case.params)
    a = lstmcy.lstm_backward(case.x, zeros, case.params, case.dy, None, None, *cache.saved())
    *_, cache = lstmcy.lstm_forward(case.x, zeros, case.params)
    b = lstmcy.lstm_backward(case.x, None, case.params, case.dy, None, None, *cache.saved())
    np.testing.assert_array_equal(a.dparams[0], b.dparams[0])


@pytest.mark.parametrize("module", [lstmcy, reference], ids=["lstmcy", "reference"])
def test_the_cache_itself_where_its_lists_belong_is_named(module):
    case = make_case(94, T=3, B=2, I=3, H=4)
    *_, cache = module.lstm_forward(case.x, None, case.params)
    with pytest.raises(TypeError, match=r"got the LSTMCache itself: call cache\.backward\(dy"):
        module.lstm_backward(case.x, None, case.params, case.dy, None, None, cache)


def test_saved_arrays_of_two_forwards_are_refused():
    case = make_case(92, T=3, B=2, I=3, H=4)
    *_, one = lstmcy.lstm_forward(case.x, None, case.params)
    *_, two = lstmcy.lstm_forward(case.x, None, case.params)
    saved = list(one.saved())
    saved[4] = two.h
    with pytest.raises(ValueError, match=r"different forwards: i from one, h from another"):
        lstmcy.lstm_backward(case.x, None, case.params, case.dy, None, None, *saved)


def test_arrays_from_elsewhere_are_used_as_given():
    """Copies of the saved arrays are not a forward's own: no settings to compare, and
    the same gradients from the same arguments."""
    case = make_case(93, T=3, B=2, I=3, H=4, num_layers=2, dropout=0.5)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, num_layers=2, dropout=0.5)
    copies = [[a.copy() for a in arrays] for arrays in cache.saved()]
    got = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, None, None, *copies,
                               num_layers=2, dropout=0.5, dropout_masks=cache.dropout_masks)
    want = cache.backward(case.dy)
    for a, b in zip(got.dparams, want.dparams):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# A backward handed its forward's own objects
# ---------------------------------------------------------------------------

@pytest.fixture
def full_checks(monkeypatch):
    """The number of backwards that ran the full argument checks (``_check_backward``)."""
    from lstmcy._engine import plan as plan_module
    calls = []
    real = plan_module._check_backward

    def counted(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(plan_module, "_check_backward", counted)
    return calls


def _grads(result):
    return list(result[:3]) + list(result.dparams)


def _assert_same_bits(got, want):
    for a, b in zip(_grads(got), _grads(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("num_layers, bidirectional, layout, proj, states", [
    (1, False, "time_major", 0, True), (1, False, "batch_first", 0, False),
    (2, True, "time_major", 0, True), (2, False, "batch_first", 3, True),
    (1, True, "time_major", 0, "list")])
def test_forwards_own_objects_run_on_its_checked_problem(full_checks, dtype, num_layers,
                                                         bidirectional, layout, proj, states):
    """A backward handed the forward's own input, states, parameters and saved lists runs
    on the forward's checked problem (no full checks), with the bits of the same call
    checked in full (copies of the parameters: compared by value)."""
    case = make_case(95, T=4, B=3, I=5, H=6, num_layers=num_layers,
                     bidirectional=bidirectional, layout=layout, dtype=dtype)
    if proj:
        case = with_projection(case, proj)
    hx = {True: (case.h0, case.c0), False: None, "list": [case.h0, case.c0]}[states]
    dh = None if hx is None else case.dh
    kw = dict(num_layers=num_layers, bidirectional=bidirectional,
              batch_first=layout == "batch_first", proj_size=proj)
    *_, cache = lstmcy.lstm_forward(case.x, hx, case.params, **kw)
    fast = lstmcy.lstm_backward(case.x, hx, case.params, case.dy, dh, case.dc, *cache.saved(),
                                **kw)
    short = cache.backward(case.dy, dh, case.dc)
    assert not full_checks
    checked = lstmcy.lstm_backward(case.x, hx, [p.copy() for p in case.params], case.dy, dh,
                                   case.dc, *cache.saved(), **kw)
    assert len(full_checks) == 1
    _assert_same_bits(fast, checked)
    _assert_same_bits(short, checked)
    if proj == 0 and states is True:
        assert_matches_oracle(fast, case, cache, tol=1e-10 if dtype == np.float64 else 1e-4)


def test_forwards_arrays_changed_in_place_are_read(full_checks):
    """The forward's problem reads the caller's arrays: a weight and the input changed in
    place between forward and backward give the gradients of the changed values, as a
    call checked in full does."""
    case = make_case(96, T=4, B=2, I=3, H=4)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params)
    case.params[1] *= 0.5
    case.x[1] += 1.0
    got = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, case.dh, case.dc,
                               *cache.saved())
    assert not full_checks
    want = lstmcy.lstm_backward(case.x.copy(), case.hx, [p.copy() for p in case.params],
                                case.dy, case.dh, case.dc, *cache.saved())
    assert len(full_checks) == 1
    _assert_same_bits(got, want)


@pytest.mark.parametrize("made", ["float16", "non-contiguous input", "unaligned weight"])
def test_forwards_converted_arrays_are_checked_in_full(full_checks, made):
    """A forward that computed on converted copies (float16, a non-contiguous or
    unaligned array) keeps no problem: its backward is checked in full and reads the
    caller's arrays as they are then."""
    case = make_case(97, T=4, B=2, I=3, H=4, dtype=np.float32)
    x, params = case.x, case.params
    if made == "float16":
        x, params = x.astype(np.float16), [p.astype(np.float16) for p in params]
        dy = case.dy.astype(np.float16)
    else:
        dy = case.dy
    if made == "non-contiguous input":
        x = np.asfortranarray(x)
    if made == "unaligned weight":
        raw = np.empty(params[1].nbytes + 1, np.uint8)
        params[1] = raw[1:].view(np.float32).reshape(params[1].shape)
        params[1][...] = case.params[1]
    *_, cache = lstmcy.lstm_forward(x, None, params)
    x[0] *= 2.0
    got = lstmcy.lstm_backward(x, None, params, dy, None, None, *cache.saved())
    assert len(full_checks) == 1
    want = lstmcy.lstm_backward(np.ascontiguousarray(x), None, [p.copy() for p in params],
                                dy, None, None, *cache.saved())
    _assert_same_bits(got, want)


def test_forwards_own_objects_with_dropout_still_need_the_masks(full_checks):
    """Masks left out of a backward on a dropout forward's own objects are refused (not
    the gradients of a network without dropout)."""
    case = make_case(98, T=3, B=2, I=3, H=4, num_layers=2)
    kw = dict(num_layers=2, dropout=0.5)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params, seed=1, **kw)
    with pytest.raises(ValueError, match=r"dropout_masks is not the forward's masks"):
        lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, None, None, *cache.saved(),
                             **kw)
    got = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, None, None,
                               *cache.saved(), dropout_masks=cache.dropout_masks, **kw)
    _assert_same_bits(got, cache.backward(case.dy))


@pytest.mark.parametrize("argument, bad, message", [
    ("dy", lambda a: a[:-1], r"dy must have shape \(4, 2, 4\) \(like the output y\)"),
    ("dh", lambda a: a.astype(np.float32), r"all arrays must share one dtype.* dh is float32"),
    ("dc", lambda a: list(a), r"dc must be"),
])
def test_forwards_own_objects_check_the_gradients_as_before(full_checks, argument, bad,
                                                             message):
    """The output gradients of a backward on the forward's own objects get the errors of
    a backward checked in full."""
    case = make_case(99, T=4, B=2, I=3, H=4)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params)
    grads = {"dy": case.dy, "dh": case.dh, "dc": case.dc}
    grads[argument] = bad(grads[argument])
    errors = []
    for params in (case.params, [p.copy() for p in case.params]):
        with pytest.raises((ValueError, TypeError), match=message) as info:
            lstmcy.lstm_backward(case.x, case.hx, params, grads["dy"], grads["dh"],
                                 grads["dc"], *cache.saved())
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    assert len(full_checks) == 1


@pytest.mark.parametrize("change", ["input shape", "input dtype", "h0 shape", "w_hh dtype",
                                    "b_ih shape"])
def test_forwards_arrays_reshaped_in_place_are_checked_in_full(full_checks, change):
    """The forward's own objects whose shape or dtype was set in place since: the backward
    checks them in full and raises the full checks' error (not the forward's problem's
    result, nor a kernel's message)."""
    case = make_case(101, T=4, B=2, I=3, H=4)
    x, hx, params = case.x, case.hx, case.params
    *_, cache = lstmcy.lstm_forward(x, hx, params)
    target, attribute, value, pattern = {
        # (B is read from the input: 4 now, so the states' shapes no longer fit it.)
        "input shape": (x, "shape", (2, 4, 3), r"hx\[0\] \(h0\) must have shape \(1, 4, 4\)"),
        "input dtype": (x, "dtype", np.int64, r"input must have dtype float16, .* got int64"),
        "h0 shape": (hx[0], "shape", (1, 4, 2), r"hx\[0\] \(h0\) must have shape \(1, 2, 4\)"),
        "w_hh dtype": (params[1], "dtype", np.int64, r"params\[1\] .* must have dtype .* got int64"),
        "b_ih shape": (params[2], "shape", (4, 4), r"params\[2\] .*must be 1-D"),
    }[change]
    setattr(target, attribute, value)
    with pytest.raises((ValueError, TypeError), match=pattern):
        lstmcy.lstm_backward(x, hx, params, case.dy, None, None, *cache.saved())
    assert len(full_checks) == 1


def test_a_replaced_piece_of_a_cache_list_is_checked_and_read(full_checks):
    """A cache list whose piece was replaced is not the forward's own any more: the
    backward checks it in full and reads the new piece (the same bits as copies of all
    seven)."""
    case = make_case(100, T=3, B=2, I=3, H=4)
    *_, cache = lstmcy.lstm_forward(case.x, case.hx, case.params)
    cache.f[0] = cache.f[0] * 0.5
    got = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, None, None,
                               *cache.saved())
    assert len(full_checks) == 1
    copies = [[a.copy() for a in arrays] for arrays in cache.saved()]
    want = lstmcy.lstm_backward(case.x, case.hx, case.params, case.dy, None, None, *copies)
    _assert_same_bits(got, want)


# ---------------------------------------------------------------------------
# No copies
# ---------------------------------------------------------------------------

def test_cache_refers_to_the_callers_arrays_and_holds_no_copies():
    """float16 input is computed in float32 (a converted copy of every array): the cache
    keeps the caller's arrays, not those copies. Memory still held once the outputs and
    the work buffers are gone is the saved activations', not the input's float32 copy."""
    rng = np.random.default_rng(0)
    T_, B_, I_, H_ = 200, 16, 512, 4
    x = rng.standard_normal((T_, B_, I_)).astype(np.float16)
    hx = (np.zeros((1, B_, H_), np.float16), np.zeros((1, B_, H_), np.float16))
    params = [rng.uniform(-0.3, 0.3, s).astype(np.float16)
              for s in [(4 * H_, I_), (4 * H_, H_), (4 * H_,), (4 * H_,)]]
    lstmcy.release_workspaces()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params)
        del y, h_n, c_n
        lstmcy.release_workspaces()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.input is x and cache.hx[0] is hx[0] and cache.hx[1] is hx[1]
    assert all(a is b for a, b in zip(cache.params, params))
    saved = 7 * T_ * B_ * H_ * (4 + 2)  # float32 values and their float16 rounding
    assert held < saved + 256 * 1024, (held, saved)
    assert held < x.nbytes  # the float32 copy of x alone is twice that


# ---------------------------------------------------------------------------
# LSTMConfig
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, pattern", [
    ({"num_layers": 0}, ValueError, r"num_layers must be >= 1"),
    ({"num_layers": 2.0}, TypeError, r"num_layers must be an int"),
    ({"bidirectional": 1}, TypeError, r"bidirectional must be a bool"),
    ({"batch_first": "yes"}, TypeError, r"batch_first must be a bool"),
    ({"has_bias": None}, TypeError, r"has_bias must be a bool"),
    ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
    ({"train": 0}, TypeError, r"train must be a bool"),
    ({"proj_size": -1}, ValueError, r"proj_size must be >= 0"),
])
def test_config_checks_each_setting(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        lstmcy.LSTMConfig(**kwargs)
    with pytest.raises(exc, match=pattern):
        lstmcy.LSTMConfig().replace(**kwargs)


def test_config_is_frozen_and_normalised():
    cfg = lstmcy.LSTMConfig(num_layers=np.int64(2), bidirectional=np.bool_(True), dropout=0)
    assert type(cfg.num_layers) is int and type(cfg.bidirectional) is bool
    assert type(cfg.dropout) is float
    assert cfg == lstmcy.LSTMConfig(num_layers=2, bidirectional=True)
    assert hash(cfg) == hash(lstmcy.LSTMConfig(num_layers=2, bidirectional=True))
    assert cfg.num_directions == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_layers = 3


def test_config_and_keywords_give_the_same_call():
    case = make_case(95, T=4, B=3, I=3, H=4, num_layers=2, bidirectional=True, dropout=0.5)
    cfg = lstmcy.LSTMConfig(num_layers=2, bidirectional=True, dropout=0.5)
    by_config = lstmcy.lstm_forward(case.x, case.hx, case.params, config=cfg, seed=9)
    by_keywords = lstmcy.lstm_forward(case.x, case.hx, case.params, num_layers=2,
                                      bidirectional=True, dropout=0.5, seed=9)
    assert by_keywords[3].config == cfg
    np.testing.assert_array_equal(by_config[0], by_keywords[0])
    with pytest.raises(TypeError, match=r"dropout=0\.5 given beside config"):
        lstmcy.lstm_forward(case.x, case.hx, case.params, config=cfg, dropout=0.5)


# ---------------------------------------------------------------------------
# Documentation shows the new form first
# ---------------------------------------------------------------------------

def _readme_numpy_section():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## numpy\n", 1)[1].split("\n## ", 1)[0]
    return section


def test_docs_show_cache_backward_first():
    readme = _readme_numpy_section()
    api = (ROOT / "docs" / "api.md").read_text()
    for name, text in (("README numpy section", readme), ("docs/api.md", api),
                       ("LSTMCache.backward.__doc__", lstmcy.LSTMCache.backward.__doc__),
                       ("LSTMCache.__doc__", lstmcy.LSTMCache.__doc__)):
        assert "cache.backward(" in text, name
        if "lstm_backward(" in text:
            assert text.index("cache.backward(") < text.index("lstm_backward("), name
    assert "lstm_backward(" in api and "LSTMConfig" in api and "lstm_vjp" in api


def test_readme_training_loop_runs_and_learns(capsys):
    """The README's numpy example is a training loop; its printed loss falls."""
    code = re.search(r"```python\n(.*?)```", _readme_numpy_section(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 22  # about as long as PyTorch's loop
    exec(compile(code, "README.md", "exec"), {})
    losses = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines()]
    assert len(losses) >= 3 and losses[-1] < 0.9 * losses[0], losses
