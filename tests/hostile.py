"""Valid calls and malformations of them, shared by the reliability tests and ``tools/fuzz.py``.

A :class:`Config` fixes the sizes and options of one problem; :func:`make_call` turns it
into the complete argument lists of ``lstm_forward`` and ``lstm_backward`` (random
values, the saved activations taken from :func:`lstmcy.reference.lstm_forward`, so
building a call never touches the code under test). :data:`MUTATIONS` maps a name to a
function that breaks one argument of such a call in a way the validation must catch
or tolerate: the mutated call may only return normally or raise ``ValueError`` /
``TypeError``.

Nothing here imports torch or pytest, so the fuzz script can use it in a bare child
process.
"""
import copy
from dataclasses import dataclass, replace

import numpy as np

from lstmcy import reference
from lstmcy._engine.cache import SAVED_NAMES as SAVED

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BFLOAT16 = None

LAYOUTS = ("time_major", "batch_first", "packed", "padded_2d", "padded_3d")
FLOAT_DTYPES = tuple(d for d in (np.dtype(np.float64), np.dtype(np.float32),
                                 np.dtype(np.float16), BFLOAT16) if d is not None)


@dataclass(frozen=True)
class Config:
    """Sizes and options of one LSTM problem."""

    T: int = 3
    B: int = 2
    I: int = 3
    H: int = 2
    L: int = 1
    bidirectional: bool = False
    has_bias: bool = True
    layout: str = "time_major"
    dtype: np.dtype = np.dtype(np.float64)
    dropout: float = 0.0
    with_hx: bool = True
    with_dhdc: bool = True
    lengths_seed: int = 0

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    @property
    def varlen(self):
        return self.layout in ("packed", "padded_2d", "padded_3d")


@dataclass
class Call:
    """Arguments of one forward and one backward call (``cfg`` describes them)."""

    cfg: Config
    fwd_args: list
    fwd_kwargs: dict
    bwd_args: list
    bwd_kwargs: dict

    def copy(self):
        return copy.deepcopy(self)


def batch_sizes_for(cfg):
    """Non-increasing batch sizes with ``batch_sizes[0] == B`` (lengths drawn from the seed)."""
    if cfg.T == 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(cfg.lengths_seed)
    lengths = np.sort(rng.integers(1, cfg.T + 1, size=cfg.B))[::-1].copy()
    if cfg.B:
        lengths[0] = cfg.T
    return np.array([(lengths > t).sum() for t in range(cfg.T)], dtype=np.int64)


def make_params(rng, cfg):
    params = []
    for layer in range(cfg.L):
        in_size = cfg.I if layer == 0 else cfg.D * cfg.H
        for _ in range(cfg.D):
            params.append(rng.uniform(-0.8, 0.8, (4 * cfg.H, in_size)))
            params.append(rng.uniform(-0.8, 0.8, (4 * cfg.H, cfg.H)))
            if cfg.has_bias:
                params += [rng.uniform(-0.5, 0.5, 4 * cfg.H), rng.uniform(-0.5, 0.5, 4 * cfg.H)]
    return [p.astype(cfg.dtype) for p in params]


def _sequence_shape(cfg, features, batch_sizes):
    if cfg.layout == "batch_first":
        return (cfg.B, cfg.T, features)
    if cfg.layout == "packed":
        return (int(batch_sizes.sum()), features)
    if cfg.layout == "padded_2d":
        return (cfg.T * cfg.B, features)
    return (cfg.T, cfg.B, features)


def make_call(cfg, rng, seed=0):
    """All arguments of ``lstm_forward`` and ``lstm_backward`` for ``cfg`` (random values).

    The saved activations and dropout masks come from the numpy reference forward.
    """
    batch_sizes = batch_sizes_for(cfg) if cfg.varlen else None
    if cfg.layout == "packed" and cfg.T == 0:
        batch_sizes = np.zeros(0, dtype=np.int64)
    x = rng.standard_normal(_sequence_shape(cfg, cfg.I, batch_sizes if batch_sizes is not None
                                            else np.zeros(0, np.int64))).astype(cfg.dtype)
    params = make_params(rng, cfg)
    state = (cfg.L * cfg.D, cfg.B, cfg.H)
    hx = (rng.standard_normal(state).astype(cfg.dtype),
          rng.standard_normal(state).astype(cfg.dtype)) if cfg.with_hx else None
    kwargs = dict(has_bias=cfg.has_bias, num_layers=cfg.L, dropout=cfg.dropout,
                  bidirectional=cfg.bidirectional, batch_first=cfg.layout == "batch_first",
                  batch_sizes=batch_sizes)
    # A 2-D input with T = 0 takes B from hx; keep hx then.
    fwd_kwargs = dict(kwargs, train=True, seed=seed)
    y, h_n, c_n, cache = reference.lstm_forward(x, hx, params, **fwd_kwargs)
    dy = rng.standard_normal(y.shape).astype(cfg.dtype)
    dh = rng.standard_normal(state).astype(cfg.dtype) if cfg.with_dhdc else None
    dc = rng.standard_normal(state).astype(cfg.dtype) if cfg.with_dhdc else None
    bwd_kwargs = dict(kwargs, train=True, output_mask=(True, True, True, True),
                      dropout_masks=cache.dropout_masks)
    return Call(cfg, [x, hx, params], fwd_kwargs,
                [x, hx, params, dy, dh, dc, *cache.saved()], bwd_kwargs)


def run_with_threads(call, threads):
    """lstmcy's forward, then backward on its cache, with ``threads`` kernel threads.

    Returns ``([y, h_n, c_n, dx, dh_prev, dc_prev, *dparams], (bwd_args, bwd_kwargs))``.
    """
    import lstmcy

    saved = lstmcy.get_num_threads()
    lstmcy.set_num_threads(threads)
    try:
        y, h_n, c_n, cache = lstmcy.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
        args = list(call.bwd_args)
        args[6:13] = cache.saved()
        kwargs = dict(call.bwd_kwargs, dropout_masks=cache.dropout_masks)
        dx, dh, dc, dparams = lstmcy.lstm_backward(*args, **kwargs)
    finally:
        lstmcy.set_num_threads(saved)
    return [np.array(a) for a in (y, h_n, c_n, dx, dh, dc, *dparams)], (args, kwargs)


def force_schedules(request, forward=None, backward=None):
    """Make the calling thread's plain calls use the schedules ``forward(T, B, I, H, D,
    n_threads, projected, itemsize=...)`` / ``backward(..., small_gemms=...)`` return
    (None: lstmcy's own) until the test ends (``request``: pytest's fixture). The schedules
    see the thread count of the call, not the CPUs' cap on it, so that splits finer than
    this machine's cores are run too."""
    import lstmcy
    from lstmcy._engine import plan as _core
    from lstmcy._engine import schedule as _schedule

    policy = _schedule.SchedulePolicy(forward or _schedule.forward_schedule,
                                      backward or _schedule.backward_schedule,
                                      cap_at_cpus=False)
    previous = _core.use_thread_plan(lstmcy.LSTMPlan(schedules=policy))
    request.addfinalizer(lambda: _core.use_thread_plan(previous))


def most_split(request, split="rows"):
    """Schedules with the recurrences split as finely as the thread count allows: a row
    group per thread and direction however few rows each gets (``split="rows"``), or the
    hidden units cut in as many parts (``"units"``, forward and backward, where there is no
    projection); the bit-fixing parts are lstmcy's own (``request``: pytest's fixture)."""
    from lstmcy._engine import schedule as _schedule

    def finest(own, B, D, n_threads, projected):
        per_direction = max(1, n_threads // D)
        if split == "units" and not projected:
            return own._replace(split=_schedule.SPLIT_UNITS, groups=per_direction, pack_pieces=1)
        return own._replace(split=_schedule.SPLIT_ROWS, groups=max(1, min(per_direction, B)),
                            pack_pieces=n_threads)

    def forward(T, B, I, H, D, n_threads, projected=False, itemsize=4):
        own = _schedule.forward_schedule(T, B, I, H, D, n_threads, projected, itemsize)
        return finest(own, B, D, n_threads, projected)

    def backward(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
        own = _schedule.backward_schedule(T, B, I, H, D, n_threads, projected, small_gemms)
        return finest(own, B, D, n_threads, projected)

    force_schedules(request, forward, backward)


def random_config(rng, max_size=4, allow_zero=True, dtypes=FLOAT_DTYPES):
    """A random valid :class:`Config` (small sizes, every option)."""
    low = 0 if allow_zero else 1
    T, B, I, H = (int(v) for v in rng.integers(low, max_size + 1, size=4))
    layout = LAYOUTS[rng.integers(len(LAYOUTS))]
    if layout in ("packed", "padded_2d") and T > 0 and B == 0:
        B = 1  # batch_sizes must be positive, so B >= 1 whenever T >= 1
    if layout == "padded_3d" and T > 0 and B == 0:
        B = 1
    return Config(T=T, B=B, I=I, H=H, L=int(rng.integers(1, 4)),
                  bidirectional=bool(rng.integers(2)), has_bias=bool(rng.integers(2)),
                  layout=layout, dtype=dtypes[rng.integers(len(dtypes))],
                  dropout=float(rng.choice([0.0, 0.0, 0.3, 0.9])),
                  with_hx=bool(rng.random() < 0.8) or (layout in ("packed", "padded_2d") and T == 0),
                  with_dhdc=bool(rng.random() < 0.8), lengths_seed=int(rng.integers(1 << 30)))


# ---------------------------------------------------------------------------
# Malformations. Each takes (call, rng) and modifies the call in place; it returns a
# short description. Arguments are addressed as ("fwd"|"bwd", position or keyword).
# ---------------------------------------------------------------------------

FWD_ARRAY_POSITIONS = {"input": 0}
BWD_ARRAY_POSITIONS = {"input": 0, "dy": 3, "dh": 4, "dc": 5}
BWD_LIST_POSITIONS = {name: 6 + k for k, name in enumerate(SAVED)}


def _bad_values(rng):
    """Things that are not float arrays."""
    choices = [None, [1.0, 2.0], [[1.0]], "abc", b"abc", 3, 2.5, 1j, object(), {"a": 1},
               np.float64(1.0), np.array(1.0), np.arange(6).reshape(1, 2, 3),
               np.zeros((1, 2, 3), dtype=np.complex128), np.zeros((1, 2, 3), dtype=object),
               np.zeros((1, 2, 3), dtype=bool), np.zeros((1, 2, 3), dtype=np.int32),
               np.zeros((1, 2, 3), dtype=np.longdouble), np.zeros((1, 2, 3), dtype=">f8"),
               np.zeros((1, 2, 3), dtype=[("a", "f8")]), np.zeros((1, 2, 3), dtype="U3"),
               np.zeros((1, 2, 3), dtype="datetime64[s]"), np.zeros((1, 2, 3), dtype="m8[s]"),
               np.zeros((1, 2, 3), dtype="S2")]
    return choices[rng.integers(len(choices))]


def _small_array(value):
    """An ndarray that may be copied (not one of the huge zero-stride views)."""
    return isinstance(value, np.ndarray) and value.size <= 1_000_000


def _reshape_wrong(array, rng):
    """``array`` with one wrong dimension, a wrong rank, a transposition or a zero-size."""
    if not _small_array(array):
        return np.zeros((2, 2, 2))
    kind = rng.integers(6)
    shape = list(array.shape)
    if kind == 0 and shape:  # one dimension off by +-1 (or to 0)
        axis = rng.integers(len(shape))
        shape[axis] = max(0, shape[axis] + int(rng.choice([-1, 1, 2])))
        return np.resize(array, shape) if array.size and np.prod(shape) else np.zeros(shape, array.dtype)
    if kind == 1:  # drop a dimension
        return array.reshape(-1) if array.ndim != 1 else array.reshape(1, -1)
    if kind == 2:  # add a dimension
        return array[None]
    if kind == 3 and array.ndim >= 2:  # transposed (shape swaps when non-square)
        return np.swapaxes(array, 0, 1)
    if kind == 4:  # 0-d
        return np.asarray(array.reshape(-1)[:1].sum() if array.size else 0.0, dtype=array.dtype)
    return np.zeros(tuple(s + 1 for s in shape), dtype=array.dtype)


def _other_dtype(array, rng):
    if not _small_array(array):
        return array
    others = [d for d in FLOAT_DTYPES if d != array.dtype]
    return array.astype(others[rng.integers(len(others))])


def _pick_array_target(call, rng):
    """Path to a random array argument of the forward or backward call."""
    side = "fwd" if rng.random() < 0.4 else "bwd"
    args = call.fwd_args if side == "fwd" else call.bwd_args
    targets = [("input", (0,))]
    if args[1] is not None:
        targets += [("hx[0]", (1, 0)), ("hx[1]", (1, 1))]
    targets += [(f"params[{k}]", (2, k)) for k in range(len(args[2]))]
    if side == "bwd":
        targets += [(n, (p,)) for n, p in (("dy", 3), ("dh", 4), ("dc", 5)) if args[p] is not None]
        for name, pos in BWD_LIST_POSITIONS.items():
            targets += [(f"{name}[{k}]", (pos, k)) for k in range(len(args[pos]))]
        masks = call.bwd_kwargs.get("dropout_masks")
        if masks:
            targets += [(f"dropout_masks[{k}]", ("dropout_masks", k)) for k in range(len(masks))]
    name, path = targets[rng.integers(len(targets))]
    return side, name, path


def _get(call, side, path):
    args = call.fwd_args if side == "fwd" else call.bwd_args
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    head, *rest = path
    value = kwargs[head] if isinstance(head, str) else args[head]
    for k in rest:
        value = value[k]
    return value


def _set(call, side, path, new):
    args = call.fwd_args if side == "fwd" else call.bwd_args
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    head, *rest = path
    container, key = (kwargs, head) if isinstance(head, str) else (args, head)
    if not rest:
        container[key] = new
        return
    parent = container[key]
    parent = list(parent)
    parent[rest[0]] = new if len(rest) == 1 else parent[rest[0]]
    if len(rest) > 1:  # nested deeper than one level does not occur
        raise AssertionError(path)
    container[key] = tuple(parent) if head == 1 else parent


def m_array_bad_value(call, rng):
    side, name, path = _pick_array_target(call, rng)
    value = _bad_values(rng)
    _set(call, side, path, value)
    return f"{side} {name} := {type(value).__name__}"


def m_array_bad_shape(call, rng):
    side, name, path = _pick_array_target(call, rng)
    _set(call, side, path, _reshape_wrong(_get(call, side, path), rng))
    return f"{side} {name} reshaped"


def m_array_other_dtype(call, rng):
    side, name, path = _pick_array_target(call, rng)
    _set(call, side, path, _other_dtype(_get(call, side, path), rng))
    return f"{side} {name} other dtype"


def m_array_strided(call, rng):
    """Valid: a non-contiguous view or a Fortran-ordered copy (must be accepted)."""
    side, name, path = _pick_array_target(call, rng)
    a = _get(call, side, path)
    if _small_array(a) and a.ndim >= 1:
        if rng.random() < 0.5:
            big = np.repeat(a, 2, axis=-1)
            _set(call, side, path, big[..., ::2])
        else:
            _set(call, side, path, np.asfortranarray(a))
    return f"{side} {name} strided"


def m_array_nonfinite(call, rng):
    """Valid: NaN, +-Inf or extreme values inside one array (must not crash)."""
    side, name, path = _pick_array_target(call, rng)
    a = _get(call, side, path)
    if _small_array(a) and a.size:
        a = a.copy()
        value = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, 5e-324, 1e300])
        with np.errstate(over="ignore"):
            a.reshape(-1)[rng.integers(a.size)] = value
        _set(call, side, path, a)
    return f"{side} {name} non-finite value"


def m_list_length(call, rng):
    side = "fwd" if rng.random() < 0.3 else "bwd"
    args = call.fwd_args if side == "fwd" else call.bwd_args
    choices = [2] + (list(BWD_LIST_POSITIONS.values()) if side == "bwd" else [])
    pos = int(rng.choice(choices))
    items = list(args[pos])
    if items and rng.random() < 0.5:
        items.pop(int(rng.integers(len(items))))
    else:
        items.append(items[0] if items else np.zeros((1, 1)))
    args[pos] = items
    return f"{side} arg {pos} list length {len(items)}"


def m_list_bad_container(call, rng):
    side = "fwd" if rng.random() < 0.3 else "bwd"
    args = call.fwd_args if side == "fwd" else call.bwd_args
    choices = [1, 2] + (list(BWD_LIST_POSITIONS.values()) if side == "bwd" else [])
    pos = int(rng.choice(choices))
    value = [None, "abc", 3, np.zeros((2, 2, 2)), {"a": 1}, (np.zeros(1),), object()][rng.integers(7)]
    args[pos] = value
    return f"{side} arg {pos} := {type(value).__name__}"


def m_num_layers(call, rng):
    side = "fwd" if rng.random() < 0.5 else "bwd"
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    value = [0, -1, -(2 ** 63), 2 ** 64, 1.0, 2.5, "2", None, True, np.int64(0),
             kwargs["num_layers"] + 1, np.float64(1)][rng.integers(12)]
    kwargs["num_layers"] = value
    return f"{side} num_layers := {value!r}"


def m_dropout(call, rng):
    side = "fwd" if rng.random() < 0.5 else "bwd"
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    value = [-0.1, 1.0, 1.5, np.nan, np.inf, -np.inf, "0.1", None, True, [0.1],
             1 - 1e-17, 0.99999][rng.integers(12)]
    kwargs["dropout"] = value
    return f"{side} dropout := {value!r}"


def m_flag(call, rng):
    side = "fwd" if rng.random() < 0.5 else "bwd"
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    key = ["has_bias", "bidirectional", "batch_first", "train"][rng.integers(4)]
    value = [None, 1, 0, "yes", np.array([True]), not kwargs[key]][rng.integers(6)]
    kwargs[key] = value
    return f"{side} {key} := {value!r}"


def m_batch_sizes(call, rng):
    side = "fwd" if rng.random() < 0.5 else "bwd"
    kwargs = call.fwd_kwargs if side == "fwd" else call.bwd_kwargs
    bs = kwargs["batch_sizes"]
    T = call.cfg.T
    B = call.cfg.B
    base = np.full(T, B, dtype=np.int64) if bs is None else np.asarray(bs).copy()
    kind = rng.integers(14)
    if kind == 0 and base.size >= 2:  # increases
        base[-1] = base[0] + 1
    elif kind == 1 and base.size:  # contains 0
        base[-1] = 0
    elif kind == 2 and base.size:  # negative
        base[rng.integers(base.size)] = -int(rng.integers(1, 3))
    elif kind == 3 and base.size:  # does not start at B
        base[0] = base[0] + 1
    elif kind == 4:  # wrong length
        base = np.append(base, 1)
    elif kind == 5:
        base = base.astype(np.float64)
    elif kind == 6:
        base = base.reshape(1, -1)
    elif kind == 7:
        base = "abc"
    elif kind == 8:
        base = [int(v) for v in base]  # a list of ints: acceptable
    elif kind == 9:
        base = base.astype(np.uint64)
        if base.size:
            base[-1] = np.uint64(2 ** 64 - 1)
    elif kind == 10 and base.size:  # huge
        base[:] = 2 ** 62
    elif kind == 11:
        base = base.astype(bool)
    elif kind == 12:
        base = base.astype(np.int8)  # a narrow integer dtype: acceptable
    else:
        base = base[:-1] if base.size else np.array([1], dtype=np.int64)
    kwargs["batch_sizes"] = base
    return f"{side} batch_sizes kind {kind}"


def m_output_mask(call, rng):
    value = [(True,), (True, True, True), (True,) * 5, None, "1111", [1, 1, 1, 1],
             (True, True, True, None), np.array([True] * 4), (False,) * 4,
             [False, True, False, True]][rng.integers(10)]
    call.bwd_kwargs["output_mask"] = value
    return f"output_mask := {value!r}"


def m_dropout_masks(call, rng):
    cfg = call.cfg
    kind = rng.integers(6)
    masks = call.bwd_kwargs.get("dropout_masks")
    if kind == 0:
        call.bwd_kwargs["dropout_masks"] = None
    elif kind == 1:
        call.bwd_kwargs["dropout_masks"] = "abc"
    elif kind == 2:
        call.bwd_kwargs["dropout_masks"] = [np.ones((cfg.T, cfg.B, cfg.D * cfg.H + 1), cfg.dtype)] * max(cfg.L - 1, 1)
    elif kind == 3:
        call.bwd_kwargs["dropout_masks"] = (list(masks) if isinstance(masks, (list, tuple)) else []) + [np.ones((cfg.T, cfg.B, cfg.D * cfg.H), cfg.dtype)]
    elif kind == 4:
        call.bwd_kwargs["dropout_masks"] = [np.ones((cfg.T, cfg.B, cfg.D * cfg.H), np.float32 if cfg.dtype != np.float32 else np.float64)] * max(cfg.L - 1, 1)
    else:
        call.bwd_kwargs["dropout"] = 0.5
        call.bwd_kwargs["num_layers"] = call.bwd_kwargs["num_layers"]
    return f"dropout_masks kind {kind}"


def m_seed(call, rng):
    value = [-1, "abc", 1.5, object(), [1, 2], 2 ** 200, None][rng.integers(7)]
    call.fwd_kwargs["seed"] = value
    call.fwd_kwargs["dropout"] = 0.5
    return f"seed := {value!r}"


def m_swap_saved(call, rng):
    """Valid shapes, inconsistent contents: two saved lists exchanged (must not crash)."""
    a, b = rng.choice(list(BWD_LIST_POSITIONS.values()), size=2, replace=False)
    call.bwd_args[a], call.bwd_args[b] = call.bwd_args[b], call.bwd_args[a]
    return f"saved lists {a} <-> {b} swapped"


def m_readonly(call, rng):
    """Valid: every array read-only."""
    def freeze(v):
        if isinstance(v, np.ndarray):
            v = v.view()
            v.flags.writeable = False
        return v
    for args in (call.fwd_args, call.bwd_args):
        for k, v in enumerate(args):
            if isinstance(v, (list, tuple)):
                args[k] = type(v)(freeze(a) for a in v)
            else:
                args[k] = freeze(v)
    return "read-only arrays"


def m_huge_broadcast(call, rng):
    """Shapes that a 32-bit BLAS cannot address, as zero-stride views (no memory)."""
    cfg = call.cfg
    side = "fwd" if rng.random() < 0.5 else "bwd"
    args = call.fwd_args if side == "fwd" else call.bwd_args
    big = 2 ** 31 + int(rng.integers(0, 3))
    args[0] = np.broadcast_to(np.zeros((), cfg.dtype), (1, big, max(cfg.I, 1)))
    return f"{side} input broadcast to B={big}"


def m_drop_optional(call, rng):
    """Valid: hx, dh or dc replaced by None (zeros), when that keeps B known."""
    cfg = call.cfg
    kind = rng.integers(3)
    if kind == 0 and not (cfg.layout in ("packed", "padded_2d") and cfg.T == 0):
        call.fwd_args[1] = None
        call.bwd_args[1] = None
    elif kind == 1:
        call.bwd_args[4] = None
    else:
        call.bwd_args[5] = None
    return f"optional argument {kind} := None"


def m_garbage_saved(call, rng):
    """Valid shapes, arbitrary contents in one saved list (must not crash)."""
    pos = int(rng.choice(list(BWD_LIST_POSITIONS.values())))
    with np.errstate(over="ignore"):  # 1e30 overflows float16 to inf: fine here
        items = [np.asarray(rng.standard_normal(np.shape(a)) * 10 ** rng.uniform(-3, 30)).astype(a.dtype)
                 if isinstance(a, np.ndarray) else a for a in call.bwd_args[pos]]
    call.bwd_args[pos] = items
    return f"saved list {pos} random contents"


def m_size_mismatch(call, rng):
    """One argument taken from a call with another T, B, I or H."""
    cfg = call.cfg
    field = ["T", "B", "I", "H"][rng.integers(4)]
    other_cfg = replace(cfg, **{field: getattr(cfg, field) + 1})
    other = make_call(other_cfg, rng)
    side = "fwd" if rng.random() < 0.4 else "bwd"
    args = call.fwd_args if side == "fwd" else call.bwd_args
    other_args = other.fwd_args if side == "fwd" else other.bwd_args
    pos = int(rng.integers(len(args)))
    args[pos] = other_args[pos]
    return f"{side} arg {pos} from a call with {field}+1"


#: Mutations after which the call is still valid: it must succeed.
MUST_SUCCEED = {"array_strided", "array_nonfinite", "readonly", "swap_saved", "drop_optional",
                "garbage_saved"}

MUTATIONS = {
    "drop_optional": m_drop_optional,
    "garbage_saved": m_garbage_saved,
    "size_mismatch": m_size_mismatch,
    "array_bad_value": m_array_bad_value,
    "array_bad_shape": m_array_bad_shape,
    "array_other_dtype": m_array_other_dtype,
    "array_strided": m_array_strided,
    "array_nonfinite": m_array_nonfinite,
    "list_length": m_list_length,
    "list_bad_container": m_list_bad_container,
    "num_layers": m_num_layers,
    "dropout": m_dropout,
    "flag": m_flag,
    "batch_sizes": m_batch_sizes,
    "output_mask": m_output_mask,
    "dropout_masks": m_dropout_masks,
    "seed": m_seed,
    "swap_saved": m_swap_saved,
    "readonly": m_readonly,
    "huge_broadcast": m_huge_broadcast,
}


def apply_mutation(call, name, rng):
    """Apply mutation ``name``; return its description.

    Mutations are written for an intact call; composed with another one they may find
    an argument already replaced by something they cannot handle, and are then skipped.
    """
    try:
        return MUTATIONS[name](call, rng)
    except Exception as exc:  # noqa: BLE001 - a limitation of the generator, not a finding
        return f"{name} skipped ({type(exc).__name__})"


def run_call(call, which, lstmcy_module=None):
    """Run the forward (``which="fwd"``) or the backward of ``call`` with lstmcy."""
    if lstmcy_module is None:
        import lstmcy as lstmcy_module
    if which == "fwd":
        return lstmcy_module.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    return lstmcy_module.lstm_backward(*call.bwd_args, **call.bwd_kwargs)
