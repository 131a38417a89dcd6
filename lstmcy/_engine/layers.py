"""The layer calls of a plan: their work buffers, their kernel objects, running them.

One layer call is one layer, both directions, forward or backward. What it derives from
its sizes alone is made once per kind of call (:class:`LayerSetup`: its work buffers'
views, its kernel object per thread count, the work that decides its threads) and kept by
the plan's :class:`LayerSetups`; :func:`layer_workspace` is the one description of its
work buffers (the setups take them, :meth:`lstmcy.LSTMPlan.required_workspace` bounds
them).
"""
import functools

import numpy as np

from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine.dispatch import kernels as _lstm
from lstmcy._engine.schedule import DEFAULT_POLICY
from lstmcy._engine.threads import _process_cpus, blas_small_gemms

__all__ = ["layer_weights", "layer_workspace", "LayerSetup", "LayerSetups"]

#: Setups (and tuners) kept per plan; beyond this, many shapes: the old ones are forgotten.
MAX_KINDS = 64

_NO_PROJECTION = {}
def layer_weights(problem, layer):
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
def _packed_weights_len(kind, H, P, I, projected, schedule, dtype):
    """Elements of one direction's packed weights in a ``kind`` ("forward" or "backward")
    layer call of that schedule (``I`` input features)."""
    is_double = dtype == np.float64
    if kind == "forward":
        return _lstm.forward_packed_len(H, P, I, projected, schedule.split, schedule.groups,
                                        schedule.fused_input, is_double,
                                        schedule.packed_projection)
    return _lstm.backward_packed_len(H, P, I, projected, schedule.split, schedule.groups,
                                     schedule.packed_dx, is_double)


def layer_workspace(kind, T, B, N, D, I, H, P, dtype, *, in_packed=False, want_dx=True,
                    want_dparams=True, small_gemms=False, policy=DEFAULT_POLICY):
    """The work buffers of one layer call but its packed weights, in the kernel object's
    order: a tuple of ``(name, shape, dtype)``.

    The one description of a call's work buffers: a plan's setups take these (buffers of
    one name are shared by every call of a plan, grown to the largest), and
    :meth:`~lstmcy.LSTMPlan.required_workspace` bounds them. ``kind`` is "forward" or
    "backward"; ``T, B, N, D, I, H, P`` the steps, batch rows, packed rows, directions, input
    features, units and size of h (``P < H``: projected); ``dtype`` the compute dtype
    (float32 or float64); ``in_packed``: the input rows are in packed order (no gathered
    copy); ``want_dx``, ``want_dparams``: what a backward computes; ``small_gemms``: the
    BLAS has a small-GEMM path; ``policy``: the plan's
    :class:`~lstmcy._engine.schedule.SchedulePolicy`.
    """
    dtype = np.dtype(dtype)
    projected = P != H
    gates = ("gates", (D, N, policy.row_stride(H, dtype)), dtype)
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


class LayerSetup:
    """What one kind of layer call derives from its shapes alone.

    ``key``: the plan's key of the kind of call; ``kind``: "forward" or "backward";
    ``sizes``: ``(T, B, N, D, I, H, P)`` (T: the batch layout's steps, none when B is 0;
    I: the layer's input features); ``flags``: the kernel object's flags after the sizes
    (forward: ``training, x_rows_packed``; backward: ``want_dx, want_dparams,
    x_rows_packed``); ``workspaces``: its work buffers but the packed weights, in its
    order; ``tuner_key``, ``step_flops`` and ``flops``: :meth:`lstmcy._engine.threads.ThreadChoice.run`'s arguments;
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


class LayerSetups:
    """A plan's :class:`LayerSetup` per kind of layer call.

    A setup holds views of the plan's work buffers: every setup is dropped when a buffer
    is replaced (its views would keep the old memory alive), and all of them past
    ``MAX_KINDS`` kinds of call.

    Parameters
    ----------
    buffers : lstmcy._engine.work_buffers.WorkBuffers
        The plan's work buffers.
    schedules : lstmcy._engine.schedule.SchedulePolicy
        The plan's schedules.
    """

    def __init__(self, buffers, schedules=DEFAULT_POLICY):
        self._buffers = buffers
        self.schedules = schedules
        self._setups = {}  # key of a kind of layer call -> its LayerSetup
        self._generation = buffers.generation  # of the buffers the setups' views are of

    def get(self, key):
        """The setup of the layer calls of ``key``, or None."""
        if self._generation != self._buffers.generation:
            return None
        return self._setups.get(key)

    def values(self):
        """The setups kept (of the current buffers)."""
        return list(self._setups.values()) if self._generation == self._buffers.generation else []

    def _remember(self, key, setup):
        """Keep ``setup``, the :class:`LayerSetup` of the layer calls of ``key``, made on
        the current buffers."""
        if self._generation != self._buffers.generation or len(self._setups) >= MAX_KINDS:
            self._setups.clear()
            self._generation = self._buffers.generation
        self._setups[key] = setup
        return setup

    def forward(self, key, p, in_size, in_packed, train):
        """The :class:`LayerSetup` of a forward layer call with ``in_size`` input features
        (``in_packed``: its input rows are in packed order)."""
        D, N, H, P, cdt = p.D, p.N, p.H, p.P, p.compute_dtype
        workspaces = tuple(self._buffers.take(*buffer) for buffer in layer_workspace(
            "forward", p.T, p.B, N, D, in_size, H, P, cdt, in_packed=in_packed,
            policy=self.schedules))
        flops_per_row = 8.0 * D * H * (in_size + P) + (2.0 * D * H * P if p.projected else 0)
        return self._remember(key, LayerSetup(
            key, "forward", (len(p.batch_sizes), p.B, N, D, in_size, H, P), (train, in_packed),
            workspaces,
            ("forward", p.B, in_size, H, P, D, train, cdt), p.B * flops_per_row,
            N * flops_per_row))

    def backward(self, key, p, in_size, in_packed, want_dx, want_dparams):
        """The :class:`LayerSetup` of a backward layer call with ``in_size`` input features
        (``in_packed``: its input rows are in packed order; ``want_dx``: it computes the
        input gradient)."""
        T, B, D, N, H, P, cdt = p.T, p.B, p.D, p.N, p.H, p.P, p.compute_dtype
        projected = p.projected
        workspaces = tuple(self._buffers.take(*buffer) for buffer in layer_workspace(
            "backward", T, B, N, D, in_size, H, P, cdt, in_packed=in_packed, want_dx=want_dx,
            want_dparams=want_dparams, small_gemms=blas_small_gemms(), policy=self.schedules))
        flops_per_row = 16.0 * D * H * (in_size + P) + (6.0 * D * H * P if projected else 0)
        return self._remember(key, LayerSetup(
            key, "backward", (len(p.batch_sizes), B, N, D, in_size, H, P),
            (want_dx, want_dparams, in_packed),
            workspaces, ("backward", B, in_size, H, P, D, want_dx, want_dparams, cdt),
            B * flops_per_row, N * flops_per_row))

    def kernel_object(self, setup, p, n_threads):
        """The kernel object of ``setup``'s layer call on ``n_threads`` threads (made once).
        The schedule is that of at most the process's CPUs (unless the plan's
        :class:`~lstmcy._engine.schedule.SchedulePolicy` says otherwise): threads beyond them
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
        w_packed = self._buffers.take(
            "w_packed",
            (D * _packed_weights_len(setup.kind, H, P, setup.in_size, p.projected, schedule,
                                     cdt),),
            cdt)
        if self.get(setup.key) is not setup:
            # w_packed grew, which dropped the setups: this one's other buffers are current,
            # its kernel objects of other counts hold the old w_packed.
            setup.by_threads.clear()
            self._remember(setup.key, setup)
        call = setup.by_threads[n_threads] = kernel(
            setup.sizes, *setup.flags, schedule, setup.workspaces + (w_packed,), n_threads)
        return call

    def run(self, setup, layer, p, n_threads, args, trace=None):
        """Run ``setup``'s layer call of ``layer`` on ``n_threads`` threads with the
        per-call arrays ``args`` (its kernel object's ``run`` arguments before
        ``flush_denormals``), appending ``(kind, layer, entries)`` of its tasks to
        ``trace`` when that is a list (see :attr:`lstmcy.LSTMPlan.trace`)."""
        call = setup.by_threads.get(n_threads) or self.kernel_object(setup, p, n_threads)
        if trace is None:
            return call.run(*args, _fpmode._flush)
        entries = np.zeros((1 << 16, 8), dtype=np.int64)
        n_trace = call.run(*args, _fpmode._flush, entries)
        trace.append((setup.kind, layer, entries[:n_trace]))
        return n_trace
