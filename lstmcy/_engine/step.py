"""One time step of one LSTM layer, for calls made step by step (a cell).

A step is the one-layer, one-direction, time-major call of one time step (``T = 1``, no
projection): :class:`StepShape` holds what such calls derive from their sizes alone (the
checked :class:`~lstmcy._engine.validation.Problem` of the shape, its row maps, the layer-call
keys of a :class:`~lstmcy.LSTMPlan`), so that :func:`forward` and :func:`backward`
hand the kernels their arguments without rebuilding any of it. They run the kernels with
the plan's layer setups, schedules and thread counts, so their results are bitwise those
of :func:`~lstmcy._engine.layer_loops.run_forward` / ``run_backward`` on the same arrays.
A step small enough for one thread (:func:`fits_step_kernel`, :func:`fits_step_backward`)
runs on the plan's kernel object for its shape (``StepForward``, ``StepBackward``) instead
of a layer call: the same arithmetic, in the calling thread, with its arguments checked in
C (``src/lstmcy/_step_call.pxi``).

Arrays are C-contiguous and of the shape's compute dtype (the callers check them): ``x``
``[B, I]``, ``h0`` and ``c0`` ``[B, H]``, ``w_ih [4H, I]``, ``w_hh [4H, H]``, ``bias
[4H]`` (``b_ih + b_hh``).
"""
import numpy as np

from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine.dispatch import kernels as _lstm
from lstmcy._engine.layer_loops import blas_cap, one_call_at_a_time
from lstmcy._engine.layers import _NO_PROJECTION, _packed_weights_len, layer_workspace
from lstmcy._engine.saved import no_cache, saved_arrays, saved_size
from lstmcy._engine.schedule import FLOPS_PER_THREAD, SINGLE_THREADED_GEMM
from lstmcy._engine.threads import blas_small_gemms
from lstmcy._engine.validation import _NATIVE_FLOATS as _FLOATS
from lstmcy._engine.validation import _cached, check_problem, to_compute

__all__ = ["StepShape", "step_shape", "fits_step_kernel", "fits_step_backward", "step_kernel",
           "step_backward_kernel", "forward", "backward", "backward_on_kernel", "split_dparams",
           "plan_step", "one_step_inference"]


class StepShape:
    """The size-derived arguments of the step calls of one ``(B, I, H, dtype)``."""

    __slots__ = ("problem", "B", "H", "I", "dtype", "w_hr", "rows", "forward_keys",
                 "backward_keys", "saved_size", "state_shape", "kernel_key",
                 "backward_kernel_keys")

    def __init__(self, B, I, H, dtype):
        dtype = np.dtype(dtype)
        # The problem of the shape, built by the full checks once (zero arrays: only the
        # sizes, row maps and dtypes are read from it).
        self.problem = p = check_problem(
            np.zeros((1, B, I), dtype), None,
            [np.zeros((4 * H, I), dtype), np.zeros((4 * H, H), dtype)], has_bias=False,
            num_layers=1, bidirectional=False, batch_first=False, batch_sizes=None)
        self.B, self.I, self.H, self.dtype = B, I, H, dtype
        key = (1, H, dtype)
        w_hr = _NO_PROJECTION.get(key)
        if w_hr is None:
            w_hr = _NO_PROJECTION[key] = np.empty((1, 0, H), dtype)
        self.w_hr = w_hr
        # x's rows, then the kernels' row tables of x and y (one step: rows packed).
        self.rows = (p.step_row, p.batch_stride, p.rows_packed, p.batch_sizes, p.packed_start)
        # LSTMPlan's keys of this layer call (train) and of its backward (dx, dparams).
        self.forward_keys = {train: ("forward", 0, p.shapes, p.N, p.rows_packed, train, dtype)
                             for train in (False, True)}
        self.backward_keys = {
            (dx, dparams): ("backward", 0, p.shapes, p.N, p.rows_packed, dx, dparams, dtype)
            for dx in (False, True) for dparams in (False, True)}
        self.saved_size = saved_size(p)
        self.state_shape = (1, B, H)
        # The plan's StepForward of this shape, for steps that fit it (else None).
        self.kernel_key = (B, I, H, dtype) if fits_step_kernel(B, I, H) else None
        # The plan's StepBackward per (dx, dparams), for steps that fit it (else None).
        self.backward_kernel_keys = (
            {(dx, dparams): (B, I, H, dtype, dx, dparams) for dx in (False, True)
             for dparams in (False, True)} if fits_step_backward(B, I, H) else None)


def fits_step_kernel(B, I, H):
    """Whether a step of these sizes runs on a ``StepForward`` kernel object: its
    products, ``2 B 4H (I + H)`` FLOPs, at most one thread's worth (FLOPS_PER_THREAD; the
    object runs in the calling thread and holds the GIL), and its input product one that
    OpenBLAS runs on one thread (SINGLE_THREADED_GEMM; no cap on BLAS threads needed)."""
    return (B >= 1 and I >= 1 and H >= 1 and 8 * B * H * (I + H) <= FLOPS_PER_THREAD
            and 4 * B * H * I <= SINGLE_THREADED_GEMM)


def fits_step_backward(B, I, H):
    """Whether the backward of a step of these sizes runs on a ``StepBackward`` kernel
    object: its products (dh, dx and the weight gradients, at most ``16 B H (I + H)``
    FLOPs) at most one thread's worth, and every product it may leave to BLAS (dx,
    ``B x 4H x I``; a block of dW, at most ``4H x (I + H) x B``) one that OpenBLAS runs on
    one thread."""
    return (B >= 1 and I >= 1 and H >= 1 and 16 * B * H * (I + H) <= FLOPS_PER_THREAD
            and 4 * B * H * (I + H) <= SINGLE_THREADED_GEMM)


def step_kernel(plan, key):
    """``plan``'s ``StepForward`` for ``key = (B, I, H, dtype)`` (made on first use, with
    the plan's schedule's choice of fused_input, so that it computes as the plan's layer
    call of that step does)."""
    kernel = plan._step_kernels.get(key)
    if kernel is None:
        B, I, H, dtype = key
        fused = plan.schedules.forward(1, B, I, H, 1, 1, False,
                                       itemsize=dtype.itemsize).fused_input
        kernel = plan._step_kernels[key] = _lstm.StepForward(B, I, H, dtype, fused)
    return kernel


def step_backward_kernel(plan, key):
    """``plan``'s ``StepBackward`` for ``key = (B, I, H, dtype, want_dx, want_dparams)``
    (made on first use): the plan's backward schedule of that step on one thread, on work
    buffers of its own (``layer_workspace``'s, owned by the object)."""
    kernel = plan._step_kernels.get(key)
    if kernel is None:
        B, I, H, dtype, want_dx, want_dparams = key
        small = blas_small_gemms()
        schedule = plan.schedules.backward(1, B, I, H, 1, 1, False, small_gemms=small)
        if not want_dx:  # as the layer call's: no dx, no packed w_ih
            schedule = schedule._replace(packed_dx=False)
        workspace = tuple(
            np.zeros(size, buffer_dtype) for _, size, buffer_dtype in layer_workspace(
                "backward", 1, B, B, 1, I, H, H, dtype, in_packed=True, want_dx=want_dx,
                want_dparams=want_dparams, small_gemms=small, policy=plan.schedules))
        w_packed = np.zeros(_packed_weights_len("backward", H, H, I, False, schedule, dtype),
                            dtype)
        kernel = plan._step_kernels[key] = _lstm.StepBackward(
            (1, B, B, 1, I, H, H), want_dx, want_dparams, True, schedule,
            workspace + (w_packed,), 1)
    return kernel


_shapes = {}


def step_shape(B, I, H, dtype):
    """The shared :class:`StepShape` of these sizes."""
    key = (B, I, H, dtype)
    shape = _shapes.get(key)
    if shape is None:
        shape = _cached(_shapes, key, StepShape(B, I, H, dtype))
    return shape


def _kernel_run(plan, setup, p, args):
    """Run ``setup``'s layer call on the arrays ``args`` with the thread count
    ``plan._thread_choice`` picks for it (one thread for small steps, as for any call)."""
    def run(n_threads):
        return plan._setups.run(setup, 0, p, n_threads, args, plan.trace)
    with blas_cap(p):
        plan._thread_choice.run(setup.tuner_key, p.N, setup.step_flops, setup.flops, run)


@one_call_at_a_time
def forward(plan, shape, x, h0, c0, w_ih, w_hh, bias, train):
    """One step forward on ``plan``'s buffers.

    Returns
    -------
    h, c : ndarray [B, H]
        The new states (``h`` is also the step's output).
    saved : ndarray or None
        When ``train``, the saved activations: the flat block of
        :func:`~lstmcy._engine.layer_loops.run_forward` (``shape.saved_size`` elements).
    """
    p, B, H, dtype = shape.problem, shape.B, shape.H, shape.dtype
    if shape.kernel_key is not None and plan.trace is None:
        saved_block = plan._results.empty((shape.saved_size,), dtype) if train else None
        out = step_kernel(plan, shape.kernel_key).run(x, (h0, c0), (w_ih, w_hh, bias), 3,
                                                     saved_block, _fpmode._flush)
        if out is not None:
            return out[0], out[1], saved_block
    key = shape.forward_keys[train]
    setup = plan._setups.get(key)
    if setup is None:
        setup = plan._setups.forward(key, p, shape.I, True, train)
    # y, h_n and c_n in one request; the kernel updates c in place from c0.
    out = plan._results.empty((3, 1, B, H), dtype)
    y, h_n, c_n = out
    c_n[0] = c0
    if train:
        saved_block = plan._results.empty((shape.saved_size,), dtype)
        saved = tuple(saved_arrays(saved_block, p))
    else:
        saved_block, saved = None, no_cache(1, H, H, dtype)
    step_row, stride, packed, sizes, start = shape.rows
    args = ((x, step_row, stride), (y[0], step_row, stride),
            (w_ih[np.newaxis], w_hh[np.newaxis], bias[np.newaxis], shape.w_hr),
            (h0[np.newaxis], h_n, c_n), saved, (sizes, start))
    _kernel_run(plan, setup, p, args)
    return h_n[0], c_n[0], saved_block


def backward_on_kernel(plan, shape, x, h0, c0, w_ih, w_hh, saved_block, dh, dc, want_dx,
                       want_dparams):
    """:func:`backward`'s results from ``plan``'s ``StepBackward`` of the step (which uses
    none of the plan's buffers: no call lock), or None where the step does not fit one,
    the plan traces its calls or an array is not what the object takes."""
    if shape.backward_kernel_keys is None or plan.trace is not None:
        return None
    kernel = step_backward_kernel(plan, shape.backward_kernel_keys[want_dx, want_dparams])
    return kernel.step(x, h0, c0, w_ih, w_hh, saved_block, dh, dc, _fpmode._flush)


@one_call_at_a_time
def backward(plan, shape, x, h0, c0, w_ih, w_hh, saved_block, dh, dc, want_dx, want_dparams):
    """Gradients of one :func:`forward` step (its arguments and its ``saved`` block) from
    ``dh`` and ``dc`` (``[B, H]``, the gradients of ``h`` and ``c``; None for zeros).

    Returns
    -------
    dx : ndarray [B, I] or None
        None unless ``want_dx``.
    dh0, dc0 : ndarray [B, H]
    dparams : ndarray [4H (I + H + 1)] or None
        None unless ``want_dparams``: the gradients of ``w_ih``, ``w_hh`` and of either
        bias, flattened one after the other (:func:`split_dparams` gives them back).
    """
    out = backward_on_kernel(plan, shape, x, h0, c0, w_ih, w_hh, saved_block, dh, dc,
                             want_dx, want_dparams)
    if out is not None:
        return out
    p, B, H, I, dtype = shape.problem, shape.B, shape.H, shape.I, shape.dtype
    key = shape.backward_keys[want_dx, want_dparams]
    setup = plan._setups.get(key)
    if setup is None:
        setup = plan._setups.backward(key, p, I, True, want_dx, want_dparams)
    # The kernel turns the gradients of h_n / c_n into those of h0 / c0 in place. h is
    # also the output y: its gradient goes in as dy, with a zero dh_n.
    states = plan._results.empty((2, 1, B, H), dtype)
    dh_state, dc_state = states
    dh_state.fill(0)
    if dc is None:
        dc_state.fill(0)
    else:
        dc_state[0] = dc
    dy = _zeros(B, H, dtype) if dh is None else dh
    dx = plan._results.empty((B, I), dtype) if want_dx else _empty((0, I), dtype)
    if want_dparams:
        dparams = plan._results.empty((4 * H * (I + H + 1),), dtype)
        dw_ih, dw_hh, db = (grad[np.newaxis] for grad in split_dparams(dparams, I, H))
    else:
        dw_ih, dw_hh, db = _empty((1, 0, I), dtype), _empty((1, 0, H), dtype), \
            _empty((1, 0), dtype)
    step_row, stride, packed, sizes, start = shape.rows
    saved = tuple(saved_arrays(saved_block, p))
    args = ((x, step_row, stride), (dy, step_row, stride), dx,
            (w_ih[np.newaxis], w_hh[np.newaxis], shape.w_hr),
            (h0[np.newaxis], c0[np.newaxis], dh_state, dc_state), saved,
            (dw_ih, dw_hh, db, _empty((1, 0, H), dtype)), (sizes, start))
    _kernel_run(plan, setup, p, args)
    return ((dx if want_dx else None), dh_state[0], dc_state[0],
            dparams if want_dparams else None)


def split_dparams(dparams, I, H):
    """Views ``dw_ih [4H, I]``, ``dw_hh [4H, H]``, ``db [4H]`` of a step's flat parameter
    gradients ``dparams [4H (I + H + 1)]`` (:func:`backward`'s; an ndarray or a tensor)."""
    G = 4 * H
    return (dparams[:G * I].reshape(G, I), dparams[G * I:G * (I + H)].reshape(G, H),
            dparams[G * (I + H):])


_constants = {}


def _empty(shape, dtype):
    """A shared empty array (the kernels' placeholder for what a call does not compute)."""
    key = ("empty", shape, dtype)
    array = _constants.get(key)
    if array is None:
        array = _cached(_constants, key, np.empty(shape, dtype))
    return array


def _zeros(B, H, dtype):
    """A shared read-only zero gradient ``[B, H]``."""
    key = ("zeros", B, H, dtype)
    array = _constants.get(key)
    if array is None:
        array = np.zeros((B, H), dtype)
        array.flags.writeable = False
        array = _cached(_constants, key, array)
    return array


def plan_step(plan, x, hx, params, has_bias):
    """:meth:`~lstmcy._engine.plan.LSTMPlan.step`: exact ndarrays of one native float dtype and
    the shapes of a cell run here; anything else as the full forward of ``x[None]``."""
    if (type(x) is np.ndarray and x.ndim == 2 and x.dtype in _FLOATS
            and type(has_bias) is bool and type(params) in (list, tuple)
            and len(params) == (4 if has_bias else 2)):
        dtype = x.dtype
        B, I = x.shape
        w_hh = params[1]
        H = w_hh.shape[1] if type(w_hh) is np.ndarray and w_hh.ndim == 2 else -1
        fits = all(type(w) is np.ndarray and w.dtype == dtype and w.shape == size
                   for w, size in zip(params, ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))))
        if hx is None:
            h0 = c0 = _zeros(B, H, dtype) if fits else None
        elif type(hx) in (tuple, list) and len(hx) == 2:
            h0, c0 = hx
            fits = fits and all(type(s) is np.ndarray and s.dtype == dtype and s.shape == (B, H)
                                for s in hx)
        else:
            fits = False
        if fits and B > 0:
            shape = step_shape(B, I, H, dtype)
            if shape.kernel_key is not None and plan.trace is None:
                kernel = step_kernel(plan, shape.kernel_key)
                out = _kernel_step(plan, kernel, x, hx, params, 4 if has_bias else 2)
                if out is not None:
                    plan._step_kernel = kernel  # LSTMPlan.step's first try
                    return out
            bias = params[2] + params[3] if has_bias else _zeros(1, 4 * H, dtype)[0]
            h, c, _ = forward(plan, shape, to_compute(x, dtype),
                              to_compute(h0, dtype), to_compute(c0, dtype),
                              to_compute(params[0], dtype), to_compute(w_hh, dtype),
                              to_compute(bias, dtype), False)
            return h, c
    lift = _lifted
    states = hx if hx is None or type(hx) not in (tuple, list) else type(hx)(map(lift, hx))
    _, h_n, c_n, _ = plan.forward(lift(x), states, params, has_bias=has_bias, train=False)
    return h_n[0], c_n[0]


def one_step_inference(plan, input, hx, params, has_bias, num_layers, dropout, bidirectional,
                       batch_first, proj_size):
    """``plan.forward(..., train=False)`` of one time step of a one-layer, one-direction
    LSTM without projection, on the step kernel object of its shape: ``(y, h_n, c_n,
    None)``, or None for any other call (which runs the full path, with its checks).

    The settings must be exactly their plain values (``num_layers`` the int 1, the flags
    bools, ``dropout`` 0, ``proj_size`` 0), the arrays exact ndarrays (the kernel object
    checks their dtypes, shapes and layouts)."""
    if not (type(input) is np.ndarray and input.ndim == 3 and type(num_layers) is int
            and num_layers == 1 and bidirectional is False and type(proj_size) is int
            and proj_size == 0 and type(dropout) in (int, float) and dropout == 0
            and (has_bias is True or has_bias is False)
            and (batch_first is False or batch_first is True)
            and type(params) in (list, tuple) and len(params) == (4 if has_bias else 2)):
        return None
    if batch_first:
        B, T, I = input.shape
    else:
        T, B, I = input.shape
    w_hh = params[1]
    if T != 1 or type(w_hh) is not np.ndarray or w_hh.ndim != 2 or plan.trace is not None:
        return None
    H = w_hh.shape[1]
    key = (B, I, H, input.dtype)
    kernel = plan._step_kernels.get(key)
    if kernel is None:
        if input.dtype not in _FLOATS or not fits_step_kernel(B, I, H):
            return None
        kernel = step_kernel(plan, key)
    out = _kernel_step(plan, kernel, input, hx, params, 4 if has_bias else 2,
                       _BATCH_FIRST if batch_first else _TIME_MAJOR)
    return None if out is None else (*out, None)


@one_call_at_a_time
def _kernel_step(plan, kernel, x, hx, params, n_params, layout=_lstm.StepLayout.STEP_CELL):
    """``kernel.run`` of an inference step, holding ``plan``'s call lock."""
    return kernel.run(x, hx, params, n_params, None, _fpmode._flush, layout)


_TIME_MAJOR = _lstm.StepLayout.STEP_TIME_MAJOR
_BATCH_FIRST = _lstm.StepLayout.STEP_BATCH_FIRST


def _lifted(array):
    """A 2-D array as one time step (``[1, B, F]``); anything else as given."""
    return array[np.newaxis] if isinstance(array, np.ndarray) and array.ndim == 2 else array
