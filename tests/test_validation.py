"""The validation catalogue: every argument of lstm_forward and lstm_backward, malformed.

Each entry breaks one argument of an otherwise valid call and states the exception type
and two patterns its message must contain: the name of the offending argument and what
was expected. Every entry also checks that

* the caller's arrays are untouched (they are passed read-only and compared bitwise
  with copies afterwards), and
* no kernel ran: validation happens before any computation (every function of
  ``lstmcy._lstm`` is replaced by a sentinel for the duration of the call).

The base problem has distinct sizes (T=3, B=2, I=5, H=4, two bidirectional layers with
biases, dropout 0.3), so that a message can only name the right one.
"""
import copy
import functools
import re

import time

import numpy as np
import pytest

import lstmcy
from lstmcy._engine.cache import SAVED_NAMES as SAVED
from hostile import Config, make_call

T, B, I, H, L, D = 3, 2, 5, 4, 2, 2
BASE = Config(T=T, B=B, I=I, H=H, L=L, bidirectional=True, has_bias=True,
              layout="time_major", dropout=0.3)
PACKED = Config(T=T, B=B, I=I, H=H, L=1, bidirectional=False, has_bias=True, layout="packed",
                lengths_seed=3)
STATE = (L * D, B, H)
FLOAT_DTYPES_MSG = "float16, bfloat16, float32 or float64"
ARRAY_MSG = r"floating-point array"

# Positions in lstm_backward's argument list.
BWD = {"input": 0, "hx": 1, "params": 2, "dy": 3, "dh": 4, "dc": 5,
       "i": 6, "g": 7, "f": 8, "o": 9, "h": 10, "c": 11, "tanhc": 12}


@functools.lru_cache(maxsize=None)
def _base_call(cfg):
    return make_call(cfg, np.random.default_rng(0), seed=5)


def base_call(cfg=BASE):
    """A fresh copy of the valid call of ``cfg`` (built once)."""
    return _base_call(cfg).copy()


# ---------------------------------------------------------------------------
# Argument access: "fwd:<arg>" / "bwd:<arg>" paths such as "input", "hx.0", "params.5",
# "dy", "h.3", "kw:num_layers", "kw:dropout_masks.0".
# ---------------------------------------------------------------------------

def _container(call, side, head):
    if head.startswith("kw:"):
        kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
        return kwargs, head[3:]
    args = call.fwd_args if side == "fwd" else call.bwd_args
    return args, BWD[head]


def get_arg(call, side, path):
    head, *rest = path.split(".")
    container, key = _container(call, side, head)
    value = container.get(key) if isinstance(container, dict) else container[key]
    for k in rest:
        value = value[int(k)]
    return value


def set_arg(call, side, path, new):
    head, *rest = path.split(".")
    container, key = _container(call, side, head)
    if not rest:
        container[key] = new
        return
    items = list(container[key])
    items[int(rest[0])] = new
    container[key] = tuple(items) if head == "hx" else items


# ---------------------------------------------------------------------------
# Catalogue entries: (id, sides, path, replacement(old) -> new, exception, name, expectation)
# ---------------------------------------------------------------------------

CATALOGUE = []


def entry(id_, sides, path, make, exc, name, expect, cfg=BASE):
    CATALOGUE.append(pytest.param(sides, path, make, exc, name, expect, cfg, id=id_))


def with_axis(shape, axis, delta=1):
    shape = list(shape)
    shape[axis] += delta
    return tuple(shape)


def zeros(shape, dtype=np.float64):
    return lambda old: np.zeros(shape, dtype=dtype)


NOT_ARRAYS = [("None", None), ("list", lambda: [[1.0, 2.0]]), ("str", "abc"), ("int", 3),
              ("float", 2.5), ("dict", lambda: {"a": 1})]
BAD_DTYPES = [("int64", np.int64), ("int32", np.int32), ("uint8", np.uint8), ("bool", np.bool_),
              ("complex128", np.complex128), ("object", object), ("longdouble", np.longdouble),
              ("str", "U3"), ("bytes", "S3"), ("datetime", "datetime64[s]")]


def add_array_entries(label, sides, path, shape, name_re, ndim_expect, *, none_ok=False):
    """The standard set of malformations of one array argument of expected ``shape``."""
    for kind, value in NOT_ARRAYS:
        if kind == "None" and none_ok:
            continue
        exc = TypeError
        make = (lambda v: (lambda old: v() if callable(v) else v))(value)
        entry(f"{label}-{kind}", sides, path, make, exc, name_re,
              ARRAY_MSG if kind != "None" else r"got None")
    for kind, dtype in BAD_DTYPES:
        entry(f"{label}-dtype-{kind}", sides, path,
              (lambda dt: lambda old: np.zeros(old.shape, dtype=dt))(dtype),
              TypeError, name_re, FLOAT_DTYPES_MSG)
    entry(f"{label}-byteswapped", sides, path, lambda old: old.astype(old.dtype.newbyteorder()),
          TypeError, name_re, r"native byte order")
    entry(f"{label}-0d", sides, path, lambda old: np.array(1.0), ValueError, name_re, ndim_expect)
    entry(f"{label}-rank+1", sides, path, lambda old: old[None], ValueError, name_re, ndim_expect)
    # old[0] of a 1-D array is a numpy scalar: not an array at all (TypeError).
    entry(f"{label}-rank-1", sides, path, lambda old: old[0],
          TypeError if len(shape) == 1 else ValueError, name_re,
          ARRAY_MSG if len(shape) == 1 else ndim_expect)
    entry(f"{label}-mixed-float32", sides, path, lambda old: old.astype(np.float32),
          TypeError, name_re, r"share one dtype.*float32")
    entry(f"{label}-mixed-float16", sides, path, lambda old: old.astype(np.float16),
          TypeError, name_re, r"share one dtype.*float16")


# input ----------------------------------------------------------------------
add_array_entries("input", "both", "input", (T, B, I), r"\binput\b", r"3-D")
entry("input-wrong-I", "both", "input", zeros((T, B, I + 1)), ValueError,
      r"params\[0\] \(w_ih of layer 0, forward direction\)", r"shape \(16, 6\)")
entry("input-wrong-B", "both", "input", zeros((T, B + 1, I)), ValueError,
      r"hx\[0\] \(h0\)", r"shape \(4, 3, 4\)")
entry("input-wrong-T", "bwd", "input", zeros((T + 1, B, I)), ValueError,
      r"\bdy\b", r"shape \(4, 2, 8\)")
entry("input-2d-without-batch_sizes", "both", "input", zeros((T * B, I)), ValueError,
      r"\binput\b", r"needs batch_sizes")
# hx -------------------------------------------------------------------------
for kind, value in [("str", "ab"), ("int", 1), ("ndarray", lambda: np.zeros((2,) + STATE)),
                    ("dict", lambda: {"h0": 1})]:
    entry(f"hx-{kind}", "both", "hx", (lambda v: lambda old: v() if callable(v) else v)(value),
          TypeError, r"\bhx\b", r"tuple \(h0, c0\)")
entry("hx-length-1", "both", "hx", lambda old: old[:1], ValueError, r"\bhx\b", r"2 arrays")
entry("hx-length-3", "both", "hx", lambda old: tuple(old) + (old[0],), ValueError, r"\bhx\b",
      r"2 arrays")
for k, label in ((0, "h0"), (1, "c0")):
    name = rf"hx\[{k}\] \({label}\)"
    add_array_entries(f"hx{k}", "both", f"hx.{k}", STATE, name, r"3-D")
    for axis, what in enumerate(("LD", "B", "H")):
        entry(f"hx{k}-wrong-{what}", "both", f"hx.{k}", zeros(with_axis(STATE, axis)),
              ValueError, name, r"shape \(4, 2, 4\).*num_layers\*num_directions, B, H")
# params ---------------------------------------------------------------------
for kind, value in [("None", None), ("str", "abc"), ("int", 3), ("ndarray", lambda: np.zeros((16, 16, 4))),
                    ("dict", lambda: {})]:
    entry(f"params-{kind}", "both", "params", (lambda v: lambda old: v() if callable(v) else v)(value),
          TypeError, r"\bparams\b", r"list of 16 arrays")
entry("params-short", "both", "params", lambda old: old[:-1], ValueError, r"\bparams\b",
      r"16 arrays.*num_layers=2, bidirectional=True, has_bias=True")
entry("params-long", "both", "params", lambda old: old + [old[0]], ValueError, r"\bparams\b",
      r"16 arrays")
PARAM_SHAPES = {0: (16, I), 1: (16, H), 2: (16,), 3: (16,), 12: (16, D * H), 13: (16, H)}
PARAM_NAMES = {0: r"params\[0\] \(w_ih of layer 0, forward direction\)",
               1: r"params\[1\] \(w_hh of layer 0, forward direction\)",
               2: r"params\[2\] \(b_ih of layer 0, forward direction\)",
               3: r"params\[3\] \(b_hh of layer 0, forward direction\)",
               12: r"params\[12\] \(w_ih of layer 1, reverse direction\)",
               13: r"params\[13\] \(w_hh of layer 1, reverse direction\)"}
for k, shape in PARAM_SHAPES.items():
    ndim_expect = rf"{len(shape)}-D"
    add_array_entries(f"params{k}", "both", f"params.{k}", shape, PARAM_NAMES[k], ndim_expect)
    for axis in range(len(shape)):
        bad = with_axis(shape, axis)
        if k == 1 and axis == 1:
            # w_hh of layer 0 defines H: [16, 5] says H = 5, so 4H = 20 is expected.
            entry(f"params{k}-axis{axis}", "both", f"params.{k}", zeros(bad), ValueError,
                  PARAM_NAMES[1], r"shape \(20, 5\).*sets the hidden size H")
            continue
        entry(f"params{k}-axis{axis}", "both", f"params.{k}", zeros(bad), ValueError,
              PARAM_NAMES[k], re.escape(f"shape {shape}"))
# scalars and flags ---------------------------------------------------------
for side in ("fwd", "bwd"):
    for value in (0, -1, -(2 ** 63)):
        entry(f"{side}-num_layers={value}", side, "kw:num_layers", lambda old, v=value: v,
              ValueError, r"\bnum_layers\b", r">= 1")
    for kind, value in (("float", 2.0), ("str", "2"), ("None", None), ("bool", True),
                        ("list", [2])):
        entry(f"{side}-num_layers-{kind}", side, "kw:num_layers", lambda old, v=value: v,
              TypeError, r"\bnum_layers\b", r"must be an int")
    entry(f"{side}-num_layers-mismatch", side, "kw:num_layers", lambda old: 3, ValueError,
          r"\bparams\b", r"24 arrays.*num_layers=3")
    for value in (-0.1, 1.0, 1.5, float("nan"), float("inf"), -float("inf")):
        entry(f"{side}-dropout={value}", side, "kw:dropout", lambda old, v=value: v, ValueError,
              r"\bdropout\b", r"\[0, 1\)")
    for kind, value in (("str", "0.1"), ("None", None), ("bool", True), ("list", [0.1]),
                        ("complex", 0.1j)):
        entry(f"{side}-dropout-{kind}", side, "kw:dropout", lambda old, v=value: v, TypeError,
              r"\bdropout\b", r"float in \[0, 1\)")
    for value in (-1, -(2 ** 63)):
        entry(f"{side}-proj_size={value}", side, "kw:proj_size", lambda old, v=value: v,
              ValueError, r"\bproj_size\b", r">= 0")
    for kind, value in (("float", 2.0), ("str", "2"), ("None", None), ("bool", True)):
        entry(f"{side}-proj_size-{kind}", side, "kw:proj_size", lambda old, v=value: v,
              TypeError, r"\bproj_size\b", r"must be an int")
    # A projection the parameters do not have: too few arrays for one w_hr per direction.
    entry(f"{side}-proj_size-without-w_hr", side, "kw:proj_size", lambda old: 2, ValueError,
          r"\bparams\b", r"20 arrays.*proj_size=2")
    for flag in ("has_bias", "bidirectional", "batch_first", "train"):
        for kind, value in (("None", None), ("int", 1), ("str", "yes"), ("array", np.array([True]))):
            entry(f"{side}-{flag}-{kind}", side, f"kw:{flag}", lambda old, v=value: v,
                  TypeError, rf"\b{flag}\b", r"must be a bool")
    entry(f"{side}-has_bias-flipped", side, "kw:has_bias", lambda old: False, ValueError,
          r"\bparams\b", r"8 arrays.*has_bias=False")
    entry(f"{side}-bidirectional-flipped", side, "kw:bidirectional", lambda old: False,
          ValueError, r"\bparams\b", r"8 arrays.*bidirectional=False")
    # [3, 2, 5] read as [B=3, T=2, I=5]: the states have B=2.
    entry(f"{side}-batch_first-flipped", side, "kw:batch_first", lambda old: True, ValueError,
          r"hx\[0\] \(h0\)", r"shape \(4, 3, 4\)")
# config -----------------------------------------------------------------------
for side in ("fwd", "bwd"):
    for kind, value in (("dict", lambda: {"num_layers": L}), ("str", "LSTMConfig()"),
                        ("tuple", lambda: (L, True))):
        entry(f"{side}-config-{kind}", side, "kw:config",
              (lambda v: lambda old: v() if callable(v) else v)(value), TypeError,
              r"\bconfig\b", r"must be an lstmcy\.LSTMConfig or None")
    # The base call gives its settings as keywords: a config beside them says two things.
    entry(f"{side}-config-beside-keywords", side, "kw:config",
          lambda old: lstmcy.LSTMConfig(num_layers=L, bidirectional=True, dropout=0.3),
          TypeError, r"\bnum_layers=2 given beside config\b", r"either in config .* or as keywords")
# seed -----------------------------------------------------------------------
for value, exc in ((-1, ValueError), ("abc", TypeError), (1.5, TypeError), (object(), TypeError),
                   ([1, -2], ValueError)):
    entry(f"seed={value!r}", "fwd", "kw:seed", lambda old, v=value: v, exc, r"\bseed\b",
          r"non-negative int")
entry("seed-checked-without-dropout", "fwd", "kw:seed", lambda old: -1, ValueError, r"\bseed\b",
      r"non-negative int", cfg=PACKED)
# batch_sizes (3-D input, B = 2, T = 3) --------------------------------------
BS_CASES = [
    ("increasing", [1, 2, 2], ValueError, r"non-increasing"),
    ("contains-0", [2, 2, 0], ValueError, r"positive"),
    ("negative", [2, -1, -1], ValueError, r"positive"),
    ("not-starting-at-B", [1, 1, 1], ValueError, r"batch_sizes\[0\] must equal the batch size B=2"),
    ("too-large-start", [3, 2, 1], ValueError, r"batch_sizes\[0\] must equal the batch size B=2"),
    ("short", [2, 2], ValueError, r"length T=3"),
    ("long", [2, 2, 2, 1], ValueError, r"length T=3"),
    ("float", np.array([2.0, 2.0, 1.0]), TypeError, r"integer array.*float64"),
    ("bool", np.array([True, True, True]), TypeError, r"integer array.*bool"),
    ("str", "221", TypeError, r"integer array"),
    ("scalar", 2, TypeError, r"integer array"),
    ("2-D", np.array([[2, 2, 1]]), ValueError, r"1-D"),
    ("ragged", [[2], [2, 1]], TypeError, r"integer array"),
    ("huge", np.array([2 ** 62] * 3), ValueError, r"at most 2147483647"),
    ("uint64-max", np.array([2, 2, 2 ** 64 - 1], dtype=np.uint64), ValueError, r"at most 2147483647"),
]
for label, value, exc, expect in BS_CASES:
    entry(f"batch_sizes-{label}", "both", "kw:batch_sizes", lambda old, v=value: copy.copy(v), exc,
          r"\bbatch_sizes\b", expect)
# batch_sizes with the packed 2-D layout (T=3, B=2, N = sum(batch_sizes))
entry("packed-rows-mismatch", "both", "input", lambda old: np.zeros((old.shape[0] + 1, I)),
      ValueError, r"2-D input", r"sum\(batch_sizes\)=\d+ rows \(packed\) or T\*B=6 rows",
      cfg=PACKED)
entry("packed-input-wrong-I", "both", "input", lambda old: np.zeros((old.shape[0], I + 1)),
      ValueError, r"params\[0\]", r"shape \(16, 6\)", cfg=PACKED)
entry("packed-batch_sizes-increasing", "both", "kw:batch_sizes",
      lambda old: np.sort(np.asarray(old)), ValueError, r"\bbatch_sizes\b", r"non-increasing",
      cfg=PACKED)
entry("packed-batch_sizes-B-mismatch-with-hx", "both", "kw:batch_sizes",
      lambda old: np.ones(int(np.sum(old)), dtype=np.int64), ValueError, r"hx\[0\] \(h0\)",
      r"shape \(1, 1, 4\)", cfg=PACKED)
entry("packed-dy-packed-rows", "bwd", "dy", lambda old: np.zeros((old.shape[0] + 1, H)),
      ValueError, r"\bdy\b", r"like the output y", cfg=PACKED)
# backward-only arrays ---------------------------------------------------------
Y_SHAPE = (T, B, D * H)
add_array_entries("dy", "bwd", "dy", Y_SHAPE, r"\bdy\b", r"shape \(3, 2, 8\)")
for axis in range(3):
    entry(f"dy-axis{axis}", "bwd", "dy", zeros(with_axis(Y_SHAPE, axis)), ValueError,
          r"\bdy\b", r"shape \(3, 2, 8\) \(like the output y\)")
for name in ("dh", "dc"):
    add_array_entries(name, "bwd", name, STATE, rf"\b{name}\b", r"3-D", none_ok=True)
    for axis in range(3):
        entry(f"{name}-axis{axis}", "bwd", name, zeros(with_axis(STATE, axis)), ValueError,
              rf"\b{name}\b", r"shape \(4, 2, 4\)")
for name in SAVED:
    for kind, value in [("None", None), ("str", "abc"), ("int", 3),
                        ("ndarray", lambda: np.zeros((4, T, B, H))), ("dict", lambda: {})]:
        entry(f"{name}-{kind}", "bwd", name, (lambda v: lambda old: v() if callable(v) else v)(value),
              TypeError, rf"\b{name}\b", r"list of 4 arrays")
    entry(f"{name}-short", "bwd", name, lambda old: old[:-1], ValueError, rf"\b{name}\b",
          r"4 arrays \(one \[T, B, H\] array per layer and direction: num_layers=2, "
          r"bidirectional=True\)")
    entry(f"{name}-long", "bwd", name, lambda old: list(old) + [old[0]], ValueError,
          rf"\b{name}\b", r"4 arrays")
    add_array_entries(f"{name}3", "bwd", f"{name}.3", (T, B, H), rf"\b{name}\[3\]", r"3-D")
    for axis in range(3):
        entry(f"{name}3-axis{axis}", "bwd", f"{name}.3", zeros(with_axis((T, B, H), axis)),
              ValueError, rf"\b{name}\[3\]", r"shape \(3, 2, 4\) \(time-major \[T, B, H\]\)")
# backend ----------------------------------------------------------------------
for value in ("gpu", "CPU", None, 1):
    entry(f"backend={value!r}", "bwd", "kw:backend", lambda old, v=value: v, ValueError,
          r"\bbackend\b", r'"cpu", "aclnn" or "auto"')
# output_mask ------------------------------------------------------------------
for kind, value, exc, expect in [
        ("len3", (True,) * 3, ValueError, r"4 bools"), ("len5", (True,) * 5, ValueError, r"4 bools"),
        ("len0", (), ValueError, r"4 bools"), ("None", None, TypeError, r"tuple of 4 bools"),
        ("str", "1111", TypeError, r"tuple of 4 bools"), ("int", 1, TypeError, r"tuple of 4 bools"),
        ("int-array", np.ones(4, dtype=int), TypeError, r"tuple of 4 bools")]:
    entry(f"output_mask-{kind}", "bwd", "kw:output_mask", lambda old, v=value: v, exc,
          r"\boutput_mask\b", expect)
for kind, value in (("int", (1, 1, 1, 1)), ("None", (True, None, True, True)),
                    ("str", ("yes",) * 4)):
    entry(f"output_mask-entry-{kind}", "bwd", "kw:output_mask", lambda old, v=value: v,
          TypeError, r"output_mask\[\d\]", r"must be a bool")
# dropout_masks (BASE: dropout 0.3, L=2 -> one mask [3, 2, 8]) ----------------
entry("dropout_masks-missing", "bwd", "kw:dropout_masks", lambda old: None, ValueError,
      r"\bdropout_masks\b", r"required when dropout > 0")
for kind, value in (("str", "abc"), ("int", 1), ("ndarray", lambda: np.ones((1, T, B, D * H))),
                    ("dict", lambda: {})):
    entry(f"dropout_masks-{kind}", "bwd", "kw:dropout_masks",
          (lambda v: lambda old: v() if callable(v) else v)(value), TypeError,
          r"\bdropout_masks\b", r"list of 1 arrays")
entry("dropout_masks-long", "bwd", "kw:dropout_masks", lambda old: list(old) * 2, ValueError,
      r"\bdropout_masks\b", r"1 arrays \(one \[T, B, D\*H\] array per layer boundary\)")
entry("dropout_masks-empty", "bwd", "kw:dropout_masks", lambda old: [], ValueError,
      r"\bdropout_masks\b", r"1 arrays")
add_array_entries("dropout_masks0", "bwd", "kw:dropout_masks.0", Y_SHAPE,
                  r"\bdropout_masks\[0\]", r"3-D")
for axis in range(3):
    entry(f"dropout_masks0-axis{axis}", "bwd", "kw:dropout_masks.0",
          zeros(with_axis(Y_SHAPE, axis)), ValueError, r"\bdropout_masks\[0\]",
          r"shape \(3, 2, 8\) \(\[T, B, D\*H\]\)")
entry("dropout_masks-given-but-dropout-0", "bwd", "kw:dropout", lambda old: 0.0, ValueError,
      r"\bdropout_masks\b", r"must be None unless dropout > 0.*dropout=0.0")
entry("dropout_masks-given-but-eval", "bwd", "kw:train", lambda old: False, ValueError,
      r"\bdropout_masks\b", r"must be None unless.*train=False")


# ---------------------------------------------------------------------------
# Machinery
# ---------------------------------------------------------------------------

def _arrays_in(value):
    """Every ndarray inside ``value`` (nested lists/tuples/dicts)."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays_in(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays_in(v)]
    return []


def _freeze(value):
    """``value`` with every ndarray replaced by a read-only view of it."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    if isinstance(value, list):
        return [_freeze(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _snapshot(arrays):
    return [(a, a.copy()) for a in arrays if a.dtype.kind != "O"]


def _assert_untouched(snapshot):
    for array, before in snapshot:
        assert array.tobytes() == before.tobytes(), "validation modified a caller's array"


@pytest.fixture
def no_kernels():
    """The layer calls the plain functions run meanwhile: a traced plan's trace (one entry
    per kernel call), as the calling thread's plan."""
    from lstmcy._engine import plan as _core
    plan = lstmcy.LSTMPlan()
    plan.trace = []
    previous = _core.use_thread_plan(plan)
    try:
        yield plan.trace
    finally:
        _core.use_thread_plan(previous)


def run_side(call, side):
    if side == "fwd":
        return lstmcy.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    return lstmcy.lstm_backward(*call.bwd_args, **call.bwd_kwargs)


@pytest.mark.parametrize("sides, path, make, exc, name_re, expect_re, cfg", CATALOGUE)
def test_catalogue(sides, path, make, exc, name_re, expect_re, cfg, no_kernels):
    for side in (("fwd", "bwd") if sides == "both" else (sides,)):
        if side == "fwd" and path.split(".")[0] in ("dy", "dh", "dc") + SAVED:
            continue
        call = base_call(cfg)
        set_arg(call, side, path, make(get_arg(call, side, path)))
        call.fwd_args, call.bwd_args = _freeze(call.fwd_args), _freeze(call.bwd_args)
        call.fwd_kwargs = {k: _freeze(v) for k, v in call.fwd_kwargs.items()}
        call.bwd_kwargs = {k: _freeze(v) for k, v in call.bwd_kwargs.items()}
        args = call.fwd_args if side == "fwd" else call.bwd_args
        kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
        snapshot = _snapshot(_arrays_in(args) + _arrays_in(kwargs))
        no_kernels.clear()
        with pytest.raises(exc) as info:
            run_side(call, side)
        message = str(info.value)
        assert type(info.value) is exc, f"{side}: {type(info.value).__name__}: {message}"
        assert re.search(name_re, message), f"{side}: message does not name {name_re!r}: {message}"
        assert re.search(expect_re, message), \
            f"{side}: message does not state {expect_re!r}: {message}"
        assert not no_kernels, f"{side}: a kernel ran before the error: {no_kernels}"
        _assert_untouched(snapshot)


def test_catalogue_covers_every_argument():
    """Each parameter of both functions appears in at least one catalogue entry."""
    import inspect
    covered = set()
    for param in CATALOGUE:
        sides, path = param.values[0], param.values[1]
        head = path.split(".")[0].replace("kw:", "")
        covered.add(head)
    for function in (lstmcy.lstm_forward, lstmcy.lstm_backward):
        names = set(inspect.signature(function).parameters)
        missing = names - covered
        assert not missing, f"{function.__name__}: no catalogue entry for {sorted(missing)}"


@pytest.mark.parametrize("cfg", [BASE, PACKED], ids=["time_major", "packed"])
def test_base_calls_are_valid(cfg):
    """The catalogue's base problems run: each failure above is due to its one change."""
    call = base_call(cfg)
    run_side(call, "fwd")
    run_side(call, "bwd")


# ---------------------------------------------------------------------------
# Accepted variants: things that look unusual but are valid
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["list-batch_sizes", "int32-batch_sizes", "uint8-batch_sizes",
                                     "hx-list", "output_mask-array", "output_mask-numpy-bools",
                                     "saved-tuples", "numpy-int-num_layers", "numpy-float-dropout",
                                     "empty-dropout_masks-list"])
def test_accepted_variants(variant):
    cfg = PACKED if "batch_sizes" in variant else BASE
    if variant == "empty-dropout_masks-list":
        cfg = Config(T=T, B=B, I=I, H=H, L=1)
    call = base_call(cfg)
    fk, bk = call.fwd_kwargs, call.bwd_kwargs
    if variant == "list-batch_sizes":
        fk["batch_sizes"] = bk["batch_sizes"] = [int(v) for v in fk["batch_sizes"]]
    elif variant == "int32-batch_sizes":
        fk["batch_sizes"] = bk["batch_sizes"] = np.asarray(fk["batch_sizes"], dtype=np.int32)
    elif variant == "uint8-batch_sizes":
        fk["batch_sizes"] = bk["batch_sizes"] = np.asarray(fk["batch_sizes"], dtype=np.uint8)
    elif variant == "hx-list":
        call.fwd_args[1] = call.bwd_args[1] = list(call.fwd_args[1])
    elif variant == "output_mask-array":
        bk["output_mask"] = np.array([True, False, True, True])
    elif variant == "output_mask-numpy-bools":
        bk["output_mask"] = tuple(np.bool_(v) for v in (True, True, False, True))
    elif variant == "saved-tuples":
        for pos in range(6, 13):
            call.bwd_args[pos] = tuple(call.bwd_args[pos])
    elif variant == "numpy-int-num_layers":
        fk["num_layers"] = bk["num_layers"] = np.int64(L)
    elif variant == "numpy-float-dropout":
        fk["dropout"] = bk["dropout"] = np.float32(0.3)
    elif variant == "empty-dropout_masks-list":
        bk["dropout_masks"] = []
    expected = run_side(base_call(cfg), "bwd")
    run_side(call, "fwd")
    got = run_side(call, "bwd")
    mask = bk["output_mask"]
    for k, (a, b) in enumerate(zip(got[:3], expected[:3])):
        if mask[k]:
            np.testing.assert_array_equal(a, b)
        else:
            assert a is None


def test_validation_of_valid_readonly_inputs_leaves_them_untouched():
    """A valid forward and backward on read-only inputs: no error, inputs bitwise unchanged,
    and no output shares memory with an input."""
    call = base_call()
    call.fwd_args, call.bwd_args = _freeze(call.fwd_args), _freeze(call.bwd_args)
    call.bwd_kwargs["dropout_masks"] = _freeze(call.bwd_kwargs["dropout_masks"])
    inputs = _arrays_in(call.fwd_args) + _arrays_in(call.bwd_args) + \
        _arrays_in(call.bwd_kwargs["dropout_masks"])
    snapshot = _snapshot(inputs)
    outputs = list(run_side(call, "fwd")[:3]) + _arrays_in(run_side(call, "bwd"))
    _assert_untouched(snapshot)
    for out in outputs:
        for array in inputs:
            assert not np.shares_memory(out, array), "an output aliases an input"


@pytest.mark.parametrize("zero", ["T", "B", "I", "H"])
def test_outputs_never_alias_inputs_at_zero_sizes(zero):
    """With T = 0, h_n equals h0 and dh_prev equals dh: they must still be new arrays."""
    cfg = Config(**{**dict(T=3, B=2, I=3, H=2, L=2, bidirectional=True), zero: 0})
    call = base_call(cfg)
    inputs = _arrays_in(call.fwd_args) + _arrays_in(call.bwd_args)
    outputs = _arrays_in(run_side(call, "fwd")[:3]) + _arrays_in(run_side(call, "bwd"))
    for out in outputs:
        for array in inputs:
            assert out is not array and not (out.size and np.shares_memory(out, array)), \
                "an output aliases an input"


class _ArrayLikeRaising:
    """An array-like whose conversion fails (as a torch tensor that requires grad does)."""

    shape = (T, B, I)

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad")


def test_array_conversion_failure_is_a_type_error():
    call = base_call()
    call.fwd_args[0] = _ArrayLikeRaising()
    with pytest.raises(TypeError, match=r"input.*converting.*failed"):
        run_side(call, "fwd")


def test_torch_tensor_requiring_grad_is_a_type_error():
    torch = pytest.importorskip("torch")
    call = base_call()
    call.fwd_args[0] = torch.zeros((T, B, I), dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match=r"input"):
        run_side(call, "fwd")


@pytest.mark.parametrize("change, error, message", [
    (dict(T=-1), ValueError, "T must be >= 0, got -1"),
    (dict(B=-3), ValueError, "B must be >= 0"),
    (dict(T=5.5), TypeError, "T must be an int, got float 5.5"),
    (dict(T=None), TypeError, "T must be an int"),
    (dict(hidden_size="6"), TypeError, "hidden_size must be an int"),
    (dict(input_size=-1), ValueError, "input_size must be >= 0"),
    (dict(num_layers=0), ValueError, "num_layers must be >= 1"),
    (dict(proj_size=6), ValueError, "proj_size must be smaller than hidden_size"),
    (dict(proj_size=-1), ValueError, "proj_size must be >= 0"),
    (dict(dtype=np.int64), TypeError, "dtype must be float16, bfloat16, float32 or float64"),
    (dict(batch_sizes=[5, 1]), ValueError, "batch_sizes must have T = 5 entries, the first B = 3"),
    (dict(batch_sizes=[3, 4, 1, 1, 1]), ValueError, "batch_sizes must be non-increasing"),
    (dict(dtype=None), TypeError, "dtype must be float16, bfloat16, float32 or float64, got None"),
    (dict(dtype="no such type"), TypeError, "dtype must be float16"),
    (dict(backward="no"), TypeError, "backward must be a bool, got str"),
    # Sizes lstm_forward refuses (the BLAS's 32-bit dimensions), refused before any work
    # in proportion to them (2**36 once ran an O(H) loop for minutes).
    (dict(hidden_size=2 ** 31), ValueError, r"the width \(input_size, hidden_size\) is too large"),
    (dict(hidden_size=2 ** 29), ValueError, r"hidden_size is too large: 4\*num_directions\*H"),
    (dict(hidden_size=2 ** 36), ValueError, "is too large"),
    (dict(hidden_size=2 ** 63), ValueError, "is too large"),
    (dict(input_size=2 ** 63), ValueError, r"the width \(input_size, hidden_size\) is too large"),
    (dict(T=2 ** 40, batch_sizes=None), ValueError, r"the batch \(T, B\) is too large: T\*B"),
])
def test_required_workspace_refuses_bad_sizes(change, error, message):
    kwargs = dict(T=5, B=3, input_size=4, hidden_size=6)
    kwargs.update(change)
    with pytest.raises(error, match=message):
        lstmcy.LSTMPlan.required_workspace(**kwargs)


def test_required_workspace_refuses_what_lstm_forward_refuses_at_once():
    """The size check runs before anything in proportion to the sizes: every refusal above
    takes well under a second (it once took 3-4 s at H = 2**31 and minutes at 2**36)."""
    start = time.perf_counter()
    for H in (2 ** 31, 2 ** 36, 2 ** 62):
        with pytest.raises(ValueError, match="too large"):
            lstmcy.LSTMPlan.required_workspace(1, 1, 1, H)
    assert time.perf_counter() - start < 0.5
    # The largest H the BLAS can take is still answered, with a finite number of bytes.
    assert lstmcy.LSTMPlan.required_workspace(1, 1, 1, (2 ** 31 - 1) // 4 - 1) > 2 ** 31


def test_required_workspace_takes_numpy_integers():
    got = lstmcy.LSTMPlan.required_workspace(np.int64(5), np.int32(3), np.int64(4), np.int64(6),
                                             batch_sizes=np.array([3, 3, 2, 1, 1]))
    assert got == lstmcy.LSTMPlan.required_workspace(5, 3, 4, 6, batch_sizes=[3, 3, 2, 1, 1]) > 0
