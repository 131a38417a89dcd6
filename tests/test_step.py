"""The one-step entry (:mod:`lstmcy._engine.step`) and ``LSTMPlan.step``.

A step must give bitwise the results of the full path (``_engine.forward`` /
``backward`` of the same arrays, and ``LSTMPlan.forward`` with ``T = 1``), for the
shapes and thread counts that pick other schedules; ``LSTMPlan.step`` must refuse what
``LSTMPlan.forward`` refuses, with the same errors.
"""
import numpy as np
import pytest

import lstmcy
from lstmcy._engine import layer_loops as _engine
from lstmcy._engine import step as _step
from lstmcy._engine.validation import check_problem

SHAPES = [(1, 16, 32), (3, 5, 7), (32, 16, 32), (2, 1, 1), (8, 40, 256)]


def _arrays(B, I, H, dtype, seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) * 0.5
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    x = rng.standard_normal((B, I)).astype(dtype)
    h = rng.standard_normal((B, H)).astype(dtype)
    c = rng.standard_normal((B, H)).astype(dtype)
    return x, h, c, params


@pytest.mark.parametrize("B, I, H", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_threads", [None, 1, 2])
def test_step_is_bitwise_the_full_path(B, I, H, dtype, n_threads):
    x, h, c, params = _arrays(B, I, H, dtype)
    plan = lstmcy.LSTMPlan(n_threads=n_threads)
    shape = _step.step_shape(B, I, H, np.dtype(dtype))
    h1, c1, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                  params[2] + params[3], True)
    p = check_problem(x[None], (h[None], c[None]), params, has_bias=True, num_layers=1,
                      bidirectional=False, batch_first=False, batch_sizes=None)
    full_plan = lstmcy.LSTMPlan(n_threads=n_threads)
    y, h_n, c_n, full_saved = _engine.forward(p, True, plan=full_plan)
    assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])
    assert np.array_equal(h1, y[0])
    assert np.array_equal(saved, full_saved)
    # Inference: the same states, nothing saved.
    h2, c2, none = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                 params[2] + params[3], False)
    assert none is None and np.array_equal(h2, h1) and np.array_equal(c2, c1)

    rng = np.random.default_rng(1)
    dh = rng.standard_normal((B, H)).astype(dtype)
    dc = rng.standard_normal((B, H)).astype(dtype)
    for want_dx, want_dparams in [(True, True), (False, True), (True, False)]:
        dx, dh0, dc0, dparams = _step.backward(
            plan, shape, x, h, c, params[0], params[1], saved, dh, dc, want_dx, want_dparams)
        fdx, fdh0, fdc0, fdparams = _engine.backward(
            p, full_saved, dh[None], None, dc[None],
            output_mask=(want_dx, True, True, want_dparams), plan=full_plan)
        assert np.array_equal(dh0, fdh0[0]) and np.array_equal(dc0, fdc0[0])
        if want_dx:
            assert np.array_equal(dx, fdx[0])
        else:
            assert dx is None
        if want_dparams:
            assert dparams.shape == (4 * H * (I + H + 1),)
            dw_ih, dw_hh, db = _step.split_dparams(dparams, I, H)
            for ours, full in zip((dw_ih, dw_hh, db, db), fdparams):
                assert ours.shape == full.shape and np.array_equal(ours, full)
        else:
            assert dparams is None
    # No output gradients: zeros for dh, dc.
    _, dh0, dc0, *_ = _step.backward(plan, shape, x, h, c, params[0], params[1], saved,
                                     None, None, False, False)
    _, fdh0, fdc0, _ = _engine.backward(p, full_saved, np.zeros_like(dh[None]),
                                        output_mask=(False, True, True, False), plan=full_plan)
    assert np.array_equal(dh0, fdh0[0]) and np.array_equal(dc0, fdc0[0])


@pytest.mark.parametrize("B, I, H", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("has_bias", [True, False])
def test_plan_step_is_bitwise_the_forward(B, I, H, dtype, has_bias):
    x, h, c, params = _arrays(B, I, H, dtype, seed=2)
    params = params if has_bias else params[:2]
    plan = lstmcy.LSTMPlan()
    for hx in ((h, c), None):
        h1, c1 = plan.step(x, hx, params, has_bias=has_bias)
        states = None if hx is None else (h[None], c[None])
        _, h_n, c_n, _ = plan.forward(x[None], states, params, has_bias=has_bias, train=False)
        assert h1.shape == c1.shape == (B, H)
        assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])
    # Strided (non-contiguous) arrays give the same bits.
    wide = np.zeros((B, 2 * I), dtype)
    wide[:, ::2] = x
    h3, c3 = plan.step(wide[:, ::2], (h, c), params, has_bias=has_bias)
    h1, c1 = plan.step(x, (h, c), params, has_bias=has_bias)
    assert np.array_equal(h3, h1) and np.array_equal(c3, c1)


def test_plan_step_takes_other_dtypes_as_the_forward():
    x, h, c, params = _arrays(2, 3, 4, np.float16)
    h1, c1 = lstmcy.LSTMPlan().step(x, (h, c), params)
    _, h_n, c_n, _ = lstmcy.LSTMPlan().forward(x[None], (h[None], c[None]), params, train=False)
    assert h1.dtype == np.float16 and np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["input size", "state shape", "dtype mix", "param count",
                                  "1-D input", "list input", "state count", "bias flag"])
def test_plan_step_errors_are_the_forwards(case):
    x, h, c, params = _arrays(2, 3, 4, np.float32)
    hx, has_bias = (h, c), True
    if case == "input size":
        x = x[:, :2]
    elif case == "state shape":
        hx = (h[:1], c)
    elif case == "dtype mix":
        hx = (h.astype(np.float64), c)
    elif case == "param count":
        params = params[:3]
    elif case == "1-D input":
        x = x[0]
    elif case == "list input":
        x = x.tolist()
    elif case == "state count":
        hx = (h,)
    elif case == "bias flag":
        has_bias = False
    lift = (lambda a: a[None] if isinstance(a, np.ndarray) and a.ndim == 2 else a)
    states = type(hx)(map(lift, hx))
    expected = _error(lambda: lstmcy.LSTMPlan().forward(lift(x), states, params,
                                                        has_bias=has_bias, train=False))
    assert _error(lambda: lstmcy.LSTMPlan().step(x, hx, params, has_bias=has_bias)) == expected
    # The same error from a plan whose step kernel object ran this shape before.
    warm = lstmcy.LSTMPlan()
    good_x, good_h, good_c, good_params = _arrays(2, 3, 4, np.float32)
    warm.step(good_x, (good_h, good_c), good_params)
    assert warm._step_kernel is not None
    assert _error(lambda: warm.step(x, hx, params, has_bias=has_bias)) == expected


@pytest.mark.parametrize("warm", [False, True])
def test_plan_step_refuses_a_second_thread(warm):
    """The step holds the plan's call lock, as every call on a plan does (also on the
    kernel object of a shape it ran before)."""
    x, h, c, params = _arrays(1, 3, 4, np.float32)
    plan = lstmcy.LSTMPlan()
    if warm:
        plan.step(x, (h, c), params)
        assert plan._step_kernel is not None
    plan._in_call.acquire()
    try:
        with pytest.raises(RuntimeError, match="already running a call"):
            plan.step(x, (h, c), params)
    finally:
        plan._in_call.release()
    plan.step(x, (h, c), params)


# Step kernel objects (StepForward): the shapes take both input products (B below and at
# FUSED_INPUT_ROWS), the largest fits fits_step_kernel.
KERNEL_SHAPES = [(1, 16, 32), (3, 5, 7), (4, 16, 32), (8, 3, 40), (1, 1, 1), (16, 24, 48)]


def _full_forward(x, hx, params, has_bias, train):
    p = check_problem(x[None], None if hx is None else (hx[0][None], hx[1][None]), params,
                      has_bias=has_bias, num_layers=1, bidirectional=False, batch_first=False,
                      batch_sizes=None)
    return _engine.forward(p, train, plan=lstmcy.LSTMPlan())


@pytest.mark.parametrize("B, I, H", KERNEL_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_kernel_is_bitwise_the_layer_call(B, I, H, dtype):
    assert _step.fits_step_kernel(B, I, H)
    x, h, c, params = _arrays(B, I, H, dtype, seed=3)
    before = [a.copy() for a in (x, h, c, *params)]
    plan = lstmcy.LSTMPlan()
    key = (B, I, H, np.dtype(dtype))
    for has_bias in (True, False):
        weights = params if has_bias else params[:2]
        for hx in ((h, c), None):
            h1, c1 = plan.step(x, hx, weights, has_bias=has_bias)
            assert plan._step_kernel is plan._step_kernels[key]
            h2, c2 = plan.step(x, hx, weights, has_bias=has_bias)  # the first-try path
            _, h_n, c_n, _ = _full_forward(x, hx, weights, has_bias, False)
            for ours in ((h1, c1), (h2, c2)):
                assert np.array_equal(ours[0], h_n[0]) and np.array_equal(ours[1], c_n[0])
            assert h1.dtype == dtype and h1.flags.c_contiguous and h1.flags.writeable
            assert not np.shares_memory(h1, h2) and not np.shares_memory(c1, c2)
    # Training: the saved activations are the layer call's too.
    shape = _step.step_shape(B, I, H, np.dtype(dtype))
    h1, c1, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                  params[2] + params[3], True)
    y, h_n, c_n, full_saved = _full_forward(x, (h, c), params, True, True)
    assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])
    assert np.array_equal(saved, full_saved)
    for a, b in zip(before, (x, h, c, *params)):
        assert np.array_equal(a, b)  # inputs untouched


def test_step_kernel_follows_the_plans_schedule():
    """The kernel object's input product is the one the plan's schedule picks."""
    from lstmcy._engine.schedule import SchedulePolicy, forward_schedule

    def unfused(*args, **kwargs):
        return forward_schedule(*args, **kwargs)._replace(fused_input=False)

    x, h, c, params = _arrays(8, 3, 40, np.float32, seed=4)
    plan = lstmcy.LSTMPlan(schedules=SchedulePolicy(forward=unfused))
    h1, c1 = plan.step(x, (h, c), params)
    assert not plan._step_kernel.fused_input
    assert lstmcy.LSTMPlan().step(x, (h, c), params) is not None
    _, h_n, c_n, _ = plan.forward(x[None], (h[None], c[None]), params, train=False)
    assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])


def test_step_kernel_reads_weights_changed_in_place():
    x, h, c, params = _arrays(2, 5, 6, np.float64, seed=5)
    plan = lstmcy.LSTMPlan()
    plan.step(x, (h, c), params)
    for w in params:
        w *= 0.5
    h1, c1 = plan.step(x, (h, c), params)
    _, h_n, c_n, _ = _full_forward(x, (h, c), params, True, False)
    assert np.array_equal(h1, h_n[0]) and np.array_equal(c1, c_n[0])


def _spellings(a):
    """The array as the kernel object does not take it (each runs the full path)."""
    fortran = np.asfortranarray(a) if a.ndim == 2 and min(a.shape) > 1 else None

    class Sub(np.ndarray):
        pass

    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    unaligned = np.frombuffer(b"\0" + a.tobytes(), a.dtype, offset=1).reshape(a.shape) \
        if a.size else None
    readonly = a.copy()
    readonly.flags.writeable = False
    return [s for s in (fortran, a.view(Sub), wide[..., ::2], unaligned, readonly)
            if s is not None]


@pytest.mark.parametrize("which", ["x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh"])
def test_step_kernel_falls_back_for_other_layouts(which):
    """Arrays the kernel object does not take (Fortran order, subclasses, strided,
    unaligned) run the full path and give its results; read-only ones are taken;
    byte-swapped ones get the full path's error."""
    x, h, c, params = _arrays(3, 4, 5, np.float32, seed=6)
    plan = lstmcy.LSTMPlan()
    plan.step(x, (h, c), params)
    names = ["x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh"]
    arrays = [x, h, c, *params]
    k = names.index(which)
    expected = plan.step(x, (h, c), params)
    for spelled in _spellings(arrays[k]):
        args = list(arrays)
        args[k] = spelled
        h1, c1 = plan.step(args[0], (args[1], args[2]), args[3:])
        assert np.array_equal(h1, expected[0]) and np.array_equal(c1, expected[1])
    args = list(arrays)
    args[k] = arrays[k].astype(arrays[k].dtype.newbyteorder())
    with pytest.raises(TypeError, match="native byte order"):
        plan.step(args[0], (args[1], args[2]), args[3:])


def test_step_kernel_flushes_subnormals_as_the_layer_call():
    tiny = np.float32(1e-39)  # subnormal in float32
    x, h, c, params = _arrays(2, 3, 4, np.float32, seed=7)
    c = np.full_like(c, tiny)
    x = np.full_like(x, tiny)
    for flush in (True, False):
        previous = lstmcy.get_flush_denormals()
        lstmcy.set_flush_denormals(flush)
        try:
            h1, c1 = lstmcy.LSTMPlan().step(x, (h, c), params)
            h2, c2 = lstmcy.LSTMPlan().step(x, (h, c), params)
            _, h_n, c_n, _ = _full_forward(x, (h, c), params, True, False)
        finally:
            lstmcy.set_flush_denormals(previous)
        assert np.array_equal(c1, c_n[0]) and np.array_equal(h1, h_n[0])
        assert np.array_equal(c2, c_n[0]) and np.array_equal(h2, h_n[0])


def test_step_kernel_limits():
    assert not _step.fits_step_kernel(0, 3, 4) and not _step.fits_step_kernel(2, 0, 4)
    assert not _step.fits_step_kernel(2, 3, 0)
    assert not _step.fits_step_kernel(8, 40, 256)  # beyond one thread's work
    assert _step.step_shape(8, 40, 256, np.dtype(np.float32)).kernel_key is None
    x, h, c, params = _arrays(8, 40, 256, np.float32)
    plan = lstmcy.LSTMPlan()
    plan.step(x, (h, c), params)
    assert plan._step_kernels == {} and plan._step_kernel is None
    with pytest.raises(ValueError, match="at least 1"):
        lstmcy._engine.dispatch.kernels.StepForward(0, 1, 1, np.float32, False)
    with pytest.raises(ValueError, match="float32 or float64"):
        lstmcy._engine.dispatch.kernels.StepForward(1, 1, 1, np.float16, False)


def _run_threads(threads, deadline=60):
    """Start ``threads`` and wait for them, failing (not hanging) past ``deadline`` s."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline)
    assert not any(t.is_alive() for t in threads), "a stepping thread did not finish"


def test_step_kernel_objects_serve_threads_one_at_a_time():
    """Threads with their own plans step at once; results are each thread's own."""
    import threading
    x, h, c, params = _arrays(2, 8, 16, np.float32, seed=8)
    expected = lstmcy.LSTMPlan().step(x, (h, c), params)
    failures = []

    def work():
        plan = lstmcy.LSTMPlan()
        for _ in range(200):
            h1, c1 = plan.step(x, (h, c), params)
            if not (np.array_equal(h1, expected[0]) and np.array_equal(c1, expected[1])):
                failures.append("differs")
                return

    _run_threads([threading.Thread(target=work) for _ in range(4)])
    assert not failures


# Step backward kernel objects (StepBackward): the shapes take every choice of the
# backward's schedule for one step (dW by BLAS or in panels, dx by BLAS or packed), the
# largest fits fits_step_backward.
BACKWARD_SHAPES = [(1, 16, 32), (3, 5, 7), (1, 1, 1), (32, 16, 32), (1, 192, 64),
                   (1, 64, 128), (2, 200, 100)]


def _layer_call_backward(plan, shape, args, want_dx, want_dparams):
    """``_step.backward`` as the layer call (a traced plan takes no kernel object)."""
    plan.trace = []
    try:
        return _step.backward(plan, shape, *args, want_dx, want_dparams)
    finally:
        assert plan.trace, "the layer call ran"
        plan.trace = None


@pytest.mark.parametrize("B, I, H", BACKWARD_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_backward_kernel_is_bitwise_the_layer_call(B, I, H, dtype):
    from lstmcy._engine.schedule import packed_dx, panel_weights
    assert _step.fits_step_backward(B, I, H)
    x, h, c, params = _arrays(B, I, H, dtype, seed=9)
    plan = lstmcy.LSTMPlan()
    shape = _step.step_shape(B, I, H, np.dtype(dtype))
    _, _, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                params[2] + params[3], True)
    rng = np.random.default_rng(10)
    dh = rng.standard_normal((B, H)).astype(dtype)
    dc = rng.standard_normal((B, H)).astype(dtype)
    before = [a.copy() for a in (x, h, c, params[0], params[1], saved, dh, dc)]
    for want_dx in (False, True):
        for want_dparams in (False, True):
            kernel = _step.step_backward_kernel(
                plan, shape.backward_kernel_keys[want_dx, want_dparams])
            assert kernel.schedule.panel_weights == panel_weights(I, H)
            assert kernel.schedule.packed_dx == (want_dx and packed_dx(I, H))
            for grads in ((dh, dc), (None, dc), (dh, None), (None, None)):
                args = (x, h, c, params[0], params[1], saved) + grads
                ours = kernel.step(*args)
                assert ours is not None
                layer = _layer_call_backward(plan, shape, args, want_dx, want_dparams)
                for a, b in zip(ours, layer):
                    if b is None:
                        assert a is None
                        continue
                    # The same bytes: signed zeros too.
                    assert a.dtype == b.dtype and a.shape == b.shape
                    assert a.tobytes() == b.tobytes()
                    assert a.flags.c_contiguous and a.flags.writeable
                through = _step.backward(plan, shape, *args, want_dx, want_dparams)
                for a, b in zip(ours, through):  # _step.backward takes the kernel object
                    assert (a is None and b is None) or a.tobytes() == b.tobytes()
                second = kernel.step(*args)
                for a, b in zip(ours, second):  # new arrays on every call
                    assert a is None or not np.shares_memory(a, b)
    for a, b in zip(before, (x, h, c, params[0], params[1], saved, dh, dc)):
        assert np.array_equal(a, b)  # inputs untouched


def test_step_backward_kernel_falls_back_for_other_layouts():
    """Arrays the kernel object does not take (other dtypes, shapes, types, Fortran order,
    strided, unaligned) give None, for its caller to run the layer call; read-only ones
    are taken."""
    B, I, H = 3, 4, 5
    x, h, c, params = _arrays(B, I, H, np.float32, seed=11)
    plan = lstmcy.LSTMPlan()
    shape = _step.step_shape(B, I, H, np.dtype(np.float32))
    _, _, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                params[2] + params[3], True)
    dh = np.ones((B, H), np.float32)
    kernel = _step.step_backward_kernel(plan, shape.backward_kernel_keys[True, True])
    arrays = [x, h, c, params[0], params[1], saved, dh, dh.copy()]
    expected = kernel.step(*arrays)
    for k in range(len(arrays)):
        for spelled in _spellings(arrays[k]):
            args = list(arrays)
            args[k] = spelled
            out = kernel.step(*args)
            if (type(spelled) is np.ndarray and spelled.flags.c_contiguous
                    and spelled.flags.aligned):  # read-only: taken
                assert all(np.array_equal(a, b) for a, b in zip(out, expected))
            else:
                assert out is None
        for wrong in (arrays[k].astype(np.float64), arrays[k][..., :-1], None, [1.0]):
            args = list(arrays)
            args[k] = wrong
            if wrong is None and k >= 6:
                continue  # dh, dc None: zeros
            assert kernel.step(*args) is None


def test_step_backward_kernel_limits():
    assert not _step.fits_step_backward(0, 3, 4) and not _step.fits_step_backward(2, 0, 4)
    assert not _step.fits_step_backward(2, 3, 0)
    assert _step.fits_step_backward(32, 16, 32)
    assert not _step.fits_step_backward(64, 16, 32)  # beyond one thread's work
    from lstmcy._engine.schedule import SINGLE_THREADED_GEMM
    for B, I, H in [(B, I, H) for B in (1, 8, 64) for I in (1, 64, 512) for H in (1, 32, 256)]:
        if _step.fits_step_backward(B, I, H):
            assert _step.fits_step_kernel(B, I, H)  # a step's forward fits too
            assert 4 * B * H * (I + H) <= SINGLE_THREADED_GEMM  # BLAS on one thread
    shape = _step.step_shape(64, 16, 32, np.dtype(np.float32))
    assert shape.kernel_key is not None and shape.backward_kernel_keys is None
    x, h, c, params = _arrays(64, 16, 32, np.float32)
    plan = lstmcy.LSTMPlan()
    _, _, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                params[2] + params[3], True)
    _step.backward(plan, shape, x, h, c, params[0], params[1], saved, h, c, True, True)
    assert not any(len(key) == 6 for key in plan._step_kernels)
    StepBackward = lstmcy._engine.dispatch.kernels.StepBackward
    kernel = _step.step_backward_kernel(plan, (1, 2, 3, np.dtype(np.float32), True, True))
    for sizes in [(2, 1, 2, 1, 2, 3, 3), (1, 1, 1, 2, 2, 3, 3), (1, 1, 1, 1, 2, 3, 2),
                  (1, 0, 0, 1, 2, 3, 3)]:
        with pytest.raises(ValueError, match="one step of one direction"):
            StepBackward(sizes, True, True, True, kernel.schedule, kernel.workspace, 1)
    with pytest.raises(ValueError, match="one step of one direction"):
        StepBackward((1, 1, 1, 1, 2, 3, 3), True, True, True, kernel.schedule,
                     kernel.workspace, 2)


def test_step_backward_kernel_objects_serve_threads():
    """Threads stepping backward at once, each on its own plan's objects and all on one
    shared object (the torch cell's kernels are shared: the GIL serialises their calls),
    get the single-threaded results."""
    import threading
    B, I, H = 2, 8, 16
    x, h, c, params = _arrays(B, I, H, np.float32, seed=12)
    shape = _step.step_shape(B, I, H, np.dtype(np.float32))
    plan = lstmcy.LSTMPlan()
    _, _, saved = _step.forward(plan, shape, x, h, c, params[0], params[1],
                                params[2] + params[3], True)
    args = (x, h, c, params[0], params[1], saved, h, c)
    shared = _step.step_backward_kernel(plan, shape.backward_kernel_keys[True, True])
    expected = shared.step(*args)
    failures = []

    def work(own):
        kernel = shared
        if own:
            kernel = _step.step_backward_kernel(lstmcy.LSTMPlan(),
                                                shape.backward_kernel_keys[True, True])
        for _ in range(200):
            out = kernel.step(*args)
            if not all(np.array_equal(a, b) for a, b in zip(out, expected)):
                failures.append("differs")
                return

    _run_threads([threading.Thread(target=work, args=(k % 2 == 0,)) for k in range(4)])
    assert not failures


@pytest.mark.parametrize("B, I, H", KERNEL_SHAPES[:4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("has_bias", [True, False])
def test_one_step_inference_call_is_the_full_path(B, I, H, dtype, batch_first, has_bias):
    """``lstm_forward`` / ``LSTMPlan.forward`` of one inference step (on the step kernel
    object) give the bits of the same call on the full path (a ``config`` takes it)."""
    x, h, c, params = _arrays(B, I, H, dtype, seed=9)
    params = params if has_bias else params[:2]
    x3 = x[:, None] if batch_first else x[None]
    cfg = lstmcy.LSTMConfig(batch_first=batch_first, has_bias=has_bias, train=False)
    plan = lstmcy.LSTMPlan()
    for hx in ((h[None], c[None]), None):
        expected = lstmcy.LSTMPlan().forward(x3, hx, params, config=cfg)
        for run in (lambda: lstmcy.lstm_forward(x3, hx, params, has_bias=has_bias, train=False,
                                                batch_first=batch_first),
                    lambda: plan.forward(x3, hx, params, has_bias=has_bias, train=False,
                                         batch_first=batch_first)):
            y, h_n, c_n, cache = run()
            assert cache is None and expected[3] is None
            for ours, full in zip((y, h_n, c_n), expected[:3]):
                assert ours.shape == full.shape and ours.dtype == full.dtype
                assert np.array_equal(ours, full)
            assert not np.shares_memory(y, h_n)
    assert (B, I, H, np.dtype(dtype)) in plan._step_kernels


@pytest.mark.parametrize("case", ["num_layers bool", "num_layers float", "dropout",
                                  "dropout range", "proj_size", "bidirectional int",
                                  "state rank", "state count", "has_bias int"])
def test_one_step_inference_errors_are_the_full_paths(case):
    x, h, c, params = _arrays(2, 3, 4, np.float32)
    kwargs = dict(train=False)
    hx = (h[None], c[None])
    if case == "num_layers bool":
        kwargs["num_layers"] = True
    elif case == "num_layers float":
        kwargs["num_layers"] = 1.0
    elif case == "dropout":
        kwargs["dropout"] = 0.5  # valid: inference applies no dropout
    elif case == "dropout range":
        kwargs["dropout"] = 1.5
    elif case == "proj_size":
        kwargs["proj_size"] = 5
    elif case == "bidirectional int":
        kwargs["bidirectional"] = 0
    elif case == "state rank":
        hx = (h, c)
    elif case == "state count":
        hx = (h[None],)
    elif case == "has_bias int":
        kwargs["has_bias"] = 1
    lstmcy.lstm_forward(x[None], (h[None], c[None]), params, train=False)  # warm the kernel
    cfg_kwargs = {k: v for k, v in kwargs.items()}

    def full():
        # A seed takes the full path (and changes nothing in inference).
        return lstmcy.LSTMPlan().forward(x[None], hx, params, seed=0, **cfg_kwargs)

    try:
        expected = full()
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        assert _error(lambda: lstmcy.lstm_forward(x[None], hx, params, **kwargs)) == \
            (type(exc), str(exc))
    else:
        got = lstmcy.lstm_forward(x[None], hx, params, **kwargs)
        for a, b in zip(got[:3], expected[:3]):
            assert np.array_equal(a, b)
