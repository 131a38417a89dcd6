"""The engine: a checked problem in, the kernels' results out.

The layer loops (:func:`run_forward`, :func:`run_backward`) run a call on a plan's
buffers, layer after layer (the backward from the top), routing each layer's output (and,
backwards, its input gradient) to the next, applying the dropout masks between layers
and converting results to the caller's dtype. The front ends build on them: the numpy
functions through :class:`~lstmcy.LSTMPlan`, :mod:`lstmcy.torch` through :func:`forward`
and :func:`backward` below. A call is described once by a
:class:`~lstmcy._engine.validation.Problem`:

* :func:`~lstmcy._engine.validation.check_problem` builds it from any arguments the numpy API
  takes, checking each one;
* :func:`~lstmcy._engine.validation.trusted_problem` builds it for a padded call whose caller has
  checked its arrays itself (``lstmcy.torch``: the module checks its tensors as
  ``torch.nn.LSTM`` does).

:func:`forward` runs it and returns the saved activations as one flat block;
:func:`backward` takes that block back. Both run on the calling thread's plan (its work
buffers reused between calls; thread-safe, since each thread has its own) unless given
another :class:`~lstmcy._engine.plan.LSTMPlan`. Arrays are numpy arrays: a caller with tensors
hands in zero-copy views.

Dropout between layers is the caller's to draw: ``masks`` are the ``L - 1`` multipliers of
the lower layers' outputs, each ``[T, B, D*P]`` time-major (padded rows are ignored),
scaled by ``1 / (1 - p)`` where kept.
"""
import functools
import math

import numpy as np

from lstmcy._engine.layers import layer_weights
from lstmcy._engine.saved import block_reader, no_cache, saved_arrays, saved_size
from lstmcy._engine.schedule import SINGLE_THREADED_GEMM
from lstmcy._engine.threads import blas_single_threaded
from lstmcy._engine.validation import (SAVED_NAMES, check_array, check_output_gradients,
                                check_problem, to_compute, trusted_problem)

__all__ = ["forward", "backward", "run_forward", "run_backward", "saved_size", "saved_views",
           "check_problem", "trusted_problem", "SAVED_NAMES"]


def _calling_threads_plan():
    """The calling thread's plan (the one its plain numpy calls use)."""
    from lstmcy._engine.plan import _thread_plan  # plan builds on this module
    return _thread_plan()


def forward(problem, train=True, masks=None, plan=None):
    """Run the forward of ``problem``.

    Parameters
    ----------
    problem : Problem
        From :func:`check_problem` or :func:`trusted_problem`.
    train : bool
        Keep the activations the backward needs.
    masks : list of ndarray [T, B, D*P], optional
        Dropout multipliers of layers ``0 .. L-2``'s outputs (None: no dropout).
    plan : LSTMPlan, optional
        Whose buffers and thread count to use (default: the calling thread's plan).

    Returns
    -------
    y : ndarray
        Output in the input's layout, ``D*P`` features, in the problem's dtype.
    h_n, c_n : ndarray [L*D, B, P], [L*D, B, H]
    saved : ndarray or None
        When ``train``: the seven activations of every layer and direction as one flat
        block of :func:`saved_size` elements in the compute dtype (float32 for
        float16/bfloat16 problems); :func:`saved_views` shows its parts. Else None.
    """
    plan = _calling_threads_plan() if plan is None else plan
    return run_forward(plan, problem, train, masks)[:4]


def backward(problem, saved, dy, dh=None, dc=None, masks=None,
             output_mask=(True, True, True, True), plan=None):
    """Gradients of the forward of ``problem`` that returned ``saved``.

    Parameters
    ----------
    problem : Problem
        The forward's, or one built the same way from the same arrays.
    saved : ndarray
        :func:`forward`'s block (used as is: no copy, no check of its values).
    dy : ndarray
        Gradient of ``y``, shaped like it (ignored at padded positions).
    dh, dc : ndarray [L*D, B, P], [L*D, B, H], optional
        Gradients of ``h_n`` and ``c_n`` (None: zeros).
    masks : list of ndarray [T, B, D*P], optional
        The forward's dropout multipliers.
    output_mask : tuple of 4 bool
        Which of ``(dx, dh0, dc0, dparams)`` to compute.
    plan : LSTMPlan, optional
        As for :func:`forward`.

    Returns
    -------
    dx, dh0, dc0 : ndarray or None
        In the problem's dtype; None where ``output_mask`` is False.
    dparams : list of ndarray or None
        In the order of the problem's parameters.
    """
    if saved is None or saved.size != saved_size(problem):
        raise ValueError(f"saved must be the forward's block of {saved_size(problem)} elements, "
                         f"got {None if saved is None else saved.size}")
    # The kernels index these by the problem's sizes: their shapes are checked even for a
    # trusted problem.
    shapes, dtype = problem.shapes, problem.dtype
    arrays = check_output_gradients(problem, dy, dh, dc)
    if masks is not None:
        if len(masks) != problem.L - 1:
            raise ValueError(f"masks must be {problem.L - 1} arrays, got {len(masks)}")
        arrays["dropout_masks"] = [check_array(f"masks[{k}]", m, shapes.mask, dtype)
                                   for k, m in enumerate(masks)]
    plan = _calling_threads_plan() if plan is None else plan
    return run_backward(plan, problem, block_reader(saved, problem), arrays,
                        tuple(bool(m) for m in output_mask))


def saved_views(saved, problem):
    """The parts of a saved block: name (``SAVED_NAMES``) -> ``[L*D, T, B, F]`` view (F is
    H, for h P)."""
    p = problem
    return dict(zip(SAVED_NAMES, saved_arrays(saved, p, by_step=True)))


def _as_rows(array):
    """2-D view ``[rows, features]`` of a C-contiguous array (also when features == 0)."""
    return array.reshape(math.prod(array.shape[:-1]), array.shape[-1])


def _out_dtype(array, dtype):
    if array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):  # float16 overflow to inf is the right answer
        return array.astype(dtype)


def one_call_at_a_time(method):
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


def blas_cap(problem):
    """Cap BLAS to one thread (results must not depend on the BLAS thread count, and
    OpenBLAS rounds differently with more threads), unless every GEMM of the call is so
    small that BLAS runs it on one thread anyway: the cap costs tens of microseconds."""
    width = max(problem.I, problem.D * problem.P) if problem.L > 1 else problem.I
    largest = problem.N * 4 * problem.H * (width + problem.P + problem.H)
    return blas_single_threaded(active=largest > SINGLE_THREADED_GEMM)


@one_call_at_a_time
def run_forward(plan, p, train, masks):
    """The forward of a checked :class:`~lstmcy._engine.validation.Problem` on ``plan``'s
    buffers (``masks``: the dropout masks, or None). Callers that build ``p`` themselves
    (``lstmcy.torch``) vouch for its arrays as :func:`~lstmcy._engine.validation.check_problem`
    would.

    Returns ``y, h_n, c_n`` in the caller's dtype and, when ``train``, the saved
    activations as one flat compute-dtype block of ``saved_size(p)`` elements and its
    :func:`~lstmcy._engine.saved.saved_arrays` views (else None, None): the numpy API wraps them
    in an :class:`~lstmcy.LSTMCache`, and :func:`run_backward` reads the block through
    :func:`~lstmcy._engine.saved.block_reader`."""
    T, B, H, P, L, D, N = p.T, p.B, p.H, p.P, p.L, p.D, p.N
    cdt = p.compute_dtype
    alloc = plan._results.empty if p.uniform else plan._results.zeros

    y = alloc(p.output_shape(), dtype=cdt)
    y_rows = _as_rows(y)
    # The kernels write the final states (c in place, from c0); h_n starts as h0 for
    # calls without steps. One request for both.
    states = plan._results.empty((p.h0.size + p.c0.size,), dtype=cdt)
    h_n = states[:p.h0.size].reshape(p.h0.shape)
    c_n = states[p.h0.size:].reshape(p.c0.shape)
    h_n[...] = p.h0
    c_n[...] = p.c0
    if train:
        # One request for all seven (they live and die together, in the cache).
        saved_block = alloc((saved_size(p),), dtype=cdt)
        saved_all = saved_arrays(saved_block, p)
    else:
        inference_saved = no_cache(D, H, P, cdt)
    internal_step_row, _, internal_packed = p.time_major_map

    layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
    with blas_cap(p):
        for layer in range(L):
            last = layer == L - 1
            if last:
                out, out_step_row, out_stride = y_rows, p.step_row, p.batch_stride
            else:
                out = alloc((T * B, D * P), dtype=cdt)
                out_step_row, out_stride = internal_step_row, 1
            in_size = layer_in.shape[1]
            w_ih, w_hh, bias, w_hr = layer_weights(p, layer)
            ks = slice(layer * D, (layer + 1) * D)
            if not train:
                saved = inference_saved
            elif L == 1:
                saved = tuple(saved_all)
            else:
                saved = tuple([a[ks] for a in saved_all])
            key = ("forward", layer, p.shapes, N, in_packed, train, cdt)
            setup = plan._setups.get(key) or plan._setups.forward(key, p, in_size, in_packed, train)
            states = (p.h0, h_n, c_n) if L == 1 else (p.h0[ks], h_n[ks], c_n[ks])
            args = ((layer_in, in_step_row, in_stride), (out, out_step_row, out_stride),
                    (w_ih, w_hh, bias, w_hr), states, saved, (p.batch_sizes, p.packed_start))

            def run(n_threads, args=args, layer=layer, setup=setup):
                return plan._setups.run(setup, layer, p, n_threads, args, plan.trace)

            plan._thread_choice.run(setup.tuner_key, N, setup.step_flops, setup.flops, run)
            if not last:
                if masks is not None:
                    with np.errstate(invalid="ignore"):  # inf * 0 -> NaN, as in torch; no warning
                        out *= to_compute(masks[layer], cdt).reshape(T * B, D * P)
                layer_in, in_step_row, in_stride, in_packed = out, internal_step_row, 1, internal_packed

    if p.dtype != cdt:  # float16/bfloat16 callers
        y, h_n, c_n = (_out_dtype(a, p.dtype) for a in (y, h_n, c_n))
    return y, h_n, c_n, saved_block if train else None, saved_all if train else None


@one_call_at_a_time
def run_backward(plan, p, saved_of, arrays, output_mask):
    """The backward of checked arguments on ``plan``'s buffers: ``p`` and ``arrays`` as
    :func:`~lstmcy._engine.validation.check_backward` returns them (only ``dy``, ``dh``,
    ``dc`` and ``dropout_masks`` are read from ``arrays``), ``saved_of(layer)`` the seven
    saved activations of ``layer``'s directions in ``SAVED_NAMES`` order, each a
    C-contiguous ``[D, T*B, F]`` compute-dtype array (F = H, for h P), and
    ``saved_of(layer, name)`` the one of ``name`` (:func:`~lstmcy._engine.saved.rows_reader`),
    ``output_mask`` a tuple of four bools."""
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

    alloc = plan._results.empty if p.uniform else plan._results.zeros
    internal_step_row, _, internal_packed = p.time_major_map
    per_dir = len(shapes.param_names)
    dparams = [None] * (L * D * per_dir)
    dx = None
    upper_dy, dy_step_row, dy_stride = dy_rows, p.step_row, p.batch_stride
    with blas_cap(p):
        for layer in reversed(range(L)):
            ks = slice(layer * D, (layer + 1) * D)
            saved = saved_of(layer)
            if layer == 0:
                layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
                layer_dx_needed = want_dx
            else:
                below = list(saved_of(layer - 1, "h"))
                layer_in = plan._results.empty((T * B, D * P), cdt)
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
                grads = plan._results.empty((e3,), dtype=cdt)
                dw_ih = grads[:e0].reshape(D, 4 * H, in_size)
                dw_hh = grads[e0:e1].reshape(D, 4 * H, P)
                db = grads[e1:e2].reshape(D, 4 * H)
                dw_hr = grads[e2:e3].reshape(D, hr, H)
            else:
                dw_ih = np.empty((D, 0, in_size), dtype=cdt)
                dw_hh = np.empty((D, 0, P), dtype=cdt)
                db = np.empty((D, 0), dtype=cdt)
                dw_hr = np.empty((D, 0, H), dtype=cdt)
            w_ih, w_hh, _, w_hr = layer_weights(p, layer)
            key = ("backward", layer, p.shapes, N, in_packed, layer_dx_needed, want_dparams, cdt)
            setup = plan._setups.get(key) or plan._setups.backward(
                key, p, in_size, in_packed, layer_dx_needed, want_dparams)
            if L == 1:
                h0, c0, dh_layer, dc_layer = p.h0, p.c0, dh_state, dc_state
            else:
                h0, c0, dh_layer, dc_layer = p.h0[ks], p.c0[ks], dh_state[ks], dc_state[ks]
            args = ((layer_in, in_step_row, in_stride), (upper_dy, dy_step_row, dy_stride),
                    layer_dx, (w_ih, w_hh, w_hr), (h0, c0, dh_layer, dc_layer), saved,
                    (dw_ih, dw_hh, db, dw_hr), (p.batch_sizes, p.packed_start))

            def run(n_threads, args=args, layer=layer, setup=setup):
                return plan._setups.run(setup, layer, p, n_threads, args, plan.trace)

            plan._thread_choice.run(setup.tuner_key, N, setup.step_flops, setup.flops, run)
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

    dh_prev = dh_state if want_dh else None
    dc_prev = dc_state if want_dc else None
    dparams = dparams if want_dparams else None
    dtype = p.dtype
    if dtype != cdt:  # float16/bfloat16 callers
        dx, dh_prev, dc_prev = (None if a is None else _out_dtype(a, dtype)
                                for a in (dx, dh_prev, dc_prev))
        dparams = None if dparams is None else [_out_dtype(a, dtype) for a in dparams]
    return dx, dh_prev, dc_prev, dparams
