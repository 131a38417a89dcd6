"""The numpy API: :func:`lstm_forward`, :func:`lstm_backward`, :func:`lstm_vjp` and
:class:`LSTMPlan`.

The functions check their arguments into a :class:`~lstmcy._engine.validation.Problem` and run it
with :mod:`lstmcy._engine.layer_loops`'s layer loops on a plan. :class:`LSTMPlan` keeps the work
buffers between calls (the two-phase use of the Ascend operator: plan once, run many
times), made of one part per concern (:mod:`lstmcy._engine.work_buffers`,
:mod:`lstmcy._engine.results`, :mod:`lstmcy._engine.layers`, :class:`lstmcy._engine.threads.ThreadChoice`);
the plain functions use one plan per thread.
"""
import math
import threading

import numpy as np

from lstmcy._engine.cache import (ForwardCall, LSTMCache, LSTMGradients, check_same_call,
                           refuse_cache)
from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine.config import config_of
from lstmcy._engine.dispatch import kernels as _lstm
from lstmcy._engine.layer_loops import _out_dtype, run_backward, run_forward
from lstmcy._engine.layers import LayerSetups, layer_workspace
from lstmcy._engine.results import ALIGN, ResultMemory
from lstmcy._engine.saved import cache_lists, forward_problem, saved_arrays, stacked
from lstmcy._engine.schedule import DEFAULT_POLICY, SchedulePolicy
from lstmcy._engine.step import one_step_inference, plan_step
from lstmcy._engine.threads import ThreadChoice, _check_count
from lstmcy._engine.validation import (SAVED_NAMES, _check_batch_sizes, check_backward,
                                check_blas_limits, check_bool, check_int,
                                check_output_gradients, check_output_mask, check_problem,
                                check_proj_size, check_seed, is_supported_float,
                                reads_callers_arrays)
from lstmcy._engine.work_buffers import WorkBuffers

__all__ = ["lstm_forward", "lstm_backward", "lstm_vjp", "LSTMPlan", "release_workspaces"]


def _draw_masks(problem, dropout, rng):
    """``L - 1`` masks ``[T, B, D*P]`` of 0 or ``1 / (1 - dropout)`` in the caller's dtype."""
    rng = rng if rng is not None else np.random.default_rng()
    shape = (problem.T, problem.B, problem.D * problem.P)
    scale = 1.0 / (1.0 - dropout)
    return [np.where(rng.random(shape) >= dropout, scale, 0.0).astype(problem.dtype)
            for _ in range(problem.L - 1)]


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
        more are slower; see :mod:`lstmcy._engine.threads`).
    schedules : lstmcy._engine.schedule.SchedulePolicy, optional
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
            raise TypeError("schedules must be a lstmcy._engine.schedule.SchedulePolicy, got "
                            f"{type(schedules).__name__}")
        self.schedules = DEFAULT_POLICY if schedules is None else schedules
        # The plan's parts, one concern each: its work buffers, the memory of its results
        # (reused once the caller drops them), its layer setups (views of the buffers and
        # kernel objects per kind of layer call), its choice of threads per call.
        self._buffers = WorkBuffers()
        self._results = ResultMemory()
        self._setups = LayerSetups(self._buffers, self.schedules)
        self._thread_choice = ThreadChoice(self.n_threads)
        self._in_call = threading.Lock()  # held while a call uses the buffers (engine)
        # Kernel objects of cell steps per (B, I, H, dtype), and the last one used.
        self._step_kernels = {}
        self._step_kernel = None
        self.trace = None

    @property
    def workspace_size(self):
        return self._buffers.nbytes

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
        :func:`lstmcy._engine.schedule.backward_lanes`), and with a projection the rows of dh and
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
        # panels padded apart), with w_ih (the forward's fused_input, which takes at least
        # what its packed_projection does, and the backward's packed_dx).
        parts = max(1, H // 16)
        is_double = cdt == np.float64
        largest["w_packed"] = cdt.itemsize * D * max(
            [_lstm.forward_packed_len(H, P, I, P != H, split, groups, True, is_double)
             for I in in_sizes for split, groups in [(0, 1), (1, parts)]]
            + [_lstm.backward_packed_len(H, P, I, P != H, split, groups, True, is_double)
               for I in in_sizes for split, groups in [(0, 1), (1, parts)] if backward])
        # Each buffer is aligned within its allocation (see WorkBuffers.take).
        return int(sum(largest.values()) + len(largest) * (ALIGN - 1))

    def forward(self, input, hx, params, *, config=None, has_bias=True, num_layers=1,
                dropout=0.0, train=True, bidirectional=False, batch_first=False,
                batch_sizes=None, seed=None, proj_size=0):
        """Same as :func:`lstm_forward`, reusing this plan's buffers; the cache's
        :meth:`~lstmcy.LSTMCache.backward` runs on this plan too."""
        if train is False and config is None and batch_sizes is None and seed is None:
            out = one_step_inference(self, input, hx, params, has_bias, num_layers, dropout,
                                     bidirectional, batch_first, proj_size)
            if out is not None:
                return out
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
        y, h_n, c_n, saved_block, saved_rows = run_forward(self, p, cfg.train, masks)
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
                           masks, p.dtype, p.layout, run_backward,
                           p if reads_callers_arrays(p, input, hx, params) else None)
        return y, h_n, c_n, LSTMCache(*cache_lists(pieces, saved_rows, LD, call),
                                      dropout_masks=masks, call=call)

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
        kernel = self._step_kernel
        if kernel is not None and self.trace is None and self._in_call.acquire(False):
            # The last shape's kernel object: a call that fits it runs with its C checks
            # alone; any other goes through plan_step's (and the full path's) checks.
            try:
                out = kernel.run(x, hx, params, 4 if has_bias is True else
                                 (2 if has_bias is False else -1), None, _fpmode._flush)
            finally:
                self._in_call.release()
            if out is not None:
                return out
        return plan_step(self, x, hx, params, has_bias)

    def backward(self, input, hx, params, dy, dh, dc, i, g=None, f=None, o=None, h=None,
                 c=None, tanhc=None, *, config=None, batch_sizes=None, has_bias=True,
                 num_layers=1, dropout=0.0, train=True, bidirectional=False, batch_first=False,
                 output_mask=(True, True, True, True), dropout_masks=None, proj_size=0):
        """Same as :func:`lstm_backward`, reusing this plan's buffers."""
        cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout,
                        train, proj_size)
        saved = (i, g, f, o, h, c, tanhc)
        own = forward_problem(saved, cfg, input, hx, params, batch_sizes, dropout_masks)
        if own is not None:
            # The forward's own objects: its checks hold; only the gradients are new.
            p, saved_of = own
            arrays = check_output_gradients(p, dy, dh, dc)
            return LSTMGradients(*run_backward(self, p, saved_of, arrays,
                                               check_output_mask(output_mask)))
        p, arrays = _check_backward(cfg, input, hx, params, dy, dh, dc, saved, batch_sizes,
                                    dropout_masks)
        output_mask = check_output_mask(output_mask)
        cdt = p.compute_dtype

        def one(name, given, layer):
            return stacked(given, arrays[name], layer, p.D,
                           (p.T * p.B, p.P if name == "h" else p.H), cdt)

        def saved_of(layer, name=None):
            if name is not None:
                return one(name, saved[SAVED_NAMES.index(name)], layer)
            return tuple([one(name, given, layer) for name, given in zip(SAVED_NAMES, saved)])

        return LSTMGradients(*run_backward(self, p, saved_of, arrays, output_mask))

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
    if train is False and config is None and batch_sizes is None and seed is None:
        # One inference step of a cell-shaped call: on the step kernel object.
        out = one_step_inference(_thread_plan(), input, hx, params, has_bias, num_layers,
                                 dropout, bidirectional, batch_first, proj_size)
        if out is not None:
            return out
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
        from lstmcy import aclnn

        use_npu = backend == "aclnn" or (
            not p.projected and aclnn.is_available()
            and aclnn.unsupported_reason(p.dtype, dropout=cfg.dropout, train=cfg.train,
                                         num_layers=cfg.num_layers) is None)
        if use_npu:
            # The NPU operator takes both states and both state gradients: zeros for None.
            states = (p.L * p.D, p.B, p.H)
            if hx is None:
                hx = (np.zeros(states, p.dtype), np.zeros(states, p.dtype))
            for name in ("dh", "dc"):
                arrays.setdefault(name, np.zeros(states, p.dtype))
            return LSTMGradients(*aclnn.run_backward(
                p, arrays, input, tuple(hx), params, dropout=cfg.dropout, train=cfg.train,
                output_mask=output_mask))
    return _thread_plan().backward(
        input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, config=cfg,
        batch_sizes=batch_sizes, output_mask=output_mask, dropout_masks=dropout_masks)
