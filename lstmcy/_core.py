"""Public forward and backward: validate, allocate, and run the Cython kernels.

The kernels (``lstmcy._lstm``) process one layer, both directions. This module loops over
layers, routes each layer's output (and, backwards, its input gradient) to the next,
applies dropout masks between layers and converts results to the caller's dtype and
layout. :class:`LSTMPlan` keeps the work buffers between calls (the two-phase use of the
Ascend operator: plan once, run many times); the plain functions use one plan per thread.
"""
import functools
import math
import operator
import threading
from time import perf_counter

import numpy as np

from lstmcy import _fpmode
from lstmcy._dispatch import kernels as _lstm
from lstmcy._cache import (ForwardCall, LSTMCache, LSTMGradients, SavedList,
                           check_same_call, refuse_cache)
from lstmcy._config import config_of
from lstmcy._pool import ALIGN, ResultPool, aligned_empty, aligned_offset
from lstmcy._schedule import (ALIASED_ROW_BYTES, DEFAULT_POLICY, SINGLE_THREADED_GEMM,
                              TUNED_STEP_FLOPS, SchedulePolicy)
from lstmcy._threads import (ThreadTuner, _check_count, _process_cpus, blas_single_threaded,
                             blas_small_gemms, is_automatic, threads_for)
from lstmcy._validation import (SAVED_NAMES, _cached, _check_batch_sizes, _read_only,
                                check_backward, check_blas_limits, check_bool, check_int,
                                check_output_mask, check_problem, check_proj_size, check_seed,
                                is_supported_float, to_compute)

__all__ = ["lstm_forward", "lstm_backward", "lstm_vjp", "LSTMPlan", "release_workspaces"]


def _as_rows(array):
    """2-D view ``[rows, features]`` of a C-contiguous array (also when features == 0)."""
    return array.reshape(math.prod(array.shape[:-1]), array.shape[-1])


def _out_dtype(array, dtype):
    if array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):  # float16 overflow to inf is the right answer
        return array.astype(dtype)


class _BlockViews(SavedList):
    """A cache list: the ``[T, B, F]`` pieces of one saved activation, one per layer and
    direction (F is H, or P for h).

    The backward recognises its own cache lists by identity and reads a layer's directions
    from ``rows`` (``[L*D, T*B, F]``, the compute-dtype values) without copying: the saved
    block itself, or for float16/bfloat16 calls the float32 values the (read-only) pieces
    were rounded from. ``call`` is the forward's :class:`~lstmcy._cache.ForwardCall`.
    """

    __slots__ = ("views", "_rows")

    def __init__(self, views, rows, call):
        SavedList.__init__(self, views, call)
        self.views = views
        self._rows = rows

    def rows(self, arrays, dtype):
        """``rows`` if ``arrays`` still are this list's pieces and ``dtype`` is their
        compute dtype, else None."""
        if (self._rows.dtype != dtype or len(arrays) != len(self.views)
                or not all(map(operator.is_, arrays, self.views))):
            return None
        return self._rows


def _cache_lists(pieces, saved_rows, LD, call):
    """The seven cache lists of a forward (``call``, its :class:`ForwardCall`): ``pieces``
    holds the ``[T, B, F]`` pieces of the seven activations in ``SAVED_NAMES`` order
    (``LD`` = layers x directions each), ``saved_rows`` their ``[L*D, T*B, F]``
    compute-dtype values."""
    if LD == 1:  # one piece per list (the common case: no slicing)
        return [_BlockViews((piece,), rows, call) for piece, rows in zip(pieces, saved_rows)]
    return [_BlockViews(tuple(pieces[k * LD:(k + 1) * LD]), rows, call)
            for k, rows in enumerate(saved_rows)]


def _stacked(given, arrays, layer, D, shape, dtype):
    """The arrays of one layer's directions as one C-contiguous ``[D, *shape]`` array.

    ``given`` is the caller's list, ``arrays`` the validated arrays of it. A cache list
    from :func:`lstm_forward` is viewed without copying (for float16/bfloat16, its float32
    values); anything else is stacked (and converted) into a new array.
    """
    rows = given.rows(arrays, dtype) if type(given) is _BlockViews else None
    if rows is not None:
        # The whole block when it is this one layer (one less view on small calls).
        return rows if rows.shape[0] == D else rows[layer * D:(layer + 1) * D]
    ks = slice(layer * D, (layer + 1) * D)
    out = np.empty((D,) + tuple(shape), dtype=dtype)  # C order whatever the inputs' order
    for k, a in enumerate(arrays[ks]):
        out[k] = a.reshape(shape)
    return out


_SAVED_INDEX = {name: k for k, name in enumerate(SAVED_NAMES)}


def saved_size(p):
    """Elements of a forward's saved block: the seven activations of every layer and
    direction, ``[L*D, T*B, H]`` each in ``SAVED_NAMES`` order, h ``[L*D, T*B, P]``."""
    return p.L * p.D * p.T * p.B * (6 * p.H + p.P)


def saved_arrays(block, p, by_step=False):
    """The seven ``[L*D, T*B, F]`` views (F = H, for h P) of a flat saved block, in
    ``SAVED_NAMES`` order; with ``by_step``, ``[L*D, T, B, F]``."""
    rows = (p.T, p.B) if by_step else (p.T * p.B,)
    if p.P == p.H:
        # One reshape for all seven (small calls make several of these lists).
        return list(block.reshape((len(SAVED_NAMES), p.L * p.D) + rows + (p.H,)))
    count = p.L * p.D * p.T * p.B
    views, start = [], 0
    for name in SAVED_NAMES:
        width = p.P if name == "h" else p.H
        views.append(block[start:start + count * width].reshape((p.L * p.D,) + rows + (width,)))
        start += count * width
    return views


def _block_reader(block, p):
    """``saved_of`` for :meth:`LSTMPlan._run_backward` from the block
    :meth:`LSTMPlan._run_forward` returns: views, no copies or checks (for callers that
    hand back the forward's own block, as ``lstmcy.torch`` does)."""
    views = saved_arrays(block, p)
    D = p.D

    def saved_of(name, layer):
        return views[_SAVED_INDEX[name]][layer * D:(layer + 1) * D]
    return saved_of


_NO_PROJECTION = {}
_NO_CACHE = {}


def _no_cache(D, H, P, dtype):
    """The empty ``[D, 0, F]`` saved arrays of an inference call (shared, read-only)."""
    key = (D, H, P, dtype)
    arrays = _NO_CACHE.get(key)
    if arrays is None:
        arrays = _cached(_NO_CACHE, key, tuple(
            _read_only(np.empty((D, 0, P if name == "h" else H), dtype=dtype))
            for name in SAVED_NAMES))
    return arrays


def _layer_weights(problem, layer):
    """``w_ih [D, 4H, I_l]``, ``w_hh [D, 4H, P]``, ``b_ih + b_hh [D, 4H]`` and ``w_hr
    [D, P, H]`` (``[D, 0, H]`` without a projection) of one layer."""
    D = problem.D
    ks = slice(layer * D, (layer + 1) * D)
    per_dir = problem.weights[ks]
    if problem.projected:
        w_hr = problem.projections[ks]
        w_hr = w_hr[0][np.newaxis] if D == 1 else np.stack(w_hr)
    else:
        key = (D, problem.H, problem.compute_dtype)
        w_hr = _NO_PROJECTION.get(key)
        if w_hr is None:
            w_hr = _NO_PROJECTION[key] = np.empty((D, 0, problem.H), problem.compute_dtype)
    if D == 1:  # views, no copy of the weights
        w_ih, w_hh, bias = per_dir[0]
        return w_ih[np.newaxis], w_hh[np.newaxis], bias[np.newaxis], w_hr
    return tuple(np.stack([w[k] for w in per_dir]) for k in range(3)) + (w_hr,)


@functools.lru_cache(maxsize=256)
def _packed_len(n, k, dtype):
    """Elements of the kernels' packed copy of a ``[k, n]`` weight matrix."""
    return _lstm.packed_elements(n, k, dtype == np.float64)


@functools.lru_cache(maxsize=256)
def _gate_row_stride(H, dtype):
    """Elements between two rows of the gates (forward) or gate gradients (backward): 4H,
    and one cache line more where 4H values are a multiple of ALIASED_ROW_BYTES long (rows
    that far apart fall in the same few cache sets, and the packed products read or write
    a block of rows at once)."""
    itemsize = np.dtype(dtype).itemsize
    if H > 0 and (4 * H * itemsize) % ALIASED_ROW_BYTES == 0:
        return 4 * H + ALIGN // itemsize
    return 4 * H


@functools.lru_cache(maxsize=256)
def _packed_weights_len(kind, H, P, I, projected, schedule, dtype):
    """Elements of one direction's packed weights in a ``kind`` ("forward" or "backward")
    layer call of that schedule (``I`` input features)."""
    is_double = dtype == np.float64
    if kind == "forward":
        return _lstm.forward_packed_len(H, P, I, projected, schedule.split, schedule.groups,
                                        schedule.fused_input, is_double)
    return _lstm.backward_packed_len(H, P, I, projected, schedule.split, schedule.groups,
                                     schedule.packed_dx, is_double)


def layer_workspace(kind, T, B, N, D, I, H, P, dtype, *, in_packed=False, want_dx=True,
                    want_dparams=True, small_gemms=False, policy=DEFAULT_POLICY):
    """The work buffers of one layer call but its packed weights, in the kernel object's
    order: a tuple of ``(name, shape, dtype)``.

    The one description of a call's work buffers: :class:`LSTMPlan`'s setups take these
    (buffers of one name are shared by every call of a plan, grown to the largest), and
    :meth:`LSTMPlan.required_workspace` bounds them. ``kind`` is "forward" or "backward";
    ``T, B, N, D, I, H, P`` the steps, batch rows, packed rows, directions, input
    features, units and size of h (``P < H``: projected); ``dtype`` the compute dtype
    (float32 or float64); ``in_packed``: the input rows are in packed order (no gathered
    copy); ``want_dx``, ``want_dparams``: what a backward computes; ``small_gemms``: the
    BLAS has a small-GEMM path; ``policy``: the plan's
    :class:`~lstmcy._schedule.SchedulePolicy`.
    """
    dtype = np.dtype(dtype)
    projected = P != H
    gates = ("gates", (D, N, _gate_row_stride(H, dtype)), dtype)
    if kind == "forward":
        return (gates,
                ("r_rows", (D, N if projected else 0, H), dtype),
                ("packed_rows", (0 if in_packed else N, I), dtype))
    rows = N if projected else 0
    # Each lane of the weight gradients sums its own dW (shape only); [x | h_{t-1}] rows
    # are gathered as rows, or in panels for lstmcy's own product.
    shape_only = policy.backward(T, B, I, H, D, 1, projected, small_gemms=small_gemms)
    lanes = shape_only.lanes
    if shape_only.panel_weights:
        z_width = _packed_len(I + P, 1, dtype)
    else:
        z_width = I + P + (H if projected else 0)
    grad_rows = lanes * 4 * H if want_dparams else 0
    return (gates,
            ("dh_rows", (D, rows, P), dtype),
            ("r_rows", (D, rows, H), dtype),
            ("z", (D, N if want_dparams else 0, z_width), dtype),
            ("dw", (D, grad_rows, I + P), dtype),
            ("db_acc", (D, grad_rows), np.dtype(np.float64)),
            ("dw_hr_acc", (D, lanes * P if projected and want_dparams else 0, H), dtype),
            ("packed_rows", (N if want_dx and not in_packed else 0, I), dtype))


def _draw_masks(problem, dropout, rng):
    """``L - 1`` masks ``[T, B, D*P]`` of 0 or ``1 / (1 - dropout)`` in the caller's dtype."""
    rng = rng if rng is not None else np.random.default_rng()
    shape = (problem.T, problem.B, problem.D * problem.P)
    scale = 1.0 / (1.0 - dropout)
    return [np.where(rng.random(shape) >= dropout, scale, 0.0).astype(problem.dtype)
            for _ in range(problem.L - 1)]


class _LayerSetup:
    """What one kind of layer call derives from its shapes alone.

    ``key``: the plan's key of the kind of call; ``kind``: "forward" or "backward";
    ``sizes``: ``(T, B, N, D, I, H, P)`` (T: the batch layout's steps, none when B is 0;
    I: the layer's input features); ``flags``: the kernel object's flags after the sizes
    (forward: ``training, x_rows_packed``; backward: ``want_dx, want_dparams,
    x_rows_packed``); ``workspaces``: its work buffers but the packed weights, in its
    order; ``tuner_key``, ``step_flops`` and ``flops``: :meth:`LSTMPlan._call`'s arguments;
    ``by_threads``: the call's kernel object (:class:`ForwardLayer` /
    :class:`BackwardLayer` of ``lstmcy._lstm``) per thread count (its schedule, and so
    its packed weights' size, depends on the count).
    """

    __slots__ = ("key", "kind", "sizes", "flags", "workspaces", "tuner_key", "step_flops",
                 "flops", "by_threads")

    def __init__(self, key, kind, sizes, flags, workspaces, tuner_key, step_flops, flops):
        self.key = key
        self.kind = kind
        self.sizes = sizes
        self.flags = flags
        self.workspaces = workspaces
        self.tuner_key = tuner_key
        self.step_flops = step_flops
        self.flops = flops
        self.by_threads = {}

    @property
    def in_size(self):
        return self.sizes[4]

    @property
    def want_dx(self):
        return self.kind == "backward" and self.flags[0]


def _one_call_at_a_time(method):
    """Run a plan's ``method`` holding the plan's call lock.

    A plan's work buffers serve one call at a time; a second thread entering the same plan
    raises at once instead of sharing them (a non-blocking acquire: no waiting, no cost but
    the lock's when the plan is free)."""
    @functools.wraps(method)
    def run(plan, *args, **kwargs):
        if not plan._in_call.acquire(blocking=False):
            raise RuntimeError(
                "this LSTMPlan is already running a call (in another thread, or in this one "
                "from inside that call): a plan's work buffers "
                "serve one call at a time; give each thread its own LSTMPlan (the plain "
                "lstm_forward / lstm_backward keep one per thread)")
        try:
            return method(plan, *args, **kwargs)
        finally:
            plan._in_call.release()
    return run


class LSTMPlan:
    """Work buffers kept between calls: plan once, run many times.

    The plain :func:`lstm_forward` and :func:`lstm_backward` allocate their work buffers on
    every call. A training loop that calls them repeatedly with the same shapes can use a
    plan instead: :meth:`forward` and :meth:`backward` take the same arguments and return
    the same results, and reuse the buffers (grown when a larger problem arrives). A plan
    serves one call at a time: a call entering it while another thread's call runs raises
    RuntimeError. Use one plan per thread.

    Parameters
    ----------
    n_threads : int or None
        Threads of the kernels (any positive number, obeyed as given); None follows
        :func:`lstmcy.set_num_threads` (when that is automatic too: the CPUs the process
        may use, as far as a call has work for them, and small calls on one thread while
        more are slower; see :mod:`lstmcy._threads`).
    schedules : lstmcy._schedule.SchedulePolicy, optional
        The functions that schedule the layer calls (tests and benchmarks run others
        through it); lstmcy's own by default. Results are bitwise the same for every
        valid schedule.

    Attributes
    ----------
    workspace_size : int
        Bytes currently held in work buffers.
    trace : list or None
        When a list, every kernel call appends ``(kind, layer, entries)``: ``kind``
        "forward" or "backward", ``entries`` an int64 array ``[tasks, 8]`` of (task kind,
        direction, i, j, worker, start ns, end ns, place in the task list) as
        ``src/lstmcy/_layer.pxd`` names them (``benchmarks/scaling.py`` replays them).
        None (the default) traces nothing.
    """

    def __init__(self, n_threads=None, *, schedules=None):
        self.n_threads = _check_count("n_threads", n_threads)
        if schedules is not None and not isinstance(schedules, SchedulePolicy):
            raise TypeError("schedules must be a lstmcy._schedule.SchedulePolicy, got "
                            f"{type(schedules).__name__}")
        self.schedules = DEFAULT_POLICY if schedules is None else schedules
        self._buffers = {}
        self._offsets = {}  # name -> aligned_offset of that buffer
        # Result arrays come from here: their memory is reused once the caller drops them.
        self._results = ResultPool()
        self._last_views = {}  # name -> the view _take last returned of that buffer
        self._tuners = {}  # kind of kernel call -> its ThreadTuner (automatic threads only)
        self._setups = {}  # kind of layer call -> its _LayerSetup (see _remember)
        self._in_call = threading.Lock()  # held while a call uses the buffers
        self.trace = None

    @property
    def workspace_size(self):
        return sum(b.nbytes for b in self._buffers.values())

    @staticmethod
    def required_workspace(T, B, input_size, hidden_size, *, num_layers=1, bidirectional=False,
                           batch_sizes=None, dtype=np.float32, backward=True, proj_size=0):
        """Bytes of work buffers one call needs at most (the analogue of ``GetWorkspaceSize``).

        The workspace is O(T*B*4H) per direction: the gate (gradient) buffer, its rows of 4H
        values padded by a cache line where they are a multiple of 4 KiB apart, and, where
        the input is not in packed order, a packed copy of the input (gradient), plus a
        panel-packed copy of ``w_hh`` (and ``w_hr``, and ``w_ih`` where the forward takes
        x's product in the recurrence or the backward takes dx by its packed product) per
        direction for the recurrent products; the backward adds, per direction,
        ``[x | h_{t-1} (| r_t)]`` in packed row order for the weight gradients, ``lanes``
        ``[4H, I + P]`` weight-gradient sums and float64 bias ones (see
        :func:`lstmcy._schedule.backward_lanes`), and with a projection the rows of dh and
        of dh @ w_hr and dW_hr's sums. An upper bound of what :attr:`workspace_size` reaches
        after such calls.
        """
        T, B = check_int("T", T, 0), check_int("B", B, 0)
        input_size = check_int("input_size", input_size, 0)
        H = hidden_size = check_int("hidden_size", hidden_size, 0)
        num_layers = check_int("num_layers", num_layers, 1)
        proj_size = check_proj_size(proj_size)
        if proj_size and proj_size >= H:
            raise ValueError(f"proj_size must be smaller than hidden_size ({H}), got {proj_size}")
        try:
            # np.dtype(None) is float64: None is refused, not read as a default.
            supported = dtype is not None and is_supported_float(np.dtype(dtype))
        except TypeError:
            supported = False
        if not supported:
            raise TypeError("dtype must be float16, bfloat16, float32 or float64, got "
                            f"{dtype!r}")
        dtype = np.dtype(dtype)
        D = 2 if check_bool("bidirectional", bidirectional) else 1
        backward = check_bool("backward", backward)
        # Sizes lstm_forward refuses are refused here, before any size-proportional work.
        check_blas_limits(T, B, input_size, H, num_layers, D, proj_size,
                          names=("the batch (T, B)", "the width (input_size, hidden_size)",
                                 "hidden_size"))
        P = proj_size if proj_size else H
        if batch_sizes is not None:
            sizes = _check_batch_sizes(batch_sizes)
            if sizes.shape[0] != T or (T and sizes[0] != B):
                raise ValueError(f"batch_sizes must have T = {T} entries, the first B = {B}, "
                                 f"got {sizes.tolist()}")
            N = int(sizes.sum())
        else:
            N = T * B
        # float16/bfloat16 compute in float32
        cdt = np.dtype(np.float64 if dtype.itemsize == 8 else np.float32)
        in_sizes = {input_size, D * P} if num_layers > 1 else {input_size}
        # Each named buffer grows to the largest of its layer calls: every layer's input
        # size, gathered input rows, every BLAS (its small-GEMM path or not).
        largest = {}
        for I in in_sizes:
            for kind in ("forward", "backward") if backward else ("forward",):
                for small in (False, True):
                    for name, shape, of in layer_workspace(kind, T, B, N, D, I, H, P, cdt,
                                                           small_gemms=small):
                        largest[name] = max(largest.get(name, 0), math.prod(shape) * of.itemsize)
        # The packed weights: by rows, or by units in up to H / 16 parts (each part's
        # panels padded apart), with w_ih (the forward's fused_input, the backward's
        # packed_dx).
        parts = max(1, H // 16)
        is_double = cdt == np.float64
        largest["w_packed"] = cdt.itemsize * D * max(
            [_lstm.forward_packed_len(H, P, I, P != H, split, groups, True, is_double)
             for I in in_sizes for split, groups in [(0, 1), (1, parts)]]
            + [_lstm.backward_packed_len(H, P, I, P != H, split, groups, True, is_double)
               for I in in_sizes for split, groups in [(0, 1), (1, parts)] if backward])
        # Each buffer is aligned within its allocation (see _take).
        return int(sum(largest.values()) + len(largest) * (ALIGN - 1))

    def _take(self, name, shape, dtype):
        """A C-contiguous ``shape`` view into the named buffer (grown if too small)."""
        # Repeated calls of one shape reuse the last view (cheaper than slicing anew); one
        # view per name, so a grown buffer's old memory is not kept alive.
        view = self._last_views.get(name)
        if (view is not None and view.shape == shape and view.dtype == dtype
                and view.base is self._buffers[name]):
            return view
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize + ALIGN - 1
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = np.empty(nbytes, dtype=np.uint8)
            self._buffers[name] = buffer
            self._offsets[name] = aligned_offset(buffer)
            # The setups' views of the replaced buffer would keep it alive.
            self._setups.clear()
        # On a cache line, as the results are (see lstmcy._pool.ALIGN). The forward and the
        # backward take some buffers in different shapes, so this runs on most calls.
        view = self._last_views[name] = aligned_empty(shape, dtype, buffer, self._offsets[name])
        return view

    def _remember(self, key, setup):
        """Keep ``setup``, the :class:`_LayerSetup` of the layer calls of ``key``."""
        if len(self._setups) >= 64:  # many shapes: forget the old ones
            self._setups.clear()
        self._setups[key] = setup
        return setup

    def _forward_setup(self, key, p, in_size, in_packed, train):
        """The :class:`_LayerSetup` of a forward layer call with ``in_size`` input features
        (``in_packed``: its input rows are in packed order)."""
        D, N, H, P, cdt = p.D, p.N, p.H, p.P, p.compute_dtype
        workspaces = tuple(self._take(*buffer) for buffer in layer_workspace(
            "forward", p.T, p.B, N, D, in_size, H, P, cdt, in_packed=in_packed,
            policy=self.schedules))
        flops_per_row = 8.0 * D * H * (in_size + P) + (2.0 * D * H * P if p.projected else 0)
        return self._remember(key, _LayerSetup(
            key, "forward", (len(p.batch_sizes), p.B, N, D, in_size, H, P), (train, in_packed),
            workspaces,
            ("forward", p.B, in_size, H, P, D, train, cdt), p.B * flops_per_row,
            N * flops_per_row))

    def _backward_setup(self, key, p, in_size, in_packed, want_dx, want_dparams):
        """The :class:`_LayerSetup` of a backward layer call with ``in_size`` input features
        (``in_packed``: its input rows are in packed order; ``want_dx``: it computes the
        input gradient)."""
        T, B, D, N, H, P, cdt = p.T, p.B, p.D, p.N, p.H, p.P, p.compute_dtype
        projected = p.projected
        workspaces = tuple(self._take(*buffer) for buffer in layer_workspace(
            "backward", T, B, N, D, in_size, H, P, cdt, in_packed=in_packed, want_dx=want_dx,
            want_dparams=want_dparams, small_gemms=blas_small_gemms(), policy=self.schedules))
        flops_per_row = 16.0 * D * H * (in_size + P) + (6.0 * D * H * P if projected else 0)
        return self._remember(key, _LayerSetup(
            key, "backward", (len(p.batch_sizes), B, N, D, in_size, H, P),
            (want_dx, want_dparams, in_packed),
            workspaces, ("backward", B, in_size, H, P, D, want_dx, want_dparams, cdt),
            B * flops_per_row, N * flops_per_row))

    def _layer_call(self, setup, p, n_threads):
        """The kernel object of ``setup``'s layer call on ``n_threads`` threads (made once).
        The schedule is that of at most the process's CPUs (unless the plan's
        :class:`~lstmcy._schedule.SchedulePolicy` says otherwise): threads beyond them
        cannot run the recurrence's groups or parts at once, and thinner ones would only
        add work (the extra threads take the other tasks)."""
        D, H, P, cdt = p.D, p.H, p.P, p.compute_dtype
        policy = self.schedules
        cpus = min(n_threads, _process_cpus()) if policy.cap_at_cpus else n_threads
        if setup.kind == "forward":
            schedule = policy.forward(p.T, p.B, setup.in_size, H, D, cpus, p.projected,
                                      itemsize=cdt.itemsize)
            kernel = _lstm.ForwardLayer
        else:
            schedule = policy.backward(p.T, p.B, setup.in_size, H, D, cpus, p.projected,
                                       small_gemms=blas_small_gemms())
            if not setup.want_dx:  # no dx: no room for a packed w_ih
                schedule = schedule._replace(packed_dx=False)
            kernel = _lstm.BackwardLayer
        w_packed = self._take(
            "w_packed",
            (D * _packed_weights_len(setup.kind, H, P, setup.in_size, p.projected, schedule,
                                     cdt),),
            cdt)
        if self._setups.get(setup.key) is not setup:
            # w_packed grew, which dropped the setups: this one's other buffers are current,
            # its kernel objects of other counts hold the old w_packed.
            setup.by_threads.clear()
            self._remember(setup.key, setup)
        call = setup.by_threads[n_threads] = kernel(
            setup.sizes, *setup.flags, schedule, setup.workspaces + (w_packed,), n_threads)
        return call

    def _call(self, key, rows, step_flops, flops, run):
        """``run(n_threads)``, with the thread count for a call of ``flops`` work. When the
        count is automatic and a time step's work (``step_flops``) is small enough for the
        threads' synchronisation to matter, this kind of call's :class:`ThreadTuner`
        (``key``: everything but the sequence length) may run it on one thread instead; it
        compares times per row (``rows`` rows), so that calls of other lengths inform one
        another."""
        n_threads = threads_for(flops, self.n_threads)
        if (n_threads == 1 or rows == 0 or step_flops > TUNED_STEP_FLOPS
                or not is_automatic(self.n_threads)):
            return run(n_threads)
        key = key + (n_threads,)
        tuner = self._tuners.get(key)
        if tuner is None:
            if len(self._tuners) >= 64:  # many shapes: forget the old ones
                self._tuners.clear()
            tuner = self._tuners[key] = ThreadTuner(n_threads)
        start = perf_counter()
        n_threads = tuner.choose(start)
        result = run(n_threads)
        tuner.record(n_threads, start, (perf_counter() - start) / rows)
        return result

    def _run_layer(self, setup, layer, p, n_threads, args):
        """Run ``setup``'s layer call of ``layer`` on ``n_threads`` threads with the
        per-call arrays ``args`` (its kernel object's ``run`` arguments before
        ``flush_denormals``), appending a trace of its tasks to :attr:`trace` when that
        asks for one."""
        call = setup.by_threads.get(n_threads) or self._layer_call(setup, p, n_threads)
        if self.trace is None:
            return call.run(*args, _fpmode._flush)
        entries = np.zeros((1 << 16, 8), dtype=np.int64)
        n_trace = call.run(*args, _fpmode._flush, entries)
        self.trace.append((setup.kind, layer, entries[:n_trace]))
        return n_trace

    def _blas_cap(self, problem):
        """Cap BLAS to one thread (results must not depend on the BLAS thread count, and
        OpenBLAS rounds differently with more threads), unless every GEMM of the call is so
        small that BLAS runs it on one thread anyway: the cap costs tens of microseconds."""
        width = max(problem.I, problem.D * problem.P) if problem.L > 1 else problem.I
        largest = problem.N * 4 * problem.H * (width + problem.P + problem.H)
        return blas_single_threaded(active=largest > SINGLE_THREADED_GEMM)

    def forward(self, input, hx, params, *, config=None, has_bias=True, num_layers=1,
                dropout=0.0, train=True, bidirectional=False, batch_first=False,
                batch_sizes=None, seed=None, proj_size=0):
        """Same as :func:`lstm_forward`, reusing this plan's buffers; the cache's
        :meth:`~lstmcy.LSTMCache.backward` runs on this plan too."""
        cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout,
                        train, proj_size)
        return self._forward(input, hx, params, cfg, batch_sizes, seed, self.backward)

    def _forward(self, input, hx, params, cfg, batch_sizes, seed, run_backward):
        """:meth:`forward` with its settings in ``cfg`` (an :class:`~lstmcy.LSTMConfig`);
        the cache's backward calls ``run_backward`` (:meth:`backward`'s arguments)."""
        rng = check_seed(seed) if seed is not None else None
        p = check_problem(input, hx, params, has_bias=cfg.has_bias, num_layers=cfg.num_layers,
                          bidirectional=cfg.bidirectional, batch_first=cfg.batch_first,
                          batch_sizes=batch_sizes, proj_size=cfg.proj_size)
        masks = _draw_masks(p, cfg.dropout, rng) if cfg.uses_dropout else None
        y, h_n, c_n, saved_block, saved_rows = self._run_forward(p, cfg.train, masks)
        if not cfg.train:
            return y, h_n, c_n, None
        # In SAVED_NAMES order, which is LSTMCache's argument order.
        LD = p.L * p.D
        if p.dtype == p.compute_dtype and p.P == p.H:
            # All 7 * L * D [T, B, H] pieces from one reshape.
            pieces = list(saved_block.reshape((7 * LD, p.T, p.B, p.H)))
        else:
            pieces = []
            for a in saved_arrays(saved_block, p, by_step=True):  # [L*D, T, B, F] each
                if p.dtype != p.compute_dtype:
                    # float16/bfloat16: the caller gets the rounded values; the backward,
                    # handed these very arrays, the float32 ones they were rounded from.
                    # Read-only, so that the two cannot drift apart.
                    a = _out_dtype(a, p.dtype)
                    a.flags.writeable = False
                pieces.extend(a)
        # The caller's arrays, not copies; the checked lengths (the caller's may change).
        call = ForwardCall(cfg, input, hx, params, None if batch_sizes is None else p.batch_sizes,
                           masks, p.dtype, p.layout, run_backward)
        return y, h_n, c_n, LSTMCache(*_cache_lists(pieces, saved_rows, LD, call),
                                      dropout_masks=masks, call=call)

    @_one_call_at_a_time
    def _run_forward(self, p, train, masks):
        """:meth:`forward` of a checked :class:`~lstmcy._validation.Problem` (``masks``: the
        dropout masks, or None). Callers that build ``p`` themselves (``lstmcy.torch``)
        vouch for its arrays as :func:`~lstmcy._validation.check_problem` would.

        Returns ``y, h_n, c_n`` in the caller's dtype and, when ``train``, the saved
        activations as one flat compute-dtype block of ``saved_size(p)`` elements and its
        :func:`saved_arrays` views (else None, None): :meth:`forward` wraps them in an
        :class:`LSTMCache`, and :meth:`_run_backward` reads the block through
        :func:`_block_reader`."""
        T, B, H, P, L, D, N = p.T, p.B, p.H, p.P, p.L, p.D, p.N
        cdt = p.compute_dtype
        alloc = self._results.empty if p.uniform else self._results.zeros

        y = alloc(p.output_shape(), dtype=cdt)
        y_rows = _as_rows(y)
        # The kernels write the final states (c in place, from c0); h_n starts as h0 for
        # calls without steps. One request for both.
        states = self._results.empty((p.h0.size + p.c0.size,), dtype=cdt)
        h_n = states[:p.h0.size].reshape(p.h0.shape)
        c_n = states[p.h0.size:].reshape(p.c0.shape)
        h_n[...] = p.h0
        c_n[...] = p.c0
        if train:
            # One request for all seven (they live and die together, in the cache).
            saved_block = alloc((saved_size(p),), dtype=cdt)
            saved_all = saved_arrays(saved_block, p)
        else:
            no_cache = _no_cache(D, H, P, cdt)
        internal_step_row, _, internal_packed = p.time_major_map

        layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
        with self._blas_cap(p):
            for layer in range(L):
                last = layer == L - 1
                if last:
                    out, out_step_row, out_stride = y_rows, p.step_row, p.batch_stride
                else:
                    out = alloc((T * B, D * P), dtype=cdt)
                    out_step_row, out_stride = internal_step_row, 1
                in_size = layer_in.shape[1]
                w_ih, w_hh, bias, w_hr = _layer_weights(p, layer)
                ks = slice(layer * D, (layer + 1) * D)
                if not train:
                    saved = no_cache
                elif L == 1:
                    saved = tuple(saved_all)
                else:
                    saved = tuple([a[ks] for a in saved_all])
                key = ("forward", layer, p.shapes, N, in_packed, train, cdt)
                setup = self._setups.get(key) or self._forward_setup(key, p, in_size, in_packed, train)
                states = (p.h0, h_n, c_n) if L == 1 else (p.h0[ks], h_n[ks], c_n[ks])
                args = ((layer_in, in_step_row, in_stride), (out, out_step_row, out_stride),
                        (w_ih, w_hh, bias, w_hr), states, saved, (p.batch_sizes, p.packed_start))

                def run(n_threads, args=args, layer=layer, setup=setup):
                    return self._run_layer(setup, layer, p, n_threads, args)

                self._call(setup.tuner_key, N, setup.step_flops, setup.flops, run)
                if not last:
                    if masks is not None:
                        with np.errstate(invalid="ignore"):  # inf * 0 -> NaN, as in torch; no warning
                            out *= to_compute(masks[layer], cdt).reshape(T * B, D * P)
                    layer_in, in_step_row, in_stride, in_packed = out, internal_step_row, 1, internal_packed

        if p.dtype != cdt:  # float16/bfloat16 callers
            y, h_n, c_n = (_out_dtype(a, p.dtype) for a in (y, h_n, c_n))
        return y, h_n, c_n, saved_block if train else None, saved_all if train else None

    def step(self, x, hx, params, *, has_bias=True):
        """One inference time step of a one-layer, one-direction LSTM: a cell step.

        The bound form for step-by-step use (streaming inference, a recurrent policy's
        actor): the shape's setup is made once, and a call of exact float32/float64
        ndarrays of the expected shapes runs the kernels with nothing derived anew.

        Parameters
        ----------
        x : ndarray [B, I]
            The step's input.
        hx : tuple of ndarray or None
            ``(h, c)``, each ``[B, H]`` (as ``torch.nn.LSTMCell`` takes them); None for
            zeros.
        params : list of ndarray
            ``w_ih [4H, I]``, ``w_hh [4H, H]``, ``b_ih [4H]``, ``b_hh [4H]`` (no biases when
            ``has_bias`` is False).
        has_bias : bool, default True

        Returns
        -------
        h, c : ndarray [B, H]
            The new states: bitwise ``h_n[0], c_n[0]`` of ``forward(x[None], (h[None],
            c[None]), params, train=False)``. Other arguments (other dtypes, shapes or
            types) run that call itself, with its checks and its error messages.
        """
        from lstmcy._step import plan_step  # _step builds on this module
        return plan_step(self, x, hx, params, has_bias)

    def backward(self, input, hx, params, dy, dh, dc, i, g=None, f=None, o=None, h=None,
                 c=None, tanhc=None, *, config=None, batch_sizes=None, has_bias=True,
                 num_layers=1, dropout=0.0, train=True, bidirectional=False, batch_first=False,
                 output_mask=(True, True, True, True), dropout_masks=None, proj_size=0):
        """Same as :func:`lstm_backward`, reusing this plan's buffers."""
        cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout,
                        train, proj_size)
        p, arrays = _check_backward(cfg, input, hx, params, dy, dh, dc,
                                    (i, g, f, o, h, c, tanhc), batch_sizes, dropout_masks)
        output_mask = check_output_mask(output_mask)
        given = dict(zip(SAVED_NAMES, (i, g, f, o, h, c, tanhc)))
        cdt = p.compute_dtype

        def saved_of(name, layer):
            rows = (p.T * p.B, p.P if name == "h" else p.H)
            return _stacked(given[name], arrays[name], layer, p.D, rows, cdt)

        return LSTMGradients(*self._run_backward(p, saved_of, arrays, output_mask))

    @_one_call_at_a_time
    def _run_backward(self, p, saved_of, arrays, output_mask):
        """:meth:`backward` of checked arguments: ``p`` and ``arrays`` as
        :func:`~lstmcy._validation.check_backward` returns them (only ``dy``, ``dh``,
        ``dc`` and ``dropout_masks`` are read from ``arrays``), ``saved_of(name, layer)``
        the saved activation ``name`` of ``layer``'s directions as a C-contiguous
        ``[D, T*B, F]`` compute-dtype array (F = H, for h P), ``output_mask`` a tuple of four
        bools."""
        want_dx, want_dh, want_dc, want_dparams = output_mask
        if not any(output_mask):
            return None, None, None, None
        T, B, H, P, L, D, N = p.T, p.B, p.H, p.P, p.L, p.D, p.N
        projected = p.projected
        cdt = p.compute_dtype
        masks = None
        if "dropout_masks" in arrays:
            masks = [to_compute(m, cdt).reshape(T * B, D * P) for m in arrays["dropout_masks"]]

        dy_rows = _as_rows(to_compute(arrays["dy"], cdt))
        # Working state: in, the gradients of h_n / c_n; out, those of h0 / c0.
        shapes = p.shapes
        dh_state = (np.array(arrays["dh"], dtype=cdt, order="C") if "dh" in arrays
                    else np.zeros(shapes.h_state, cdt))
        dc_state = (np.array(arrays["dc"], dtype=cdt, order="C") if "dc" in arrays
                    else np.zeros(shapes.c_state, cdt))

        alloc = self._results.empty if p.uniform else self._results.zeros
        internal_step_row, _, internal_packed = p.time_major_map
        per_dir = len(shapes.param_names)
        dparams = [None] * (L * D * per_dir)
        dx = None
        upper_dy, dy_step_row, dy_stride = dy_rows, p.step_row, p.batch_stride
        with self._blas_cap(p):
            for layer in reversed(range(L)):
                ks = slice(layer * D, (layer + 1) * D)
                saved = tuple([saved_of(name, layer) for name in SAVED_NAMES])
                if layer == 0:
                    layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
                    layer_dx_needed = want_dx
                else:
                    below = list(saved_of("h", layer - 1))
                    layer_in = self._results.empty((T * B, D * P), cdt)
                    np.concatenate(below, axis=-1, out=layer_in)
                    if masks is not None:
                        with np.errstate(invalid="ignore"):  # inf * 0 -> NaN, as in torch; no warning
                            layer_in *= masks[layer - 1]
                    in_step_row, in_stride, in_packed = internal_step_row, 1, internal_packed
                    layer_dx_needed = True
                in_size = layer_in.shape[1]
                if layer_dx_needed:
                    layer_dx = alloc(layer_in.shape, dtype=cdt)
                else:
                    layer_dx = np.empty((0, in_size), dtype=cdt)
                hr = P if projected else 0
                if want_dparams:
                    # One request for the layer's weight and bias gradients.
                    e0 = D * 4 * H * in_size
                    e1 = e0 + D * 4 * H * P
                    e2 = e1 + D * 4 * H
                    e3 = e2 + D * hr * H
                    grads = self._results.empty((e3,), dtype=cdt)
                    dw_ih = grads[:e0].reshape(D, 4 * H, in_size)
                    dw_hh = grads[e0:e1].reshape(D, 4 * H, P)
                    db = grads[e1:e2].reshape(D, 4 * H)
                    dw_hr = grads[e2:e3].reshape(D, hr, H)
                else:
                    dw_ih = np.empty((D, 0, in_size), dtype=cdt)
                    dw_hh = np.empty((D, 0, P), dtype=cdt)
                    db = np.empty((D, 0), dtype=cdt)
                    dw_hr = np.empty((D, 0, H), dtype=cdt)
                w_ih, w_hh, _, w_hr = _layer_weights(p, layer)
                key = ("backward", layer, p.shapes, N, in_packed, layer_dx_needed, want_dparams, cdt)
                setup = self._setups.get(key) or self._backward_setup(
                    key, p, in_size, in_packed, layer_dx_needed, want_dparams)
                if L == 1:
                    h0, c0, dh_layer, dc_layer = p.h0, p.c0, dh_state, dc_state
                else:
                    h0, c0, dh_layer, dc_layer = p.h0[ks], p.c0[ks], dh_state[ks], dc_state[ks]
                args = ((layer_in, in_step_row, in_stride), (upper_dy, dy_step_row, dy_stride),
                        layer_dx, (w_ih, w_hh, w_hr), (h0, c0, dh_layer, dc_layer), saved,
                        (dw_ih, dw_hh, db, dw_hr), (p.batch_sizes, p.packed_start))

                def run(n_threads, args=args, layer=layer, setup=setup):
                    return self._run_layer(setup, layer, p, n_threads, args)

                self._call(setup.tuner_key, N, setup.step_flops, setup.flops, run)
                if want_dparams:
                    for d in range(D):
                        base = (layer * D + d) * per_dir
                        dparams[base] = dw_ih[d]
                        dparams[base + 1] = dw_hh[d]
                        if p.has_bias:
                            dparams[base + 2] = db[d]
                            dparams[base + 3] = db[d].copy()
                        if projected:
                            dparams[base + per_dir - 1] = dw_hr[d]
                if layer > 0:
                    if masks is not None:
                        with np.errstate(invalid="ignore"):  # inf * 0 -> NaN, as in torch; no warning
                            layer_dx *= masks[layer - 1]
                    upper_dy, dy_step_row, dy_stride = layer_dx, internal_step_row, 1
                elif want_dx:
                    dx = layer_dx.reshape(p.input_shape)

        dtype = p.dtype
        dx = _out_dtype(dx, dtype) if want_dx else None
        dh_prev = _out_dtype(dh_state, dtype) if want_dh else None
        dc_prev = _out_dtype(dc_state, dtype) if want_dc else None
        dparams = [_out_dtype(a, dtype) for a in dparams] if want_dparams else None
        return dx, dh_prev, dc_prev, dparams


def _check_backward(cfg, input, hx, params, dy, dh, dc, saved, batch_sizes, dropout_masks):
    """``check_backward`` of a backward whose settings are ``cfg``, after refusing saved
    arrays of a forward that ``cfg`` and the arrays do not describe."""
    refuse_cache(saved[0])
    check_same_call(saved, cfg, input, hx, params, batch_sizes, dropout_masks)
    return check_backward(
        input, hx, params, dy, dh, dc, saved, batch_sizes=batch_sizes, has_bias=cfg.has_bias,
        num_layers=cfg.num_layers, dropout=cfg.dropout, train=cfg.train,
        bidirectional=cfg.bidirectional, batch_first=cfg.batch_first,
        dropout_masks=dropout_masks, proj_size=cfg.proj_size)


_per_thread = threading.local()


def _thread_plan():
    """The plan whose work buffers this thread's plain calls reuse.

    Fresh multi-megabyte buffers on every call cost page faults (tens of ms on large
    shapes); one plan per thread keeps the calls thread-safe. The buffers hold the largest
    problem seen; ``lstmcy.release_workspaces()`` frees them.
    """
    plan = getattr(_per_thread, "plan", None)
    if plan is None:
        plan = _per_thread.plan = LSTMPlan()
    return plan


def use_thread_plan(plan):
    """Run the calling thread's plain calls on ``plan`` (an :class:`LSTMPlan`, or None for
    a fresh one on the next call) and return the plan they ran on (None if none yet): the
    seam through which tests and benchmarks run the plain functions with other schedules
    (``LSTMPlan(schedules=...)``)."""
    if plan is not None and not isinstance(plan, LSTMPlan):
        raise TypeError(f"plan must be an LSTMPlan or None, got {type(plan).__name__}")
    previous = getattr(_per_thread, "plan", None)
    _per_thread.plan = plan
    return previous


def release_workspaces():
    """Free the work buffers the plain functions keep for the calling thread, and the
    memory their result pool keeps for reuse (results still held stay valid)."""
    _per_thread.plan = None


def lstm_forward(input, hx, params, *, config=None, has_bias=True, num_layers=1, dropout=0.0,
                 train=True, bidirectional=False, batch_first=False, batch_sizes=None, seed=None,
                 proj_size=0):
    """Run a (multi-layer, optionally bidirectional) LSTM forward, saving what backward needs.

    Semantics are those of PyTorch's ``aten::lstm`` (and of the Ascend operator whose
    backward :func:`lstm_backward` mirrors). The backward is ``cache.backward(dy)``
    (:meth:`LSTMCache.backward`): the cache records this call.

    Parameters
    ----------
    input : ndarray
        ``[T, B, I]`` (``[B, T, I]`` if ``batch_first``). With ``batch_sizes``, also 2-D:
        ``[sum(batch_sizes), I]`` (PyTorch's packed layout) or ``[T*B, I]`` (padded,
        time-major).
    hx : tuple of ndarray or None
        ``(h0, c0)``: ``h0`` ``[num_layers*D, B, P]``, ``c0`` ``[num_layers*D, B, H]``, index
        ``layer*D + direction`` (``D = 2`` if bidirectional; ``P`` is ``proj_size``, or
        ``H`` without a projection). None means zeros.
    params : list of ndarray
        Per layer, forward direction then reverse: ``w_ih [4H, I_l]``, ``w_hh [4H, P]``,
        ``b_ih [4H]``, ``b_hh [4H]`` (no biases when ``has_bias`` is False), then with a
        projection ``w_hr [P, H]``: PyTorch's ``_flat_weights`` order. ``I_l = I`` for layer
        0 and ``D*P`` above. Gate order i, f, g, o, as ``torch.nn.LSTM``.
    config : LSTMConfig, optional
        The settings below in one object; then none of them may be given as a keyword.
    has_bias, num_layers, bidirectional, batch_first : as in ``torch.nn.LSTM``.
    proj_size : int, default 0
        With ``proj_size > 0`` (``< H``) the hidden state is projected (LSTMP, as
        ``torch.nn.LSTM(proj_size=...)``): ``h_t = (o_t * tanh(c_t)) @ w_hr^T``.
    dropout : float in [0, 1)
        Dropout applied to each layer's output except the last, when ``train``.
    train : bool
        False runs inference: no cache is kept and no dropout applied.
    batch_sizes : array of int, optional
        Active sequences per step, non-increasing, ``batch_sizes[0] == B``.
    seed : int, numpy.random.Generator or None
        Source of the dropout masks.

    Returns
    -------
    y : ndarray
        Last layer's output, input layout with ``D*P`` features (directions concatenated);
        zero at padded positions.
    h_n, c_n : ndarray [num_layers*D, B, P], [num_layers*D, B, H]
        Final states (for variable lengths, each sequence's state at its last step).
    cache : LSTMCache or None
        Saved activations, dropout masks and the call (None when ``train`` is False):
        ``cache.backward(dy, dh_n, dc_n)`` gives the gradients.

    Examples
    --------
    >>> y, h_n, c_n, cache = lstm_forward(x, None, params, num_layers=2,
    ...                                   dropout=0.5)  # doctest: +SKIP
    >>> dx, dh0, dc0, dparams = cache.backward(dy)  # doctest: +SKIP
    """
    cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout, train,
                    proj_size)
    # The cache's backward runs on the plan of the thread that calls it.
    return _thread_plan()._forward(input, hx, params, cfg, batch_sizes, seed, lstm_backward)


def lstm_vjp(input, hx, params, *, config=None, batch_sizes=None, seed=None, **settings):
    """The forward and its vector-Jacobian product, in the manner of ``jax.vjp``.

    Parameters
    ----------
    input, hx, params, config, batch_sizes, seed, **settings
        As for :func:`lstm_forward` (``settings``: its keywords ``num_layers``,
        ``dropout`` and the like); a training forward (``train`` must be True).

    Returns
    -------
    y : ndarray
    (h_n, c_n) : tuple of ndarray
    vjp : callable
        ``vjp(dy, dh_n=None, dc_n=None, output_mask=None)`` returns the
        :class:`LSTMGradients` (:meth:`LSTMCache.backward` of the forward's cache).

    Examples
    --------
    >>> y, (h_n, c_n), vjp = lstm_vjp(x, None, params, num_layers=2)  # doctest: +SKIP
    >>> dx, dh0, dc0, dparams = vjp(dy)  # doctest: +SKIP
    """
    y, h_n, c_n, cache = lstm_forward(input, hx, params, config=config, batch_sizes=batch_sizes,
                                      seed=seed, **settings)
    if cache is None:
        raise ValueError("lstm_vjp needs a training forward (train=True): an inference "
                         "forward keeps nothing to differentiate")
    return y, (h_n, c_n), cache.backward


def lstm_backward(input, hx, params, dy, dh, dc, i, g=None, f=None, o=None, h=None, c=None,
                  tanhc=None, *, config=None, batch_sizes=None, has_bias=True, num_layers=1,
                  dropout=0.0, train=True, bidirectional=False, batch_first=False,
                  output_mask=(True, True, True, True), dropout_masks=None, proj_size=0,
                  backend="cpu"):
    """Gradients of an LSTM forward: the semantics of ``aclnnLstmBackward``.

    :meth:`LSTMCache.backward` (``cache.backward(dy)``) is the short form of this call: the
    cache holds every argument but the output gradients. This vendor-shaped form takes the
    forward's arguments again; handed the saved arrays of an ``lstm_forward`` (its
    ``cache.saved()``), it refuses arguments that describe another call.

    Parameters
    ----------
    input, hx, params, config, batch_sizes, has_bias, num_layers, dropout, train, bidirectional, batch_first, proj_size
        As given to :func:`lstm_forward`.
    dy : ndarray
        Gradient of ``y``, shaped like ``y`` (directions concatenated on the last axis);
        ignored at padded positions.
    dh, dc : ndarray [num_layers*D, B, P], [num_layers*D, B, H], or None
        Gradients of ``h_n`` and ``c_n`` (None means zeros).
    i, g, f, o, h, c, tanhc : list of ndarray
        The forward's saved activations (``cache.saved()``): ``num_layers*D`` arrays
        ``[T, B, H]`` each (h: ``[T, B, P]``), time-major, index ``layer*D + direction``.
        For float16/bfloat16 calls, the forward's own (read-only) lists give the backward
        the float32 values they were rounded from; other arrays are used as given. (The
        cache itself in place of ``i`` is a TypeError that names both forms.)
    output_mask : tuple of 4 bool
        Which of (dx, dh_prev, dc_prev, dparams) to compute; False gives None there.
    dropout_masks : list of ndarray, optional
        ``cache.dropout_masks``; required when ``dropout > 0``, ``train`` and
        ``num_layers > 1``.
    backend : {"cpu", "aclnn", "auto"}
        "aclnn" runs Huawei CANN's ``aclnnLstmBackward`` on an Ascend NPU through
        :mod:`lstmcy.aclnn` (float32/float16, no dropout between layers, no projection);
        "auto" uses it when a device is available and supports the call, else the CPU.

    Returns
    -------
    dx : ndarray or None
        Shaped like ``input`` (zero at padded positions).
    dh_prev, dc_prev : ndarray [num_layers*D, B, P], [num_layers*D, B, H], or None
        Gradients of ``h0`` and ``c0``.
    dparams : list of ndarray or None
        Shaped like ``params``; ``db_ih`` equals ``db_hh``.

    The four come as an :class:`LSTMGradients` (a named tuple).

    Raises
    ------
    ValueError
        Besides malformed arguments: ``i, ..., tanhc`` are a forward's own and a setting
        (``num_layers``, ``bidirectional``, ``batch_first``, ``has_bias``, ``proj_size``,
        ``dropout``, ``train``, ``batch_sizes``), ``input``, ``hx``, ``params`` or
        ``dropout_masks`` differs from that forward's; the message names the argument and
        the forward's value.
    """
    if backend not in ("cpu", "aclnn", "auto"):
        raise ValueError(f'backend must be "cpu", "aclnn" or "auto", got {backend!r}')
    cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout, train,
                    proj_size)
    if backend != "cpu":
        # Validate here, so that both backends refuse bad input with the same errors.
        p, arrays = _check_backward(cfg, input, hx, params, dy, dh, dc,
                                    (i, g, f, o, h, c, tanhc), batch_sizes, dropout_masks)
        output_mask = check_output_mask(output_mask)
        has_bias, num_layers, dropout, train = cfg.has_bias, cfg.num_layers, cfg.dropout, cfg.train
        bidirectional, batch_first, proj_size = cfg.bidirectional, cfg.batch_first, cfg.proj_size
        from lstmcy import aclnn

        if backend == "aclnn" and p.projected:
            raise ValueError("backend='aclnn' has no projections: aclnnLstmBackward takes no "
                             f"w_hr (got proj_size={proj_size}); use backend='cpu'")
        use_npu = backend == "aclnn" or (
            not p.projected and aclnn.is_available()
            and aclnn.unsupported_reason(p.dtype, dropout=dropout, train=train,
                                         num_layers=num_layers) is None)
        if use_npu:
            states = (p.L * p.D, p.B, p.H)
            if hx is None:
                hx = (np.zeros(states, p.dtype), np.zeros(states, p.dtype))
            dh = np.zeros(states, p.dtype) if dh is None else dh
            dc = np.zeros(states, p.dtype) if dc is None else dc
            return LSTMGradients(*aclnn.lstm_backward(
                input, tuple(hx), params, dy, dh, dc, i, g, f, o, h, c, tanhc,
                batch_sizes=batch_sizes, has_bias=has_bias, num_layers=num_layers,
                dropout=dropout, train=train, bidirectional=bidirectional,
                batch_first=batch_first, output_mask=output_mask))
    return _thread_plan().backward(
        input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, config=cfg,
        batch_sizes=batch_sizes, output_mask=output_mask, dropout_masks=dropout_masks)
