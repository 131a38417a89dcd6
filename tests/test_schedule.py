"""Schedules: any schedule gives the reference's results, and the same bits on any number
of threads.

A kernel call's schedule (``lstmcy._engine.schedule``) has two kinds of fields. The projection
pieces (forward) and the chunks, dW blocks and dx pieces (backward) are functions of the
shape only: they fix the bits. The recurrence's split between threads (row groups, or unit
parts) and the packing pieces depend on the thread count and must not change a bit. The shapes of the benchmark reach few schedules, so here they are forced,
corner cases included (one step per chunk, a first chunk covering the whole sequence, a
dx piece per step, a block per 16 gate rows, a group per row, more groups than rows).
"""
import functools
import platform
import sys

import numpy as np
import pytest

from lstmcy._engine import schedule as _schedule
from lstmcy import reference
from hostile import Config, force_schedules, make_call, run_with_threads

CONFIGS = {
    "f64-packed": Config(T=24, B=12, I=64, H=40, layout="packed", dtype=np.dtype(np.float64),
                         lengths_seed=7),
    "f32-time-major": Config(T=17, B=16, I=48, H=64, dtype=np.dtype(np.float32)),
    "f64-batch-first-2-layers": Config(T=13, B=20, I=30, H=48, L=2, layout="batch_first",
                                       dtype=np.dtype(np.float64), dropout=0.25),
    "f64-bidirectional-padded": Config(T=15, B=14, I=40, H=40, bidirectional=True,
                                       layout="padded_3d", dtype=np.dtype(np.float64),
                                       lengths_seed=2),
}
# (first, chunk, block_rows, lanes, dx_steps, packed_dx): the policy never has first >
# chunk, but the kernels take any positive values (a block of 1000 rows is the whole of dW;
# more lanes than chunks leave some lanes empty).
BACKWARD = [(1, 1, 16, 1, 1, False), (1, 3, 64, 2, 2, True), (2, 5, 32, 3, 1, False),
            (3, 3, 1000, 4, 3, True), (1000, 1000, 16, 2, 1, True), (4, 4, 48, 1, 100, False),
            (2, 7, 64, 5, 2, True), (6, 1, 16, 7, 5, True), (5, 2, 80, 2, 1, False),
            (1, 1, 1000, 30, 1, False)]
# (split, piece_steps, fused_input, packed_projection) of the forward; the backward's
# recurrence is split the same way
FORWARD = [(_schedule.SPLIT_ROWS, 1, False, False), (_schedule.SPLIT_ROWS, 5, True, False),
           (_schedule.SPLIT_UNITS, 2, True, False), (_schedule.SPLIT_UNITS, 1000, False, False),
           (_schedule.SPLIT_ROWS, 3, False, True), (_schedule.SPLIT_UNITS, 4, False, True)]
THREADS = (1, 2, 3, 4, 8)


def schedules(backward, forward):
    """Schedule functions with the bit-fixing fields forced; the split between threads
    (``forward``'s, for both) still follows the thread count (a group or part per thread,
    down to one row or to empty parts)."""
    first, chunk, block_rows, lanes, dx_steps, packed_dx = backward
    split, piece_steps, fused_input, packed_projection = forward

    def split_of(B, D, n_threads, projected):
        per_direction = max(1, n_threads // D)
        use = _schedule.SPLIT_ROWS if projected else split
        groups = per_direction if use == _schedule.SPLIT_UNITS else min(per_direction, B)
        return use, max(1, groups)

    def fwd(T, B, I, H, D, n_threads, projected=False, itemsize=4):
        return _schedule.ForwardSchedule(*split_of(B, D, n_threads, projected), piece_steps,
                                         n_threads, fused_input, packed_projection)

    def bwd(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
        return _schedule.BackwardSchedule(*split_of(B, D, n_threads, projected), first, chunk,
                                          block_rows, lanes, dx_steps, n_threads,
                                          packed_dx=packed_dx)

    return fwd, bwd


@pytest.fixture(scope="module")
def calls():
    return {name: make_call(cfg, np.random.default_rng(5), seed=1) for name, cfg in CONFIGS.items()}


def check_against_reference(call, outputs):
    cfg = call.cfg
    y, h_n, c_n, _ = reference.lstm_forward(*call.fwd_args, **call.fwd_kwargs)
    dx, dh, dc, dparams = reference.lstm_backward(*call.bwd_args, **call.bwd_kwargs)
    rtol = 1e-10 if cfg.dtype == np.float64 else 2e-4
    for k, (got, want) in enumerate(zip(outputs, [y, h_n, c_n, dx, dh, dc, *dparams])):
        scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale, err_msg=f"output {k}")


def check_thread_counts(call, counts):
    """The call's outputs on each of ``counts`` threads are bitwise those on one thread,
    which match the reference."""
    one, _ = run_with_threads(call, 1)
    for threads in counts:
        other, _ = run_with_threads(call, threads)
        for k, (a, b) in enumerate(zip(one, other)):
            assert a.tobytes() == b.tobytes(), f"output {k}: 1 and {threads} threads differ"
    check_against_reference(call, one)


FORWARD_IDS = [f"{'units' if s else 'rows'}-piece{p}{'-fused' if f else ''}"
               f"{'-packed-projection' if q else ''}" for s, p, f, q in FORWARD]


@pytest.mark.parametrize("forward", FORWARD, ids=FORWARD_IDS)
@pytest.mark.parametrize("backward", BACKWARD,
                         ids=[f"first{f}-chunk{c}-block{b}-lanes{n}-dx{d}{'-packed' if p else ''}"
                              for f, c, b, n, d, p in BACKWARD])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_schedule_matches_reference_and_is_thread_independent(name, backward, forward, calls,
                                                              monkeypatch, request):
    force_schedules(request, *schedules(backward, forward))
    check_thread_counts(calls[name], THREADS[1:])


def test_bit_fixing_fields_are_a_function_of_the_shape():
    for shape in [(1, 1, 1, 1, 1), (50, 64, 256, 256, 1), (100, 64, 125, 320, 1),
                  (32, 16, 32, 64, 2), (7, 3, 5, 160, 2), (1000, 1, 1, 8, 1), (0, 4, 2, 8, 1)]:
        for itemsize in (4, 8):
            forward = {n: _schedule.forward_schedule(*shape, n, itemsize=itemsize)
                       for n in (1, 2, 3, 8, 64)}
            assert len({(s.piece_steps, s.fused_input, s.packed_projection)
                        for s in forward.values()}) == 1
        for small_gemms in (False, True):
            backward = {n: _schedule.backward_schedule(*shape, n, small_gemms=small_gemms)
                        for n in (1, 2, 3, 8, 64)}
            assert len({(s.first, s.chunk, s.block_rows, s.lanes, s.dx_steps, s.panel_weights,
                         s.packed_dx) for s in backward.values()}) == 1
            assert backward[1].lanes == _schedule.backward_lanes(*shape[:4], small_gemms)
        for n, s in backward.items():
            assert 1 <= s.first <= s.chunk and s.block_rows >= 16 and s.dx_steps >= 1
            assert 1 <= s.lanes <= _schedule.MAX_LANES
            assert 1 <= s.groups <= max(1, n)
        for n, s in forward.items():
            assert 1 <= s.groups <= max(1, n) and s.pack_pieces >= 1


SMALL_SHAPES = [(20, 1, 16, 32), (32, 16, 32, 64), (50, 8, 64, 64), (50, 32, 64, 128),
                (3, 2, 1, 8), (1000, 1, 1, 8)]
LARGE_SHAPES = [(50, 64, 256, 256), (100, 64, 125, 320), (25, 32, 512, 512), (35, 20, 650, 650)]


@pytest.mark.parametrize("shape", SMALL_SHAPES + LARGE_SHAPES)
def test_small_gemm_cuts_keep_every_product_within_the_small_path(shape):
    T, B, I, H = shape
    big = _schedule.backward_schedule(T, B, I, H, 1, 2)
    small = _schedule.backward_schedule(T, B, I, H, 1, 2, small_gemms=True)
    dw_gemm = small.block_rows * (I + H) * small.chunk * B  # a block over a whole chunk
    if small.block_rows < _schedule.MIN_BLOCK_ROWS and small.block_rows < 4 * H:
        # Small cuts: every dW product fits, in as few blocks as fit.
        assert dw_gemm <= _schedule.SMALL_GEMM
        assert small.block_rows >= _schedule.MIN_SMALL_BLOCK_ROWS
    dx_gemm = min(small.dx_steps, T) * B * I * 4 * H
    if B * I * 4 * H <= _schedule.SMALL_GEMM:  # a step's rows fit: so do a piece's
        assert dx_gemm <= _schedule.SMALL_GEMM
    if shape in LARGE_SHAPES:  # products far beyond the small path: cut as without it
        assert small == big
    assert small.split == big.split and small.groups == big.groups


def test_small_gemm_cuts_on_the_small_shapes():
    # (T, B, I, H) = (32, 16, 32, 64): chunks of 64 rows, dW in two blocks of 128 gate rows
    # (128 * 96 * 64 <= 1e6), dx in pieces of 7 steps (112 rows * 32 * 256 <= 1e6); without
    # the small path one block of 256 rows and pieces of 256 rows.
    small = _schedule.backward_schedule(32, 16, 32, 64, 1, 2, small_gemms=True)
    big = _schedule.backward_schedule(32, 16, 32, 64, 1, 2)
    assert (small.chunk, small.block_rows, small.dx_steps) == (4, 128, 7)
    assert (big.chunk, big.block_rows, big.dx_steps) == (4, 256, 16)
    # (50, 32, 64, 128): chunks of 2 steps (64 rows) instead of T/8 = 7, blocks of 80 rows.
    small = _schedule.backward_schedule(50, 32, 64, 128, 1, 2, small_gemms=True)
    assert (small.chunk, small.block_rows) == (2, 80)


class _Controller:
    def __init__(self, internal_api, architecture):
        self.filepath = "libblas.so"
        self.internal_api = internal_api
        self.architecture = architecture
        self.threading_layer = "openmp"  # keeps _ThreadSetting on the controller's methods
        self.get_num_threads = lambda: 1
        self.set_num_threads = lambda n: None


@pytest.mark.parametrize("api, architecture, small", [
    ("openblas", "SkylakeX", True), ("openblas", "Cooperlake", True),
    ("openblas", "SapphireRapids", True), ("openblas", "Haswell", False),
    ("openblas", "Zen", False), ("openblas", None, False), ("mkl", "SkylakeX", False)])
def test_which_blas_has_the_small_path(api, architecture, small):
    from lstmcy._engine import threads as _threads
    setting = _threads._ThreadSetting(_Controller(api, architecture))
    assert setting.small_gemms is small
    assert _threads.all_have_small_gemms([setting]) is small
    other = _threads._ThreadSetting(_Controller("openblas", "SkylakeX"))
    assert _threads.all_have_small_gemms([other, setting]) is small
    assert _threads.all_have_small_gemms([]) is False


@pytest.mark.parametrize("small_gemms", [False, True])
@pytest.mark.parametrize("name", ["f32-time-major", "f64-packed", "f64-batch-first-2-layers"])
def test_either_blas_rule_matches_the_reference_on_any_thread_count(name, small_gemms, calls,
                                                                   monkeypatch, request):
    # lstmcy's own schedules under either answer about the BLAS: the same bits on 1, 2, 3
    # and 8 threads, and the reference's values.
    def backward(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
        return _schedule.backward_schedule(T, B, I, H, D, n_threads, projected,
                                           small_gemms=answer)

    answer = small_gemms
    force_schedules(request, backward=backward)
    check_thread_counts(calls[name], (2, 3, 8))


@pytest.mark.parametrize("threads", [1, 3])
def test_no_steps_gives_zero_weight_gradients(threads, monkeypatch):
    # T == 0 has no chunks, so no weight-gradient task runs: the weight gradients are
    # zeros, not whatever an earlier call left in the result buffers.
    warm = make_call(Config(T=3, B=22, I=5, H=33), np.random.default_rng(0), seed=0)
    run_with_threads(warm, threads)
    empty = make_call(Config(T=0, B=22, I=5, H=33), np.random.default_rng(1), seed=0)
    grads, _ = run_with_threads(empty, threads)
    for g in grads[6:]:  # dw_ih, dw_hh, db_ih, db_hh
        assert not np.any(g), "weight gradients of an empty sequence must be zero"


BAD = [("backward", dict(first=0)), ("backward", dict(chunk=0)), ("backward", dict(block_rows=0)),
       ("backward", dict(lanes=0)),
       ("backward", dict(dx_steps=0)), ("backward", dict(groups=0)), ("backward", dict(pack_pieces=0)),
       ("backward", dict(split=7)),
       ("forward", dict(piece_steps=0)), ("forward", dict(groups=0)), ("forward", dict(pack_pieces=0)),
       ("forward", dict(split=7)), ("forward", dict(fused_input=True, packed_projection=True))]


@pytest.mark.parametrize("kind, bad", BAD, ids=[f"{k}-{next(iter(b))}" for k, b in BAD])
def test_kernels_refuse_a_bad_schedule(kind, bad, calls, monkeypatch, request):
    own = getattr(_schedule, f"{kind}_schedule")
    def schedule(*shape, **machine):
        return own(*shape, **machine)._replace(**bad)

    force_schedules(request, **{kind: schedule})
    with pytest.raises(ValueError, match="bad schedule"):
        run_with_threads(calls["f32-time-major"], 1)


# Many short chains (a lane per block of 16 gate rows, a step per chunk) on more threads
# than cores: threads keep taking a chain just as its holder lets it go, after its last
# chunk too. Run in a child so that a crash or a hang fails the test.
CHAIN_HANDOVER = """
import sys
import numpy as np
from lstmcy._engine import plan as _core
from lstmcy._engine import schedule as _schedule
from hostile import Config, make_call, run_with_threads

def backward(T, B, I, H, D, n_threads, projected=False, small_gemms=False):
    return _schedule.BackwardSchedule(_schedule.SPLIT_ROWS, max(1, min(n_threads // D, B)), 1, 1,
                                      16, 4, 1, n_threads)

# The schedule of 8 threads, not of the 2 CPUs.
_core.use_thread_plan(_core.LSTMPlan(schedules=_schedule.SchedulePolicy(
    backward=backward, cap_at_cpus=False)))
call = make_call(Config(T=12, B=8, I=16, H=16, bidirectional=True, dtype=np.dtype(np.float64)),
                 np.random.default_rng(3), seed=0)
want = [a.tobytes() for a in run_with_threads(call, 1)[0]]
for _ in range(300):
    got = [a.tobytes() for a in run_with_threads(call, 8)[0]]
    assert got == want, "8 threads differ from 1"
print("ok")
"""


def test_chains_handed_over_between_threads_stay_in_bounds():
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHAIN_HANDOVER], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_the_split_rule(which):
    # One rule for both recurrences: units where there would be one row group, or where
    # w_hh is large and the groups thin; never with a projection; rows otherwise.
    schedule = getattr(_schedule, f"{which}_schedule")
    units, rows = _schedule.SPLIT_UNITS, _schedule.SPLIT_ROWS
    assert schedule(25, 32, 512, 512, 1, 8)[:2] == (units, 8)       # 8 groups of 4 rows
    assert schedule(25, 32, 512, 512, 1, 8, True).split == rows      # projected
    assert schedule(25, 64, 512, 512, 1, 2).split == rows            # groups of 32 rows
    assert schedule(25, 64, 512, 512, 2, 8)[:2] == (units, 4)        # 4 threads a direction
    assert schedule(50, 64, 256, 256, 1, 8)[:2] == (rows, 8)         # thin, w_hh small
    assert schedule(50, 4, 64, 512, 1, 8)[:2] == (units, 8)          # one group of 4 rows
    assert schedule(50, 4, 64, 512, 1, 1).split == rows              # one thread
    assert schedule(50, 3, 64, 256, 1, 8).split == rows              # parts too small


@pytest.mark.parametrize("name", ["f32-time-major", "f64-bidirectional-padded", "f64-packed"])
def test_threads_without_a_unit_part_give_the_same_bits(name, calls, monkeypatch, request):
    # Two unit parts per direction on up to 8 threads: the threads with no part of their
    # own leave the recurrence to the others (and take the backward's gradients).
    def two_parts(schedule_of):
        def schedule(T, B, I, H, D, n_threads, projected=False, **machine):
            own = schedule_of(T, B, I, H, D, n_threads, projected, **machine)
            return own._replace(split=_schedule.SPLIT_UNITS, groups=2, pack_pieces=1)
        return schedule

    force_schedules(request, two_parts(_schedule.forward_schedule),
                    two_parts(_schedule.backward_schedule))
    check_thread_counts(calls[name], (3, 5, 8))


def test_the_packed_dx_rule():
    # lstmcy's product for dx where w_ih and the layer are wide enough; a function of the
    # shape.
    rule = _schedule.packed_dx
    assert rule(125, 320) and rule(64, 128) and rule(512, 512) and rule(650, 650)
    assert not rule(32, 320) and not rule(64, 64) and not rule(125, 0)
    for n_threads in (1, 2, 8):
        assert _schedule.backward_schedule(100, 64, 125, 320, 1, n_threads).packed_dx
        assert not _schedule.backward_schedule(50, 8, 64, 64, 1, n_threads).packed_dx


def test_the_weights_rows_in_place_rule():
    # A fact of the core, not of a call: the AVX-512 build on AMD's family 0x19 (Zen 4)
    # reads the gate gradients in place; other cores and builds copy them (the same bits,
    # tests/test_kernels.py), and so does a CPU the operating system does not name.
    rule = _schedule.weights_rows_in_place
    assert rule("avx512", "AuthenticAMD", 0x19)
    assert not rule("avx2", "AuthenticAMD", 0x19) and not rule("baseline", "AuthenticAMD", 0x19)
    assert not rule("avx512", "GenuineIntel", 6) and not rule("avx512", "AuthenticAMD", 0x1A)
    assert not rule("avx512", None, None)


def test_the_cpu_is_named_where_the_os_says():
    from lstmcy._engine.dispatch import cpu_vendor_family
    vendor, family = cpu_vendor_family()
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        assert isinstance(vendor, str) and vendor and isinstance(family, int) and family > 0
    else:
        assert vendor is None or isinstance(vendor, str)
        assert family is None or isinstance(family, int)


def test_the_packed_projection_rule():
    # The forward's projection pieces from w_ih^T packed once where the layer is wide
    # enough, x's product is not fused and there is more than one piece; a function of
    # the shape.
    rule = _schedule.packed_projection
    assert rule(64, 128) and rule(512, 512) and rule(650, 650)
    assert not rule(63, 512) and not rule(512, 127) and not rule(32, 128)
    assert not rule(512, 512, itemsize=8)
    for n_threads in (1, 2, 8):
        fs = functools.partial(_schedule.forward_schedule, n_threads=n_threads)
        for T, B, I, H, D in [(25, 32, 512, 512, 1), (35, 20, 650, 650, 2),
                              (90, 3, 64, 128, 2)]:
            assert fs(T, B, I, H, D).packed_projection and not fs(T, B, I, H, D).fused_input
            assert not fs(T, B, I, H, D, itemsize=8).packed_projection
        assert not fs(8, 32, 512, 512, 1).packed_projection      # one piece of 8 steps
        assert not fs(1, 300, 512, 512, 1).packed_projection     # one step
        assert not fs(50, 64, 64, 128, 1).packed_projection      # x's product fused
        assert not fs(100, 64, 32, 128, 1).packed_projection     # I < 64
