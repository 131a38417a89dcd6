"""Argument checking and normalisation shared by ``lstm_forward`` and ``lstm_backward``.

Everything here runs before any computation. It never writes to the caller's arrays:
conversions (dtype, contiguity) make new arrays, and unchanged arrays are only read.
"""
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral, Real

import numpy as np

from lstmcy._engine.cache import SAVED_NAMES
from lstmcy._engine.dispatch import kernels as _kernels

#: The parameters of one layer and direction, in the order of ``params`` (PyTorch's
#: ``_flat_weights``): the biases only with ``has_bias``, w_hr only with a projection.
PARAM_NAMES = ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr")
# Native-byte-order float32 / float64 (a byte-swapped dtype compares unequal).
_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_F32, _F64 = _NATIVE_FLOATS


def _is_bfloat16(dtype):
    return dtype.name == "bfloat16"


def is_supported_float(dtype):
    """Whether ``dtype`` is one of float16, bfloat16, float32, float64."""
    return dtype in (np.float16, np.float32, np.float64) or _is_bfloat16(dtype)


def compute_dtype_for(dtype):
    """float32/float64 are computed natively, float16/bfloat16 in float32."""
    return _F64 if dtype == _F64 else _F32


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"array of shape {value.shape} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}" if isinstance(value, (int, float, str)) else type(value).__name__


def as_array(name, value, ndim):
    """Return ``value`` as an ndarray of rank ``ndim`` (any rank if None) with a floating dtype.

    No copy is made when ``value`` already is an ndarray.
    """
    if (type(value) is np.ndarray and value.dtype in _NATIVE_FLOATS
            and (ndim is None or value.ndim == ndim)):
        return value  # the common case, kept cheap: it runs for every array of every call
    kind = f"{ndim}-D floating-point array" if ndim is not None else "floating-point array"
    if value is None:
        raise TypeError(f"{name} must be a {kind}, got None")
    if isinstance(value, (str, bytes, list, tuple, dict, set)) or np.isscalar(value) or not (
            isinstance(value, np.ndarray) or hasattr(value, "__array__")
            or hasattr(value, "__array_interface__")):
        raise TypeError(f"{name} must be a {kind}, got {_describe(value)}")
    try:
        array = np.asarray(value)
    except Exception as exc:  # e.g. a torch tensor that requires grad, or on another device
        raise TypeError(f"{name} must be a {kind}; converting {_describe(value)} to a numpy "
                        f"array failed: {exc}") from exc
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a {kind}, got {_describe(value)}")
    if array.dtype.kind in "fc" and not array.dtype.isnative:
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64 in native "
                        f"byte order, got {array.dtype.str} (convert with .astype(native dtype))")
    if array.dtype.kind not in "fV" or not is_supported_float(array.dtype):
        raise TypeError(
            f"{name} must have dtype float16, bfloat16, float32 or float64, got {array.dtype}")
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    return array


def expect_shape(name, array, shape, meaning=None):
    if array.shape != tuple(shape):
        what = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{what}, got {array.shape}")


def as_list(name, value, length, what):
    if value is None or isinstance(value, (str, bytes, np.ndarray)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of {length} arrays ({what}), got {_describe(value)}")
    if len(value) != length:
        raise ValueError(f"{name} must hold {length} arrays ({what}), got {len(value)}")
    return list(value)


def check_bool(name, value):
    if type(value) is bool:
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {_describe(value)}")
    return bool(value)


class ArgumentNames:
    """What messages call a call's arguments: the numpy API's names (:data:`NUMPY_NAMES`);
    the torch operators name theirs as ``aten::lstm`` does (``lstmcy.torch._ops``)."""

    input = "input"
    params = "params"
    h0 = "hx[0] (h0)"
    c0 = "hx[1] (c0)"
    dy = "dy"
    dh = "dh"
    dc = "dc"

    def param(self, shapes, k):
        """``params[k]`` named by what it is."""
        return shapes.param_label(k)

    def first_weight(self, k, kind):
        """The first layer's forward-direction parameter ``k``, a ``kind`` (``w_ih``, ...)."""
        return f"params[{k}] ({kind} of layer 0, forward direction)"


NUMPY_NAMES = ArgumentNames()


@dataclass(frozen=True)
class Shapes:
    """The shape of every argument of a call, from its sizes: the one description that
    every check (full, fast and trusted, forward and backward) compares against.

    ``P`` is the size of h: ``proj_size`` with a projection, else ``H``.
    """

    T: int
    B: int
    I: int
    H: int
    P: int
    L: int
    D: int
    has_bias: bool
    projected: bool

    # The shapes below are computed once per instance (every call checks its arrays against
    # them, and shapes_of hands out one instance per set of sizes).

    def __hash__(self):
        # Computed once: plans and caches key on a call's Shapes at every call.
        return self._hash

    @cached_property
    def _hash(self):
        return hash((self.T, self.B, self.I, self.H, self.P, self.L, self.D, self.has_bias,
                     self.projected))

    def in_size(self, layer):
        return self.I if layer == 0 else self.D * self.P

    @property
    def param_names(self):
        """The names of one layer and direction's parameters, in order."""
        return _param_names(self.has_bias, self.projected)

    @cached_property
    def params(self):
        """The shapes of ``params``, in order."""
        return _param_shapes(self.I, self.H, self.P, self.L, self.D, self.has_bias,
                             self.projected)

    def param_label(self, k):
        """``params[k]`` named by what it is, for messages."""
        per = len(self.param_names)
        layer, direction = divmod(k // per, self.D)
        return (f"params[{k}] ({self.param_names[k % per]} of layer {layer}, "
                f"{'reverse' if direction else 'forward'} direction)")

    @cached_property
    def h_state(self):
        return (self.L * self.D, self.B, self.P)

    @cached_property
    def c_state(self):
        return (self.L * self.D, self.B, self.H)

    @cached_property
    def _saved_h(self):
        return (self.T, self.B, self.P)

    @cached_property
    def _saved_c(self):
        return (self.T, self.B, self.H)

    def saved(self, name):
        """The shape of one saved activation (time-major)."""
        return self._saved_h if name == "h" else self._saved_c

    @cached_property
    def mask(self):
        """The shape of one dropout mask (a layer's output, time-major)."""
        return (self.T, self.B, self.D * self.P)

    @property
    def output_features(self):
        return self.D * self.P


_shapes_cache = {}


def shapes_of(T, B, I, H, P, L, D, has_bias, projected):
    """The :class:`Shapes` of these sizes (one shared instance per set of sizes)."""
    key = (T, B, I, H, P, L, D, has_bias, projected)
    shapes = _shapes_cache.get(key)
    if shapes is None:
        shapes = _cached(_shapes_cache, key, Shapes(*key))
    return shapes


def _param_names(has_bias, projected):
    return PARAM_NAMES[:4 if has_bias else 2] + (("w_hr",) if projected else ())


_param_shapes_cache = {}


def _param_shapes(I, H, P, L, D, has_bias, projected):
    key = (I, H, P, L, D, has_bias, projected)
    shapes = _param_shapes_cache.get(key)
    if shapes is None:
        shapes = []
        for layer in range(L):
            in_size = I if layer == 0 else D * P
            per_direction = [(4 * H, in_size), (4 * H, P)]
            if has_bias:
                per_direction += [(4 * H,), (4 * H,)]
            if projected:
                per_direction.append((P, H))
            shapes += per_direction * D
        shapes = _cached(_param_shapes_cache, key, tuple(shapes))
    return shapes


@dataclass
class Problem:
    """Sizes, layout and normalised arrays of one call.

    Row maps: the row of ``(t, b)`` in a caller-layout 2-D view is
    ``step_row[t] + b * batch_stride``; ``rows_packed`` says that row equals the packed
    row ``packed_start[t] + b`` for every active ``(t, b)``.
    """

    T: int
    B: int
    I: int
    H: int
    P: int                      # size of h: H, or proj_size
    L: int
    D: int
    projected: bool
    dtype: np.dtype
    compute_dtype: np.dtype
    has_bias: bool
    layout: str                 # "time_major", "batch_first", "packed" or "padded_2d"
    batch_sizes: np.ndarray     # intp [T]
    packed_start: np.ndarray    # intp [T]
    uniform: bool               # every step has all B rows
    step_row: np.ndarray        # intp [T], caller layout
    batch_stride: int
    rows_packed: bool
    x_rows: np.ndarray          # input as [rows, I], compute dtype, C-contiguous
    h0: np.ndarray              # [L*D, B, P]
    c0: np.ndarray              # [L*D, B, H]
    weights: list               # per layer*D + d: (w_ih, w_hh, bias_sum) in compute dtype
    input_shape: tuple
    N: int                      # number of active (t, b) positions
    projections: list = None    # per layer*D + d: w_hr [P, H] (compute dtype), if projected
    shapes: Shapes = None       # the expected shape of every argument

    def output_shape(self, features=None):
        """Shape of y / dy (caller layout) with ``features`` columns (default: D*P)."""
        return self.input_shape[:-1] + (self.D * self.P if features is None else features,)

    @property
    def time_major_map(self):
        """Row map of an internal time-major ``[T*B, F]`` buffer."""
        return _step_rows(self.T if self.B else 0, self.B), 1, self.uniform


# Shape-derived index arrays, shared between calls (read-only: the kernels only read
# them). Small calls spend more time building them than computing; the caches are
# cleared when they grow large (many distinct shapes).
_CACHE_LIMIT = 256
_step_rows_cache = {}
_row_maps_cache = {}


def _cached(cache, key, value):
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _read_only(array):
    array.flags.writeable = False
    return array


def _step_rows(T, B):
    """``arange(T) * B`` (intp, read-only): the step rows of a time-major ``[T*B, F]`` buffer."""
    key = (T, B)
    rows = _step_rows_cache.get(key)
    if rows is None:
        rows = _cached(_step_rows_cache, key, _read_only(np.arange(T, dtype=np.intp) * B))
    return rows


def _row_maps(T, B, layout, sizes):
    """``(batch_sizes, packed_start, uniform, step_row, batch_stride, rows_packed, N)``.

    ``sizes`` is the checked ``batch_sizes`` (None: every step has ``B`` rows, and the
    result, read-only, is shared by all calls of that shape).
    """
    if sizes is None:
        if B == 0:
            # No rows: no step has work, whatever T is (and maps of T steps could be huge).
            T = 0
        key = (T, B, layout)
        maps = _row_maps_cache.get(key)
        if maps is None:
            maps = _row_maps(T, B, layout, np.full(T, B, dtype=np.intp))
            for array in maps[:2] + maps[3:4]:  # shared, so read-only
                _read_only(array)
            maps = _cached(_row_maps_cache, key, maps)
        return maps
    packed_start = np.zeros(T, dtype=np.intp)
    if T > 1:
        np.cumsum(sizes[:-1], out=packed_start[1:])
    uniform = bool(T == 0 or sizes[-1] == B)
    if layout == "batch_first":
        step_row, stride = np.arange(T, dtype=np.intp), T
    elif layout == "packed":
        step_row, stride = packed_start.copy(), 1
    else:  # time_major, padded_2d
        step_row, stride = np.arange(T, dtype=np.intp) * B, 1
    rows_packed = bool(np.array_equal(step_row, packed_start) and (stride == 1 or np.all(sizes <= 1)))
    N = int(packed_start[-1] + sizes[-1]) if T else 0
    return sizes, packed_start, uniform, step_row, stride, rows_packed, N


_ready_array = _kernels.ready_array


def to_compute(array, dtype):
    """C-contiguous, aligned array in ``dtype``; no copy when it already is one (the
    kernels load whole elements: a buffer at an odd address is copied)."""
    ready = _ready_array(array, dtype)
    if ready is not None:
        return ready
    out = np.ascontiguousarray(array, dtype=dtype)
    return out if out.flags.aligned else out.copy()


#: Largest dimension (rows, columns, leading dimension) the BLAS behind
#: ``scipy.linalg.cython_blas`` can address: its integer arguments are 32-bit.
BLAS_INT_MAX = 2 ** 31 - 1


def _check_batch_sizes(batch_sizes):
    expected = "a 1-D integer array [T] (non-increasing, positive, batch_sizes[0] == B)"
    if isinstance(batch_sizes, (str, bytes, dict, set)) or np.isscalar(batch_sizes):
        raise TypeError(f"batch_sizes must be {expected}, got {_describe(batch_sizes)}")
    try:
        sizes = np.asarray(batch_sizes)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"batch_sizes must be {expected}, got {_describe(batch_sizes)}") from exc
    if sizes.size == 0 and sizes.dtype.kind in "fiu":
        sizes = sizes.astype(np.int64)  # [] (float64 to numpy) is the empty sequence
    if sizes.dtype.kind not in "iu":
        raise TypeError(f"batch_sizes must be {expected}, got dtype {sizes.dtype}")
    if sizes.ndim != 1:
        raise ValueError(f"batch_sizes must be 1-D ([T]), got shape {sizes.shape}")
    if sizes.size and sizes.min() < 1:
        raise ValueError("batch_sizes must be positive (each step has at least one sequence), "
                         f"got minimum {sizes.min()}")
    if sizes.size and sizes.max() > BLAS_INT_MAX:
        raise ValueError(f"batch_sizes must be at most {BLAS_INT_MAX} (the BLAS uses 32-bit "
                         f"integers), got maximum {sizes.max()}")
    sizes = sizes.astype(np.intp)
    if sizes.size > 1 and np.any(np.diff(sizes) > 0):
        raise ValueError("batch_sizes must be non-increasing (sequences sorted longest first, "
                         "as in PyTorch's PackedSequence)")
    return sizes


def check_blas_limits(T, B, I, H, L, D, proj_size=0,
                      names=("input", "input", "params (hidden size H)")):
    """Raise ValueError when a matrix the kernels hand to BLAS has a dimension above 2**31 - 1.

    ``scipy.linalg.cython_blas`` takes 32-bit ``int`` sizes and leading dimensions; a
    larger value would wrap around instead of failing. Row counts are at most ``T*B``
    (and ``B`` even when ``T`` is 0);
    column counts and leading dimensions at most ``4*D*H`` or ``max(I, D*P) + D*P`` (and
    ``+ H`` with a projection, P its size, else H).
    Runs before anything proportional to the sizes is allocated. ``names``: what the
    message calls the arguments that set the rows, the widths, and H.
    """
    P = proj_size or H
    width = (max(I, D * P) if L > 1 else I) + D * P + (H if proj_size else 0)
    if max(B, T * B, width, 4 * D * H) <= BLAS_INT_MAX:
        return  # the common case: no message to format
    columns = ("input size + num_directions*proj_size + H" if proj_size
               else "input size + num_directions*H")
    rows, widths, hidden = names
    limits = [
        (rows, B, f"the batch size B = {B}"),
        (rows, T * B, f"T*B = {T}*{B} = {T * B} time steps times batch"),
        (widths, width, f"{columns} = {width}"),
        (hidden, 4 * D * H, f"4*num_directions*H = {4 * D * H}"),
    ]
    for name, value, what in limits:
        if value > BLAS_INT_MAX:
            raise ValueError(f"{name} is too large: {what} exceeds {BLAS_INT_MAX}, the largest "
                             "matrix dimension the BLAS (32-bit integers) can address")


def check_int(name, value, minimum):
    """``value`` as an int of at least ``minimum`` (numpy integers too; not bools)."""
    if type(value) is int and value >= minimum:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_proj_size(proj_size):
    if type(proj_size) is int and proj_size >= 0:
        return proj_size
    return check_int("proj_size", proj_size, 0)


def check_problem(input, hx, params, *, has_bias, num_layers, bidirectional, batch_first,
                  batch_sizes=None, proj_size=0, names=None):
    """Check the arguments common to forward and backward; return their :class:`Problem`.

    The one check of these arguments. Every test is cheap when it passes (a type, a rank,
    a shape or a dtype compared); the message naming the argument is formatted only when
    one fails.

    Parameters
    ----------
    input, hx, params, has_bias, num_layers, bidirectional, batch_first, batch_sizes, \
proj_size
        As ``lstm_forward`` takes them.
    names : ArgumentNames, optional
        What messages call the arguments (default: the numpy API's names).
    """
    names = NUMPY_NAMES if names is None else names
    has_bias = check_bool("has_bias", has_bias)
    bidirectional = check_bool("bidirectional", bidirectional)
    batch_first = check_bool("batch_first", batch_first)
    proj_size = check_proj_size(proj_size)
    L = check_int("num_layers", num_layers, 1)
    D = 2 if bidirectional else 1
    projected = proj_size > 0

    x = as_array(names.input, input, None)
    sizes = None if batch_sizes is None else _check_batch_sizes(batch_sizes)
    per_dir = 2 + 2 * has_bias + projected
    if type(params) not in (list, tuple) or len(params) != L * D * per_dir:
        params = as_list(names.params, params, L * D * per_dir,
                         f"{per_dir} per layer and direction for num_layers={L}, "
                         f"bidirectional={bidirectional}, has_bias={has_bias}, "
                         f"proj_size={proj_size}")
    H = _hidden_size(params, per_dir, proj_size, names)
    P = proj_size if projected else H

    if x.ndim == 3:
        if batch_first:
            B, T, I = x.shape
        else:
            T, B, I = x.shape
        if sizes is not None:
            if sizes.shape[0] != T:
                raise ValueError(f"batch_sizes must have length T={T} (the input's time axis), "
                                 f"got {sizes.shape[0]}")
            if T and sizes[0] != B:
                raise ValueError(f"batch_sizes[0] must equal the batch size B={B}, got {sizes[0]}")
        layout = "batch_first" if batch_first else "time_major"
    elif x.ndim == 2:
        if sizes is None:
            raise ValueError(f"{names.input} must be 3-D [T, B, I] ([B, T, I] if batch_first); "
                             f"2-D input (got shape {x.shape}) needs batch_sizes")
        T = sizes.shape[0]
        I = x.shape[1]
        if T:
            B = int(sizes[0])
        else:
            B = _batch_from_hx(hx, L * D)
        rows = x.shape[0]
        if rows == int(sizes.sum()):
            layout = "packed"
        elif rows == T * B:
            layout = "padded_2d"
        else:
            raise ValueError(f"2-D {names.input} must have sum(batch_sizes)={int(sizes.sum())} "
                             f"rows (packed) or T*B={T * B} rows (padded), got {rows}")
    else:
        raise ValueError(f"{names.input} must be 3-D [T, B, I] ([B, T, I] if batch_first) or "
                         f"2-D with batch_sizes, got shape {x.shape}")
    check_blas_limits(T, B, I, H, L, D, proj_size)
    dtype = x.dtype
    shapes = shapes_of(T, B, I, H, P, L, D, has_bias, projected)

    same_dtype = True
    for k, shape in enumerate(shapes.params):
        arr = params[k]
        if type(arr) is not np.ndarray or arr.shape != shape:
            label = names.param(shapes, k)
            arr = as_array(label, arr, len(shape))
            expect_shape(label, arr, shape)
        same_dtype = same_dtype and arr.dtype == dtype

    if hx is None:
        h0 = c0 = None
    else:
        if type(hx) not in (tuple, list) or len(hx) != 2:
            if isinstance(hx, np.ndarray) or not isinstance(hx, (list, tuple)):
                raise TypeError(f"hx must be a tuple (h0, c0) or None, got {_describe(hx)}")
            raise ValueError(f"hx must be a tuple (h0, c0) of 2 arrays, got {len(hx)}")
        h0, c0 = hx
        if type(h0) is not np.ndarray or h0.shape != shapes.h_state:
            h0 = as_array(names.h0, h0, 3)
            expect_shape(names.h0, h0, shapes.h_state,
                         "[num_layers*num_directions, B, proj_size]" if projected
                         else "[num_layers*num_directions, B, H]")
        if type(c0) is not np.ndarray or c0.shape != shapes.c_state:
            c0 = as_array(names.c0, c0, 3)
            expect_shape(names.c0, c0, shapes.c_state, "[num_layers*num_directions, B, H]")
        same_dtype = same_dtype and h0.dtype == dtype and c0.dtype == dtype

    if not same_dtype:
        named = [(names.param(shapes, k), params[k]) for k in range(len(shapes.params))]
        if h0 is not None:
            named += [(names.h0, h0), (names.c0, c0)]
        _raise_mixed_dtypes(names.input, dtype, named)
    return _make_problem(x, h0, c0, params, shapes, layout, sizes)


def _hidden_size(params, per_dir, proj_size, names):
    """H, read from the first layer's weights (w_hr with a projection, else w_hh), after
    checking the array it is read from."""
    if proj_size:
        w_hr0, w_ih0 = params[per_dir - 1], params[0]
        if (type(w_hr0) is np.ndarray and w_hr0.ndim == 2 and proj_size == w_hr0.shape[0]
                and proj_size < w_hr0.shape[1] and type(w_ih0) is np.ndarray and w_ih0.ndim == 2
                and w_ih0.shape[0] == 4 * w_hr0.shape[1]):
            return w_hr0.shape[1]
        name = names.first_weight(per_dir - 1, "w_hr")
        w_hr0 = as_array(name, w_hr0, 2)
        H = w_hr0.shape[1]
        expect_shape(name, w_hr0, (proj_size, H),
                     "[proj_size, H]: its second axis sets the hidden size H")
        w_ih0 = params[0]
        rows = w_ih0.shape[0] if getattr(w_ih0, "ndim", 0) == 2 else None
        if rows is not None and rows != 4 * H and rows % 4 == 0 and rows > 0:
            # Which of the two is wrong is not known: name both.
            raise ValueError(f"{name} has H = {H} columns but {names.first_weight(0, 'w_ih')} "
                             f"has 4*H = {rows} rows (H = {rows // 4}): the two must agree on "
                             f"the hidden size")
        if proj_size >= H:
            raise ValueError(f"proj_size must be smaller than the hidden size H={H}, got {proj_size}")
        return H
    w_hh0 = params[1]
    if type(w_hh0) is np.ndarray and w_hh0.ndim == 2 and w_hh0.shape[0] == 4 * w_hh0.shape[1]:
        return w_hh0.shape[1]
    name = names.first_weight(1, "w_hh")
    w_hh0 = as_array(name, w_hh0, 2)
    H = w_hh0.shape[1]
    expect_shape(name, w_hh0, (4 * H, H), "[4*H, H]: its second axis sets the hidden size H")
    return H


def _raise_mixed_dtypes(input_name, dtype, named):
    """Raise the TypeError of the first of ``named`` ``(name, array)`` whose dtype is not a
    floating-point one, or else is not ``dtype`` (the input's)."""
    for name, arr in named:
        as_array(name, arr, None)
    for name, arr in named:
        if arr.dtype != dtype:
            raise TypeError(f"all arrays must share one dtype: {input_name} is {dtype} but {name} "
                            f"is {arr.dtype} (convert explicitly; there is no silent promotion)")


def _make_problem(x, h0, c0, params, shapes, layout, sizes):
    """The :class:`Problem` of checked arguments (``params``: the arrays, in order)."""
    dtype = x.dtype
    fields = _problem_fields(shapes, layout, sizes, dtype, x.shape)
    compute = fields["compute_dtype"]
    x_rows = to_compute(x, compute)
    if layout == "batch_first" or layout == "time_major":
        x_rows = x_rows.reshape(shapes.T * shapes.B, shapes.I)
    if h0 is None:
        h0 = np.zeros(shapes.h_state, dtype=compute)
        c0 = np.zeros(shapes.c_state, dtype=compute)
    else:
        h0 = to_compute(h0, compute)
        c0 = to_compute(c0, compute)

    per_dir = len(shapes.param_names)
    weights = []
    projections = [] if shapes.projected else None
    arrays = [to_compute(arr, compute) for arr in params]
    for k in range(0, len(arrays), per_dir):
        if shapes.has_bias:
            bias = arrays[k + 2] + arrays[k + 3]
        else:
            bias = np.zeros(4 * shapes.H, dtype=compute)
        weights.append((arrays[k], arrays[k + 1], bias))
        if projections is not None:
            projections.append(arrays[k + per_dir - 1])

    problem = Problem.__new__(Problem)
    problem.__dict__.update(fields)
    problem.x_rows, problem.h0, problem.c0 = x_rows, h0, c0
    problem.weights, problem.projections = weights, projections
    return problem


def reads_callers_arrays(p, input, hx, params):
    """Whether the :class:`Problem` ``p`` of ``input``, ``hx`` and ``params`` reads those
    very arrays (its input rows a view of ``input``), so that a later call handed the same
    objects sees their values as they are then, as a fresh check of them would."""
    cdt = p.compute_dtype
    if p.dtype != cdt or type(input) is not np.ndarray or to_compute(input, cdt) is not input:
        return False
    if hx is not None and (p.h0 is not hx[0] or p.c0 is not hx[1]):
        return False
    per_dir = len(p.shapes.param_names)
    for k, (w_ih, w_hh, _) in enumerate(p.weights):
        if w_ih is not params[k * per_dir] or w_hh is not params[k * per_dir + 1]:
            return False
    return p.projections is None or all(
        w_hr is params[(k + 1) * per_dir - 1] for k, w_hr in enumerate(p.projections))


# The fields of a Problem that its sizes, layout and dtype fix (all but the arrays): one
# dict per kind of padded call, copied into each of its Problems.
_fields_cache = {}


def _problem_fields(shapes, layout, sizes, dtype, input_shape):
    """The fields of a :class:`Problem` but ``x_rows``, ``h0``, ``c0``, ``weights`` and
    ``projections`` (shared when ``sizes`` is None: the row maps are then read-only)."""
    key = (shapes, layout, dtype) if sizes is None else None
    fields = _fields_cache.get(key) if key is not None else None
    if fields is None:
        T, B = shapes.T, shapes.B
        sizes, packed_start, uniform, step_row, stride, rows_packed, N = _row_maps(T, B, layout,
                                                                                   sizes)
        fields = dict(T=T, B=B, I=shapes.I, H=shapes.H, P=shapes.P, L=shapes.L, D=shapes.D,
                      projected=shapes.projected, dtype=dtype,
                      compute_dtype=compute_dtype_for(dtype), has_bias=shapes.has_bias,
                      layout=layout, batch_sizes=sizes, packed_start=packed_start,
                      uniform=uniform, step_row=step_row, batch_stride=stride,
                      rows_packed=rows_packed, input_shape=tuple(input_shape), N=N,
                      shapes=shapes)
        if key is not None:
            _cached(_fields_cache, key, fields)
    return fields


def trusted_problem(input, h0, c0, params, *, hidden_size, has_bias, num_layers, bidirectional,
                    batch_first, proj_size=0):
    """The :class:`Problem` of a padded call whose caller has checked its arguments itself.

    For :mod:`lstmcy.torch`, whose module checks its tensors as ``torch.nn.LSTM`` does
    (dimensions, sizes, devices, one float32/float64 dtype) before every call: ``input`` is
    a 3-D ndarray, ``h0``/``c0`` None or ``[L*D, B, P]`` / ``[L*D, B, H]`` ndarrays,
    ``params`` the ndarrays of an ``nn.LSTM``. Only what a kernel could run past is checked
    again (the parameter shapes, the BLAS size limit), and without :func:`check_problem`'s
    per-argument messages, which such a caller never needs.
    """
    L, D = num_layers, 2 if bidirectional else 1
    if batch_first:
        B, T, I = input.shape
    else:
        T, B, I = input.shape
    H = hidden_size
    P = proj_size or H
    shapes = shapes_of(T, B, I, H, P, L, D, has_bias, proj_size > 0)
    if len(params) != len(shapes.params):
        raise ValueError(f"params has {len(params)} arrays, expected {len(shapes.params)}")
    for k, (value, shape) in enumerate(zip(params, shapes.params)):
        if value.shape != shape:
            raise ValueError(f"params[{k}] has shape {value.shape}, expected {shape}")
    check_blas_limits(T, B, I, H, L, D, proj_size)
    return _make_problem(input, h0, c0, params, shapes,
                         "batch_first" if batch_first else "time_major", None)


def _batch_from_hx(hx, n_states):
    if hx is not None and isinstance(hx, (list, tuple)) and len(hx) == 2 and hasattr(hx[0], "shape") \
            and len(hx[0].shape) == 3:
        return int(hx[0].shape[1])
    return 0


def check_dropout(dropout):
    if type(dropout) is float and 0.0 <= dropout < 1.0:
        return dropout  # the common case, without the slower isinstance(Real) test
    if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, Real):
        raise TypeError(f"dropout must be a float in [0, 1), got {_describe(dropout)}")
    dropout = float(dropout)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return dropout


def check_seed(seed):
    """Return a ``numpy.random.Generator`` for ``seed`` (None, int >= 0, sequence of such ints,
    ``SeedSequence``, ``BitGenerator`` or ``Generator``), raising TypeError/ValueError naming it.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    expected = ("None, a non-negative int, a sequence of such ints, a numpy SeedSequence, "
                "BitGenerator or Generator")
    if isinstance(seed, (bool, np.bool_, float, complex, str, bytes)):
        raise TypeError(f"seed must be {expected}, got {_describe(seed)}")
    try:
        return np.random.default_rng(seed)
    except TypeError as exc:
        raise TypeError(f"seed must be {expected}, got {_describe(seed)}") from exc
    except ValueError as exc:
        raise ValueError(f"seed must be {expected}, got {_describe(seed)} ({exc})") from exc


def check_output_mask(output_mask):
    if type(output_mask) is tuple and len(output_mask) == 4:
        a, b, c, d = output_mask
        if type(a) is bool and type(b) is bool and type(c) is bool and type(d) is bool:
            return output_mask  # the common case: already a tuple of 4 bools
    if isinstance(output_mask, np.ndarray) and output_mask.dtype == np.bool_ and output_mask.ndim == 1:
        output_mask = tuple(output_mask)
    if isinstance(output_mask, (str, bytes, np.ndarray)) or not isinstance(output_mask, (list, tuple)):
        raise TypeError("output_mask must be a tuple of 4 bools (dx, dh_prev, dc_prev, dparams), "
                        f"got {_describe(output_mask)}")
    if len(output_mask) != 4:
        raise ValueError("output_mask must hold 4 bools (dx, dh_prev, dc_prev, dparams), "
                         f"got {len(output_mask)}")
    return tuple(check_bool(f"output_mask[{k}]", v) for k, v in enumerate(output_mask))


def check_backward(input, hx, params, dy, dh, dc, saved, *, batch_sizes, has_bias, num_layers,
                   dropout, train, bidirectional, batch_first, dropout_masks, proj_size=0,
                   names=None):
    """Check ``lstm_backward``'s arguments (with :func:`check_problem` for those it shares
    with the forward; messages formatted only on failure, as there).

    Returns
    -------
    problem : Problem
    arrays : dict
        ``dy``, ``dh`` and ``dc`` (absent when None), each name of :data:`SAVED_NAMES`
        mapped to its list, and ``dropout_masks`` when the masks are in use. Arrays are
        the caller's, unconverted (shapes and the shared dtype checked).
    """
    names = NUMPY_NAMES if names is None else names
    train = check_bool("train", train)
    dropout = check_dropout(dropout)
    p = check_problem(input, hx, params, has_bias=has_bias, num_layers=num_layers,
                      bidirectional=bidirectional, batch_first=batch_first,
                      batch_sizes=batch_sizes, proj_size=proj_size, names=names)
    shapes, dtype, L, D = p.shapes, p.dtype, p.L, p.D
    arrays = check_output_gradients(p, dy, dh, dc, names)
    n_states = L * D
    for name, items in zip(SAVED_NAMES, saved):
        if not isinstance(items, (list, tuple)) or len(items) != n_states:
            width = "P" if name == "h" and p.projected else "H"
            items = as_list(name, items, n_states, f"one [T, B, {width}] array per layer and "
                            f"direction: num_layers={L}, bidirectional={D == 2}")
        shape = shapes.saved(name)
        for a in items:
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
                meaning = f"time-major [T, B, {'P' if name == 'h' and p.projected else 'H'}]"
                items = [check_array(f"{name}[{k}]", b, shape, dtype, meaning,
                                     input_name=names.input) for k, b in enumerate(items)]
                break
        arrays[name] = list(items)
    masked = train and dropout > 0 and L > 1
    if not masked:
        if dropout_masks is not None and not (isinstance(dropout_masks, (list, tuple))
                                              and len(dropout_masks) == 0):
            # Masks that would be ignored mean the call does not describe the forward that
            # made them (typically dropout or train forgotten): refuse rather than silently
            # return the gradients of a network without dropout.
            raise ValueError(
                "dropout_masks must be None unless dropout > 0, train and num_layers > 1 (got "
                f"masks with dropout={dropout}, train={train}, num_layers={L}); pass the dropout "
                "and train given to lstm_forward")
        return p, arrays
    mask_features = "D*P" if p.projected else "D*H"
    if dropout_masks is None:
        raise ValueError("dropout_masks is required when dropout > 0, train and num_layers > 1: "
                         "pass cache.dropout_masks from lstm_forward")
    items = as_list("dropout_masks", dropout_masks, L - 1,
                    f"one [T, B, {mask_features}] array per layer boundary")
    arrays["dropout_masks"] = [
        check_array(f"dropout_masks[{k}]", m, shapes.mask, dtype, f"[T, B, {mask_features}]",
                    input_name=names.input) for k, m in enumerate(items)]
    return p, arrays


def check_output_gradients(p, dy, dh, dc, names=None):
    """Check a backward's output gradients against its :class:`Problem` ``p``.

    Returns
    -------
    dict
        ``dy``, and ``dh`` and ``dc`` unless None: the caller's arrays, unconverted.
    """
    names = NUMPY_NAMES if names is None else names
    shapes, dtype = p.shapes, p.dtype
    arrays = {"dy": check_array(names.dy, dy, p.output_shape(), dtype, "like the output y",
                                ndim=None, input_name=names.input)}
    if dh is not None:
        arrays["dh"] = check_array(names.dh, dh, shapes.h_state, dtype, "like h_n",
                                   input_name=names.input)
    if dc is not None:
        arrays["dc"] = check_array(names.dc, dc, shapes.c_state, dtype, "like c_n",
                                   input_name=names.input)
    return arrays


def check_array(name, value, shape, dtype, meaning=None, *, ndim=3, input_name="input"):
    """``value`` as an array of ``shape`` and ``dtype`` (the input's ``input_name``), or the
    error naming it: its type and rank (unless ``ndim`` is None), its shape, its dtype."""
    if type(value) is np.ndarray and value.shape == shape and value.dtype == dtype:
        return value
    array = as_array(name, value, ndim)
    expect_shape(name, array, shape, meaning)
    _raise_mixed_dtypes(input_name, dtype, [(name, array)])
    return array
