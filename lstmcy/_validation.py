"""Argument checking and normalisation shared by ``lstm_forward`` and ``lstm_backward``.

Everything here runs before any computation. It never writes to the caller's arrays:
conversions (dtype, contiguity) make new arrays, and unchanged arrays are only read.
"""
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

GATE_NAMES = ("w_ih", "w_hh", "b_ih", "b_hh")
SAVED_NAMES = ("i", "g", "f", "o", "h", "c", "tanhc")
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
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {_describe(value)}")
    return bool(value)


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
    L: int
    D: int
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
    h0: np.ndarray              # [L*D, B, H]
    c0: np.ndarray
    weights: list               # per layer*D + d: (w_ih, w_hh, bias_sum) in compute dtype
    input_shape: tuple
    N: int                      # number of active (t, b) positions

    def output_shape(self, features):
        """Shape of y / dy (caller layout) with ``features`` columns."""
        return self.input_shape[:-1] + (features,)

    @property
    def time_major_map(self):
        """Row map of an internal time-major ``[T*B, F]`` buffer."""
        return _step_rows(self.T, self.B), 1, self.uniform


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


def to_compute(array, dtype):
    """C-contiguous array in ``dtype``; no copy when it already is one."""
    return np.ascontiguousarray(array, dtype=dtype)


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


def check_blas_limits(T, B, I, H, L, D):
    """Raise ValueError when a matrix the kernels hand to BLAS has a dimension above 2**31 - 1.

    ``scipy.linalg.cython_blas`` takes 32-bit ``int`` sizes and leading dimensions; a
    larger value would wrap around instead of failing. Row counts are at most ``T*B``
    (and ``B`` even when ``T`` is 0);
    column counts and leading dimensions at most ``4*D*H`` or ``max(I, D*H) + D*H``.
    Runs before anything proportional to the sizes is allocated.
    """
    width = max(I, D * H) if L > 1 else I
    if max(B, T * B, width + D * H, 4 * D * H) <= BLAS_INT_MAX:
        return  # the common case: no message to format
    limits = [
        ("input", B, f"the batch size B = {B}"),
        ("input", T * B, f"T*B = {T}*{B} = {T * B} time steps times batch"),
        ("input", width + D * H, f"input size + num_directions*H = {width + D * H}"),
        ("params (hidden size H)", 4 * D * H, f"4*num_directions*H = {4 * D * H}"),
    ]
    for name, value, what in limits:
        if value > BLAS_INT_MAX:
            raise ValueError(f"{name} is too large: {what} exceeds {BLAS_INT_MAX}, the largest "
                             "matrix dimension the BLAS (32-bit integers) can address")


def check_problem(input, hx, params, *, has_bias, num_layers, bidirectional, batch_first,
                  batch_sizes, arrays_for_dtype=()):
    """Validate the arguments common to forward and backward; return a :class:`Problem`.

    ``arrays_for_dtype`` lists further ``(name, array)`` pairs that must share the dtype.
    """
    problem = _problem_fast(input, hx, params, has_bias, num_layers, bidirectional, batch_first,
                            batch_sizes)
    if problem is not None and all(arr.dtype == problem.dtype for _, arr in arrays_for_dtype):
        return problem
    has_bias = check_bool("has_bias", has_bias)
    bidirectional = check_bool("bidirectional", bidirectional)
    batch_first = check_bool("batch_first", batch_first)
    if isinstance(num_layers, (bool, np.bool_)) or not isinstance(num_layers, Integral):
        raise TypeError(f"num_layers must be an int, got {_describe(num_layers)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    L = int(num_layers)
    D = 2 if bidirectional else 1

    x = as_array("input", input, None)
    sizes = None if batch_sizes is None else _check_batch_sizes(batch_sizes)

    # Weights first: they fix H.
    per_dir = 4 if has_bias else 2
    params = as_list("params", params, L * D * per_dir,
                     f"{per_dir} per layer and direction for num_layers={L}, "
                     f"bidirectional={bidirectional}, has_bias={has_bias}")
    w_hh0 = as_array("params[1] (w_hh of layer 0, forward direction)", params[1], 2)
    H = w_hh0.shape[1]
    expect_shape("params[1] (w_hh of layer 0, forward direction)", w_hh0, (4 * H, H),
                 "[4*H, H]: its second axis sets the hidden size H")

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
            raise ValueError("input must be 3-D [T, B, I] ([B, T, I] if batch_first); "
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
            raise ValueError(f"2-D input must have sum(batch_sizes)={int(sizes.sum())} rows "
                             f"(packed) or T*B={T * B} rows (padded), got {rows}")
    else:
        raise ValueError(f"input must be 3-D [T, B, I] ([B, T, I] if batch_first) or 2-D with "
                         f"batch_sizes, got shape {x.shape}")
    check_blas_limits(T, B, I, H, L, D)
    dtype = x.dtype

    checked_params = []
    for layer in range(L):
        in_size = I if layer == 0 else D * H
        for direction in range(D):
            base = (layer * D + direction) * per_dir
            where = f"layer {layer}, {'reverse' if direction else 'forward'} direction"
            expected = [(4 * H, in_size), (4 * H, H), (4 * H,), (4 * H,)]
            for k in range(per_dir):
                name = f"params[{base + k}] ({GATE_NAMES[k]} of {where})"
                arr = as_array(name, params[base + k], len(expected[k]))
                expect_shape(name, arr, expected[k])
                checked_params.append((name, arr))

    # Initial states.
    if hx is None:
        h0 = c0 = None
    else:
        if isinstance(hx, np.ndarray) or not isinstance(hx, (list, tuple)):
            raise TypeError(f"hx must be a tuple (h0, c0) or None, got {_describe(hx)}")
        if len(hx) != 2:
            raise ValueError(f"hx must be a tuple (h0, c0) of 2 arrays, got {len(hx)}")
        state_shape = (L * D, B, H)
        h0 = as_array("hx[0] (h0)", hx[0], 3)
        c0 = as_array("hx[1] (c0)", hx[1], 3)
        expect_shape("hx[0] (h0)", h0, state_shape, "[num_layers*num_directions, B, H]")
        expect_shape("hx[1] (c0)", c0, state_shape, "[num_layers*num_directions, B, H]")

    named = [("input", x)] + checked_params
    if h0 is not None:
        named += [("hx[0] (h0)", h0), ("hx[1] (c0)", c0)]
    named += list(arrays_for_dtype)
    for name, arr in named:
        if arr.dtype != dtype:
            raise TypeError(f"all arrays must share one dtype: input is {dtype} but {name} is "
                            f"{arr.dtype} (convert explicitly; there is no silent promotion)")

    return _make_problem(x, h0, c0, [arr for _, arr in checked_params], T, B, I, H, L, D,
                         has_bias, layout, sizes)


def _make_problem(x, h0, c0, params, T, B, I, H, L, D, has_bias, layout, sizes):
    """The :class:`Problem` of checked arguments (``params``: the arrays, in order)."""
    dtype = x.dtype
    compute = compute_dtype_for(dtype)
    sizes, packed_start, uniform, step_row, stride, rows_packed, N = _row_maps(T, B, layout, sizes)
    if layout == "batch_first":
        x_rows = to_compute(x, compute).reshape(B * T, I)
    elif layout == "time_major":
        x_rows = to_compute(x, compute).reshape(T * B, I)
    else:
        x_rows = to_compute(x, compute)

    if h0 is None:
        h0 = np.zeros((L * D, B, H), dtype=compute)
        c0 = np.zeros((L * D, B, H), dtype=compute)
    else:
        h0 = to_compute(h0, compute)
        c0 = to_compute(c0, compute)

    per_dir = 4 if has_bias else 2
    weights = []
    arrays = [to_compute(arr, compute) for arr in params]
    for k in range(L * D):
        w_ih, w_hh = arrays[k * per_dir], arrays[k * per_dir + 1]
        if has_bias:
            bias = arrays[k * per_dir + 2] + arrays[k * per_dir + 3]
        else:
            bias = np.zeros(4 * H, dtype=compute)
        weights.append((w_ih, w_hh, bias))

    return Problem(T=T, B=B, I=I, H=H, L=L, D=D, dtype=dtype, compute_dtype=compute,
                   has_bias=has_bias, layout=layout, batch_sizes=sizes, packed_start=packed_start,
                   uniform=uniform, step_row=step_row, batch_stride=stride, rows_packed=rows_packed,
                   x_rows=x_rows, h0=h0, c0=c0, weights=weights, input_shape=tuple(x.shape), N=N)


_param_shapes_cache = {}


def _param_shapes(I, H, L, D, has_bias):
    """The shapes of ``params``, in order."""
    key = (I, H, L, D, has_bias)
    shapes = _param_shapes_cache.get(key)
    if shapes is None:
        shapes = []
        for layer in range(L):
            shape_ih = (4 * H, I if layer == 0 else D * H)
            shapes += [shape_ih, (4 * H, H), (4 * H,), (4 * H,)][:4 if has_bias else 2] * D
        shapes = _cached(_param_shapes_cache, key, tuple(shapes))
    return shapes


def _problem_fast(input, hx, params, has_bias, num_layers, bidirectional, batch_first, batch_sizes):
    """:func:`check_problem` for the common case, or None (then the full checks run).

    The common case: plain bool and int options, no ``batch_sizes``, and exact ndarrays
    (no subclasses) of one native-byte-order float32 or float64 dtype with the expected
    shapes (any memory layout). It accepts only arguments the full checks accept and
    returns the same :class:`Problem`, in a fraction of the time (it formats no names).
    """
    if (batch_sizes is not None or type(input) is not np.ndarray or input.ndim != 3
            or type(has_bias) is not bool or type(bidirectional) is not bool
            or type(batch_first) is not bool or type(num_layers) is not int or num_layers < 1
            or type(params) not in (list, tuple)):
        return None
    dtype = input.dtype
    if dtype not in _NATIVE_FLOATS:
        return None
    L, D = num_layers, 2 if bidirectional else 1
    if len(params) != L * D * (4 if has_bias else 2):
        return None
    w_hh0 = params[1]
    if type(w_hh0) is not np.ndarray or w_hh0.ndim != 2:
        return None
    H = w_hh0.shape[1]
    if batch_first:
        B, T, I = input.shape
    else:
        T, B, I = input.shape
    for value, shape in zip(params, _param_shapes(I, H, L, D, has_bias)):
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            return None
    if hx is None:
        h0 = c0 = None
    else:
        if type(hx) not in (tuple, list) or len(hx) != 2:
            return None
        h0, c0 = hx
        state_shape = (L * D, B, H)
        if (type(h0) is not np.ndarray or h0.dtype != dtype or h0.shape != state_shape
                or type(c0) is not np.ndarray or c0.dtype != dtype or c0.shape != state_shape):
            return None
    check_blas_limits(T, B, I, H, L, D)
    return _make_problem(input, h0, c0, params, T, B, I, H, L, D, has_bias,
                         "batch_first" if batch_first else "time_major", None)


def trusted_problem(input, h0, c0, params, *, hidden_size, has_bias, num_layers, bidirectional,
                    batch_first):
    """The :class:`Problem` of a padded call whose caller has checked its arguments itself.

    For :mod:`lstmcy.torch`, whose module checks its tensors as ``torch.nn.LSTM`` does
    (dimensions, sizes, devices, one float32/float64 dtype) before every call: ``input`` is
    a 3-D ndarray, ``h0``/``c0`` None or ``[L*D, B, H]`` ndarrays, ``params`` the ndarrays
    of an ``nn.LSTM``. Only what a kernel could run past is checked again (the parameter
    shapes, the BLAS size limit), and without :func:`check_problem`'s per-argument
    messages, which such a caller never needs.
    """
    L, D = num_layers, 2 if bidirectional else 1
    if batch_first:
        B, T, I = input.shape
    else:
        T, B, I = input.shape
    H = hidden_size
    for k, (value, shape) in enumerate(zip(params, _param_shapes(I, H, L, D, has_bias))):
        if value.shape != shape:
            raise ValueError(f"params[{k}] has shape {value.shape}, expected {shape}")
    check_blas_limits(T, B, I, H, L, D)
    return _make_problem(input, h0, c0, params, T, B, I, H, L, D, has_bias,
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
                   dropout, train, bidirectional, batch_first, dropout_masks):
    """Validate ``lstm_backward``'s arguments.

    Returns
    -------
    problem : Problem
    arrays : dict
        ``dy``, ``dh`` and ``dc`` (absent when None), each name of :data:`SAVED_NAMES`
        mapped to its list, and ``dropout_masks`` when the masks are in use. Arrays are
        the caller's, unconverted (shapes and the shared dtype checked).
    """
    checked = _backward_fast(input, hx, params, dy, dh, dc, saved, batch_sizes, has_bias,
                             num_layers, dropout, train, bidirectional, batch_first, dropout_masks)
    if checked is not None:
        return checked
    train = check_bool("train", train)
    dropout = check_dropout(dropout)
    bidirectional = check_bool("bidirectional", bidirectional)
    if isinstance(num_layers, (bool, np.bool_)) or not isinstance(num_layers, Integral):
        raise TypeError(f"num_layers must be an int, got {_describe(num_layers)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    L, D = int(num_layers), 2 if bidirectional else 1

    has_bias = check_bool("has_bias", has_bias)
    per_dir = 4 if has_bias else 2
    as_list("params", params, L * D * per_dir,
            f"{per_dir} per layer and direction for num_layers={L}, "
            f"bidirectional={bidirectional}, has_bias={has_bias}")
    arrays = {"dy": as_array("dy", dy, None)}
    extra = [("dy", arrays["dy"])]
    for name, value in (("dh", dh), ("dc", dc)):
        if value is not None:
            arrays[name] = as_array(name, value, 3)
            extra.append((name, arrays[name]))
    for name, value in zip(SAVED_NAMES, saved):
        items = as_list(name, value, L * D, "one [T, B, H] array per layer and direction: "
                        f"num_layers={L}, bidirectional={bidirectional}")
        arrays[name] = [as_array(f"{name}[{k}]", a, 3) for k, a in enumerate(items)]
        extra += [(f"{name}[{k}]", a) for k, a in enumerate(arrays[name])]
    if train and dropout > 0 and L > 1:
        if dropout_masks is None:
            raise ValueError("dropout_masks is required when dropout > 0, train and num_layers > 1: "
                             "pass cache.dropout_masks from lstm_forward")
    elif dropout_masks is not None and not (isinstance(dropout_masks, (list, tuple))
                                            and len(dropout_masks) == 0):
        # Masks that would be ignored mean the call does not describe the forward that
        # made them (typically dropout or train forgotten): refuse rather than silently
        # return the gradients of a network without dropout.
        raise ValueError(
            "dropout_masks must be None unless dropout > 0, train and num_layers > 1 (got masks "
            f"with dropout={dropout}, train={train}, num_layers={L}); pass the dropout and train "
            "given to lstm_forward")
    if train and dropout > 0 and L > 1:
        items = as_list("dropout_masks", dropout_masks, L - 1,
                        "one [T, B, D*H] array per layer boundary")
        arrays["dropout_masks"] = [as_array(f"dropout_masks[{k}]", m, 3) for k, m in enumerate(items)]
        extra += [(f"dropout_masks[{k}]", m) for k, m in enumerate(arrays["dropout_masks"])]

    p = check_problem(input, hx, params, has_bias=has_bias, num_layers=L,
                      bidirectional=bidirectional, batch_first=batch_first,
                      batch_sizes=batch_sizes, arrays_for_dtype=extra)
    H = p.H
    expect_shape("dy", arrays["dy"], p.output_shape(D * H), "like the output y")
    for name in ("dh", "dc"):
        if name in arrays:
            expect_shape(name, arrays[name], (L * D, p.B, H), "[num_layers*num_directions, B, H]")
    for name in SAVED_NAMES:
        for k, a in enumerate(arrays[name]):
            expect_shape(f"{name}[{k}]", a, (p.T, p.B, H), "time-major [T, B, H]")
    for k, m in enumerate(arrays.get("dropout_masks", ())):
        expect_shape(f"dropout_masks[{k}]", m, (p.T, p.B, D * H), "[T, B, D*H]")
    return p, arrays


def _backward_fast(input, hx, params, dy, dh, dc, saved, batch_sizes, has_bias, num_layers,
                   dropout, train, bidirectional, batch_first, dropout_masks):
    """:func:`check_backward` for the common case, or None (then the full checks run).

    The common case is that of :func:`_problem_fast`, with ``dy``, ``dh``, ``dc``, the
    saved arrays and the dropout masks exact ndarrays of the input's dtype and the
    expected shapes, in lists or tuples of the expected lengths.
    """
    if (type(train) is not bool or type(dropout) not in (float, int)
            or not 0.0 <= dropout < 1.0):
        return None
    p = _problem_fast(input, hx, params, has_bias, num_layers, bidirectional, batch_first,
                      batch_sizes)
    if p is None:
        return None
    dtype, L, D, B, H = p.dtype, p.L, p.D, p.B, p.H
    if type(dy) is not np.ndarray or dy.dtype != dtype or dy.shape != p.output_shape(D * H):
        return None
    arrays = {"dy": dy}
    state_shape = (L * D, B, H)
    for name, value in (("dh", dh), ("dc", dc)):
        if value is not None:
            if type(value) is not np.ndarray or value.dtype != dtype or value.shape != state_shape:
                return None
            arrays[name] = value
    saved_shape = (p.T, B, H)
    for name, items in zip(SAVED_NAMES, saved):
        if not isinstance(items, (list, tuple)) or len(items) != L * D:
            return None
        for a in items:
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != saved_shape:
                return None
        arrays[name] = list(items)
    if train and dropout > 0 and L > 1:
        if not isinstance(dropout_masks, (list, tuple)) or len(dropout_masks) != L - 1:
            return None
        mask_shape = (p.T, B, D * H)
        for m in dropout_masks:
            if type(m) is not np.ndarray or m.dtype != dtype or m.shape != mask_shape:
                return None
        arrays["dropout_masks"] = list(dropout_masks)
    elif dropout_masks is not None:
        return None
    return p, arrays
