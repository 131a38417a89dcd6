"""Tests of the optional Ascend backend, lstmcy.aclnn, without an NPU.

A stand-in for the CANN libraries, tests/aclnn_stub/aclnn_stub.c, is compiled
here with the system C compiler. It exports the same symbols with the same C
signatures, keeps "device" memory on the host, records everything it receives
and computes its outputs by a documented formula:

    dxOut         = 2 * input + 1
    dhPrevOut     = hx[0] + 10 * dh
    dcPrevOut     = hx[1] + 10 * dc
    dparamsOut[j] = params[j] + 0.5 * (j + 1)

(computed in double, stored as float32, or float32 then float16). It also logs
two checksums of every input it reads, sum(x) and sum((k + 1) * x[k]), the
second of which changes under any permutation of the elements.

It also models the runtime behaviour lstmcy depends on (see the stub's
header): per-thread current devices with several devices, a device reset
that releases its context for every user, aclInit by another owner, the
operator's early return on empty tensors (workspace 0, outputs left as the
poison bytes of new device memory), the kernel path ($ASCEND_OPP_PATH) and
executors made repeatable only right after the first phase.

What these tests prove: the binding (symbols, argument order and types, enum
values), the marshalling in both directions (shapes, strides, dtypes,
formats, list order, scalars, workspace), the release of every handle and
device buffer (also after a failure at any point), the translation of status
codes into exceptions, library discovery through each search route, and
lstmcy's conduct towards the runtime: the device of every call, what it
resets, the kernel-path check, the executor lifecycle, and the host results
of empty problems.
What they do not prove: that the NPU computes the right gradient. That needs
real hardware; see test_real_npu_matches_cpu at the end (skipped unless
LSTMCY_TEST_REAL_NPU=1 on a machine with CANN and an NPU).
"""

import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import lstmcy.aclnn as aclnn
from lstmcy._engine.cache import SAVED_NAMES as GATES
from lstmcy._engine.validation import check_backward

STUB_SOURCE = Path(__file__).parent / "aclnn_stub" / "aclnn_stub.c"
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

ACL_FLOAT, ACL_FLOAT16, ACL_INT64 = 0, 1, 9
ACL_FORMAT_ND, ACL_FORMAT_NCL = 2, 47
ROUTE_ENV = ("LSTMCY_ACLNN_LIB", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
POISON = 0xAB  # the stand-in's fill byte for new device memory (STUB_POISON)


# ------------------------------------------------------------------ the stub


def _compile(source, target):
    if CC is None:
        pytest.skip("no C compiler (cc/gcc/clang) found to build the CANN stand-in library")
    result = subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(target), str(source)],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"compiling {source} failed:\n{result.stderr}"
    return target


@pytest.fixture(scope="session")
def stub_path(tmp_path_factory):
    directory = tmp_path_factory.mktemp("aclnn_stub")
    return _compile(STUB_SOURCE, directory / "libaclnn_stub.so")


class Stub:
    """The stand-in's test-only API (same loaded object as lstmcy.aclnn uses)."""

    def __init__(self, path):
        self.dll = ctypes.CDLL(str(path))
        self.dll.stub_counter.restype = ctypes.c_longlong
        self.dll.stub_counter.argtypes = [ctypes.c_char_p]
        self.dll.stub_counters.restype = ctypes.c_char_p
        self.dll.stub_get_log.restype = ctypes.c_char_p
        self.dll.stub_set_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_longlong]
        self.dll.stub_set_workspace_size.argtypes = [ctypes.c_ulonglong]
        self.dll.stub_set_device_count.argtypes = [ctypes.c_int]

    def reset(self):
        self.dll.stub_reset()

    def counter(self, name):
        return int(self.dll.stub_counter(name.encode()))

    def counters(self):
        text = self.dll.stub_counters().decode()
        return {k: int(v) for k, v in (line.split("=") for line in text.splitlines() if line)}

    def log(self):
        return json.loads(self.dll.stub_get_log().decode())

    def entries(self, call):
        return [e for e in self.log() if e["call"] == call]

    def fail(self, function, status, nth=0):
        self.dll.stub_set_fail(function.encode(), status, nth)

    def clear_fail(self):
        self.dll.stub_clear_fail()

    def set_workspace_size(self, nbytes):
        self.dll.stub_set_workspace_size(nbytes)

    def set_device_count(self, count):
        self.dll.stub_set_device_count(count)

    def current_device(self):
        """The calling thread's current device, or None (aclrtGetDevice)."""
        device = ctypes.c_int32(-1)
        status = self.dll.aclrtGetDevice(ctypes.byref(device))
        return device.value if status == 0 else None


def _quiet_finalize(lib=None):
    """Finalize ``lib`` (by default every library lstmcy initialised), ignoring errors."""
    try:
        aclnn.finalize(lib)
    except aclnn.AclnnError:
        pass


@pytest.fixture
def clean_env(monkeypatch):
    for name in ROUTE_ENV + (aclnn.ENV_DEVICE, aclnn.ENV_OPP_PATH, "LSTMCY_STUB_FAIL",
                             "LSTMCY_STUB_WORKSPACE", "LSTMCY_STUB_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(aclnn.ENV_ROOTS, "")  # no install prefixes of this machine
    return monkeypatch


@pytest.fixture
def opp_path(clean_env, tmp_path):
    """$ASCEND_OPP_PATH as set_env.sh sets it: where the aclnn engine finds its kernels."""
    folder = tmp_path / "opp"
    folder.mkdir()
    clean_env.setenv(aclnn.ENV_OPP_PATH, str(folder))
    return folder


@pytest.fixture
def stub(stub_path, clean_env, opp_path):
    """A freshly reset stand-in and the AclnnLibrary bound to it."""
    lib = aclnn.load_library(stub_path)
    handle = Stub(stub_path)
    _quiet_finalize(lib)   # keep lstmcy's view of aclInit/aclrtSetDevice in step with the reset
    handle.reset()
    yield handle, lib
    _quiet_finalize(lib)
    _quiet_finalize()      # also libraries a test loaded from other paths to the stand-in
    handle.reset()


def assert_released(stub):
    """Every created handle and device buffer was released exactly once."""
    c = stub.counters()
    get = lambda name: c.get(name, 0)  # noqa: E731
    assert get("tensors.created") == get("tensors.destroyed"), c
    assert get("lists.created") == get("lists.destroyed"), c
    assert get("boolarrays.created") == get("boolarrays.destroyed"), c
    assert get("mem.mallocs") == get("mem.frees"), c
    assert get("mem.live_bytes") == 0, c
    assert get("streams.created") == get("streams.destroyed"), c
    assert get("executors.created") == get("executors.released"), c
    errors = {k: v for k, v in c.items() if k.startswith("errors.") and v}
    assert not errors, f"misuse detected by the stub: {errors}"


# ------------------------------------------------------------------ cases


def make_case(seed=0, *, T=3, B=2, I=4, H=5, L=1, bidirectional=False, has_bias=True,
              dtype=np.float32, batch_first=False, batch_sizes=None, packed=False):
    """Random arguments for lstm_backward in every supported layout."""
    rng = np.random.default_rng(seed)
    D = 2 if bidirectional else 1

    def rand(*shape):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)

    if batch_sizes is not None:
        bs = np.asarray(batch_sizes, dtype=np.int64)
        T, B = len(bs), (int(bs[0]) if len(bs) else B)
        rows = int(bs.sum()) if packed else T * B
        x, dy = rand(rows, I), rand(rows, D * H)
    elif batch_first:
        bs = None
        x, dy = rand(B, T, I), rand(B, T, D * H)
    else:
        bs = None
        x, dy = rand(T, B, I), rand(T, B, D * H)
    params = []
    for layer in range(L):
        in_size = I if layer == 0 else D * H
        for _ in range(D):
            params += [rand(4 * H, in_size), rand(4 * H, H)]
            if has_bias:
                params += [rand(4 * H), rand(4 * H)]
    gates = {name: [rand(T, B, H) for _ in range(D * L)] for name in GATES}
    return dict(
        input=x, hx=(rand(D * L, B, H), rand(D * L, B, H)), params=params, dy=dy,
        dh=rand(D * L, B, H), dc=rand(D * L, B, H), **gates,
        batch_sizes=bs, has_bias=has_bias, num_layers=L, dropout=0.0, train=True,
        bidirectional=bidirectional, batch_first=batch_first, output_mask=(True, True, True, True),
    )


def call(case, lib, **overrides):
    kwargs = dict(case)
    kwargs.update(overrides)
    args = [kwargs.pop(k) for k in ("input", "hx", "params", "dy", "dh", "dc") + GATES]
    return aclnn.lstm_backward(*args, library=lib, **kwargs)


def device_call(case, lib):
    """A case straight to the device after lstmcy's argument checks, none of its guards in
    front of the device (empty problems, the kernel path): what the runtime does with it."""
    kwargs = dict(case)
    args = [kwargs.pop(k) for k in ("input", "hx", "params", "dy", "dh", "dc") + GATES]
    problem, arrays = check_backward(*args[:6], tuple(args[6:]), dropout_masks=None,
                                     **{k: kwargs[k] for k in (
                                         "batch_sizes", "has_bias", "num_layers", "dropout",
                                         "train", "bidirectional", "batch_first")})
    host, _ = aclnn.host_call(problem, arrays, *args[:3], dropout=kwargs["dropout"],
                              train=kwargs["train"])
    return aclnn.device_backward(lib, 0, host, tuple(kwargs["output_mask"]))


def checksums(array):
    v = np.asarray(array).astype(np.float64).ravel()
    return len(v), v.sum(), (np.arange(1, len(v) + 1) * v).sum()


def assert_checksum(logged, array):
    n, total, weighted = checksums(array)
    assert logged["n"] == n
    np.testing.assert_allclose(logged["sum"], total, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(logged["wsum"], weighted, rtol=1e-12, atol=1e-9)


def stub_formula(values, dtype):
    """float64 -> float32 (-> float16): the stub's own rounding path."""
    return np.asarray(values, dtype=np.float64).astype(np.float32).astype(dtype)


def padded_rows(packed, batch_sizes):
    """Packed rows (PackedSequence order) -> padded time-major [T*B, ...]; written as a loop."""
    T, B = len(batch_sizes), int(batch_sizes[0])
    out = np.zeros((T * B,) + packed.shape[1:], dtype=packed.dtype)
    k = 0
    for t, active in enumerate(batch_sizes):
        for b in range(int(active)):
            out[t * B + b] = packed[k]
            k += 1
    return out


def assert_tensor(desc, shape, dtype_code, fmt):
    assert desc["shape"] == list(shape)
    expected_strides = [int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape))]
    assert desc["strides"] == expected_strides          # C-contiguous, in elements
    assert desc["storage_shape"] == list(shape)
    assert desc["offset"] == 0
    assert desc["dtype"] == dtype_code
    assert desc["format"] == fmt
    assert desc["data"] != 0 and desc["data"] % 32 == 0  # device memory, 32-byte aligned


CONFIGS = {
    "L1-uni-bias-f32": dict(),
    "L2-bi-bias-f16-batch_first": dict(L=2, bidirectional=True, dtype=np.float16, batch_first=True),
    "L3-uni-nobias-f32": dict(L=3, has_bias=False, T=4, B=3, I=2, H=3),
    "L2-bi-nobias-f32": dict(L=2, bidirectional=True, has_bias=False),
    "packed-bi-f32": dict(bidirectional=True, batch_sizes=[3, 2, 2, 1], packed=True),
    "padded-uni-f16": dict(batch_sizes=[3, 3, 1], dtype=np.float16),
}


# ------------------------------------------------------------------ marshalling


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_marshalling_in_both_directions(stub, config):
    handle, lib = stub
    case = make_case(seed=1, **config)
    dtype = case["input"].dtype
    dcode = ACL_FLOAT16 if dtype == np.float16 else ACL_FLOAT
    dx, dh_prev, dc_prev, dparams = call(case, lib)

    # results: the stub's formula applied to what it received, read back in place
    np.testing.assert_array_equal(dx, stub_formula(2 * case["input"].astype(np.float64) + 1, dtype))
    h0, c0 = (a.astype(np.float64) for a in case["hx"])
    np.testing.assert_array_equal(dh_prev, stub_formula(h0 + 10 * case["dh"].astype(np.float64), dtype))
    np.testing.assert_array_equal(dc_prev, stub_formula(c0 + 10 * case["dc"].astype(np.float64), dtype))
    assert len(dparams) == len(case["params"])
    for j, (p, dp) in enumerate(zip(case["params"], dparams)):
        assert dp.shape == p.shape and dp.dtype == dtype
        np.testing.assert_array_equal(dp, stub_formula(p.astype(np.float64) + 0.5 * (j + 1), dtype))
    for out, ref in ((dx, case["input"]), (dh_prev, case["hx"][0]), (dc_prev, case["hx"][1])):
        assert out.shape == ref.shape and out.dtype == dtype

    # what the first phase received
    (plan,) = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    assert plan["scalars"] == dict(hasBias=case["has_bias"], numLayers=case["num_layers"], dropout=0.0,
                                   train=True, bidirectional=case["bidirectional"],
                                   batchFirst=case["batch_first"])
    assert plan["outputMask"] == [True, True, True, True]
    bs = case["batch_sizes"]
    x_dev, dy_dev = case["input"], case["dy"]
    if bs is not None and config.get("packed"):
        x_dev, dy_dev = padded_rows(x_dev, bs), padded_rows(dy_dev, bs)
    seq_fmt = ACL_FORMAT_ND if bs is not None else ACL_FORMAT_NCL
    t = plan["tensors"]
    assert_tensor(t["input"], x_dev.shape, dcode, seq_fmt)
    assert_tensor(t["dy"], dy_dev.shape, dcode, seq_fmt)
    assert_tensor(t["dxOut"], x_dev.shape, dcode, seq_fmt)
    for name, ref in (("dh", case["dh"]), ("dc", case["dc"]), ("dhPrevOut", case["hx"][0]),
                      ("dcPrevOut", case["hx"][1])):
        assert_tensor(t[name], ref.shape, dcode, ACL_FORMAT_NCL)
    if bs is None:
        assert t["batchSizes"] is None
    else:
        assert_tensor(t["batchSizes"], (len(bs),), ACL_INT64, ACL_FORMAT_ND)
    lists = plan["lists"]
    assert len(lists["hx"]) == 2
    for desc, ref in zip(lists["hx"], case["hx"]):
        assert_tensor(desc, ref.shape, dcode, ACL_FORMAT_NCL)
    for name in ("params", "dparamsOut"):
        assert len(lists[name]) == len(case["params"])
        for desc, ref in zip(lists[name], case["params"]):
            assert_tensor(desc, ref.shape, dcode, ACL_FORMAT_ND)
    for name in GATES:
        assert len(lists[name]) == len(case[name])
        for desc, ref in zip(lists[name], case[name]):
            assert_tensor(desc, ref.shape, dcode, ACL_FORMAT_NCL)

    # what the kernel read: every input's data, element order and list order
    (run,) = handle.entries("aclnnLstmBackward")
    sums = run["checksums"]
    assert_checksum(sums["input"], x_dev)
    assert_checksum(sums["dy"], dy_dev)
    assert_checksum(sums["dh"], case["dh"])
    assert_checksum(sums["dc"], case["dc"])
    for logged, ref in zip(sums["hx"], case["hx"]):
        assert_checksum(logged, ref)
    for logged, ref in zip(sums["params"], case["params"]):
        assert_checksum(logged, ref)
    for name in GATES:
        for logged, ref in zip(sums[name], case[name]):
            assert_checksum(logged, ref)
    if bs is None:
        assert sums["batchSizes"] is None
    else:
        assert_checksum(sums["batchSizes"], bs)
    assert run["executor"] == plan["executor"]
    assert_released(handle)


def test_packed_dx_is_packed_again(stub):
    handle, lib = stub
    case = make_case(seed=2, batch_sizes=[4, 2, 1], packed=True, I=3)
    dx, *_ = call(case, lib)
    assert dx.shape == case["input"].shape == (7, 3)
    np.testing.assert_array_equal(dx, stub_formula(2 * case["input"].astype(np.float64) + 1, np.float32))
    (plan,) = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    assert plan["tensors"]["input"]["shape"] == [3 * 4, 3]


def test_strided_and_fortran_inputs_are_copied_not_modified(stub):
    handle, lib = stub
    case = make_case(seed=3, L=2, bidirectional=True)
    reference = call(case, lib)
    strided = dict(case)
    big = np.zeros((case["input"].shape[0], case["input"].shape[1], 2 * case["input"].shape[2]), np.float32)
    big[:, :, ::2] = case["input"]
    strided["input"] = big[:, :, ::2]                       # non-contiguous view
    strided["params"] = [np.asfortranarray(p) for p in case["params"]]
    strided["hx"] = tuple(np.asfortranarray(a) for a in case["hx"])
    before = [a.copy() for a in (big, *strided["params"], *strided["hx"])]
    result = call(strided, lib)
    for got, want in zip(result[:3], reference[:3]):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(result[3], reference[3]):
        np.testing.assert_array_equal(got, want)
    for a, b in zip((big, *strided["params"], *strided["hx"]), before):
        np.testing.assert_array_equal(a, b)                 # inputs untouched
    for entry in handle.entries("aclnnLstmBackwardGetWorkspaceSize"):
        assert entry["tensors"]["input"]["strides"] == [8, 4, 1]
    assert_released(handle)


def test_output_mask_is_passed_and_masked_results_are_none(stub):
    handle, lib = stub
    case = make_case(seed=4)
    dx, dh_prev, dc_prev, dparams = call(case, lib, output_mask=(False, True, False, True))
    assert dx is None and dc_prev is None
    assert dh_prev is not None and len(dparams) == len(case["params"])
    (plan,) = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    assert plan["outputMask"] == [False, True, False, True]
    assert handle.counter("memcpy.d2h") == 1 + len(case["params"])  # only what was asked for
    assert_released(handle)


EMPTY_SIZES = {"I=0": dict(I=0), "B=0": dict(B=0), "T=0": dict(T=0), "H=0": dict(H=0),
               "T=B=0": dict(T=0, B=0), "I=H=0": dict(I=0, H=0)}
EMPTY_LAYOUTS = {
    "L1-uni-f32": dict(),
    "L2-bi-f16-batch_first": dict(L=2, bidirectional=True, dtype=np.float16, batch_first=True),
    "L3-uni-nobias-f32": dict(L=3, has_bias=False),
    "padded-bi-f32": dict(bidirectional=True, batch_sizes=[2, 2, 1]),
    "packed-uni-f16": dict(dtype=np.float16, batch_sizes=[2, 1, 1], packed=True),
}


def _empty_cases():
    for size_id, sizes in EMPTY_SIZES.items():
        for layout_id, layout in EMPTY_LAYOUTS.items():
            if "batch_sizes" in layout and ("B" in sizes or "T" in sizes):
                continue  # T and B come from batch_sizes there: see below
            yield pytest.param({**layout, **sizes}, id=f"{size_id}-{layout_id}")
    for layout_id in ("padded-bi-f32", "packed-uni-f16"):
        layout = dict(EMPTY_LAYOUTS[layout_id], batch_sizes=[])
        yield pytest.param(layout, id=f"T=0-{layout_id}")


def _cpu_backward(case, **overrides):
    import lstmcy

    args, kwargs = _public_args({**case, **overrides})
    return lstmcy.lstm_backward(*args, **kwargs)


@pytest.mark.parametrize("config", _empty_cases())
@pytest.mark.parametrize("output_mask", [(True,) * 4, (False, True, False, True)], ids=["all", "masked"])
def test_empty_problems_give_the_cpu_results(stub, config, output_mask):
    """T, B, I or H = 0: the operator would write no output; lstmcy gives the CPU path's results."""
    handle, lib = stub
    case = make_case(seed=21, **config)
    got = call(case, lib, output_mask=output_mask)
    want = _cpu_backward(case, output_mask=output_mask)
    for name, g, w in zip(("dx", "dh_prev", "dc_prev"), got[:3], want[:3]):
        if w is None:
            assert g is None, name
        else:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
    if want[3] is None:
        assert got[3] is None
    else:
        assert len(got[3]) == len(want[3])
        for k, (g, w) in enumerate(zip(got[3], want[3])):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=f"dparams[{k}]")
    assert handle.counter("mem.mallocs") == 0          # nothing for the device to do
    assert handle.counter("calls.aclnnLstmBackwardGetWorkspaceSize") == 0
    assert_released(handle)


@pytest.mark.parametrize("sizes", [dict(I=0), dict(B=0), dict(T=0), dict(H=0)],
                         ids=["I=0", "B=0", "T=0", "H=0"])
def test_the_operator_writes_no_output_of_an_empty_problem(stub, sizes):
    """Why the host computes them: the operator's early return, as the stand-in models it."""
    handle, lib = stub
    case = make_case(seed=21, **sizes)
    dx, dh_prev, dc_prev, dparams = device_call(case, lib)   # lstmcy's guards bypassed
    (plan,) = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    (run,) = handle.entries("aclnnLstmBackward")
    assert plan["empty"] is True and plan["workspace_size"] == 0
    assert run["empty"] is True and run["workspace"] == 0
    assert handle.counter("kernel.runs") == 0
    for out in (dx, dh_prev, dc_prev, *dparams):
        assert (out.view(np.uint8) == POISON).all()      # device memory as aclrtMalloc left it
    assert sum(out.size for out in (dx, dh_prev, dc_prev, *dparams)) > 0
    # aclrtMalloc refuses size 0: empty tensors still get a small, aligned device buffer
    assert handle.counter("tensors.null_data") == 0
    assert_released(handle)


def test_each_thread_binds_the_device(stub):
    handle, lib = stub
    case = make_case(seed=22)
    call(case, lib)
    results = []
    worker = threading.Thread(target=lambda: results.append(call(case, lib)))
    worker.start()
    worker.join()
    assert len(results) == 1
    assert handle.counter("device.sets") == 2        # aclrtSetDevice binds the calling thread
    assert handle.counter("acl.inits") == 1
    assert_released(handle)


def test_scalars_dropout_train_layers(stub):
    handle, lib = stub
    case = make_case(seed=5)
    call(case, lib, dropout=0.25, train=False)               # one layer: dropout never applies
    call(make_case(seed=5, L=2), lib, dropout=0.5, train=False)   # inference: no masks either
    plans = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    assert [p["scalars"]["dropout"] for p in plans] == [0.25, 0.5]
    assert [p["scalars"]["train"] for p in plans] == [False, False]
    assert [p["scalars"]["numLayers"] for p in plans] == [1, 2]
    assert_released(handle)


# ------------------------------------------------------------------ workspace


@pytest.mark.parametrize("size", [0, 1, 12345])
def test_workspace_of_the_planned_size_is_passed_and_freed(stub, size):
    handle, lib = stub
    handle.set_workspace_size(size)
    case = make_case(seed=6)
    call(case, lib)
    (plan,) = handle.entries("aclnnLstmBackwardGetWorkspaceSize")
    (run,) = handle.entries("aclnnLstmBackward")
    assert plan["workspace_size"] == size
    assert run["workspace_size"] == size
    n_tensors = handle.counter("tensors.created")
    if size == 0:
        assert run["workspace"] == 0                          # NULL, and nothing allocated for it
        assert handle.counter("mem.mallocs") == n_tensors
    else:
        assert run["workspace"] != 0
        assert handle.counter("mem.mallocs") == n_tensors + 1
        tensor_bytes = handle.counter("mem.malloc_bytes") - size
        assert tensor_bytes == sum(a.nbytes for a in _all_device_arrays(case))
    assert_released(handle)


def _all_device_arrays(case):
    """Every array uploaded, plus the outputs, as the device sees them (no empties here)."""
    inputs = [case["input"], *case["hx"], *case["params"], case["dy"], case["dh"], case["dc"]]
    inputs += [a for name in GATES for a in case[name]]
    outputs = [case["input"], *case["hx"], *case["params"]]
    return inputs + outputs


# ------------------------------------------------------------------ cleanup


FALLIBLE = ("aclrtSetDevice", "aclrtCreateStream", "aclrtMalloc", "aclrtMemcpy", "aclCreateTensor",
            "aclCreateTensorList", "aclCreateBoolArray", "aclnnLstmBackwardGetWorkspaceSize",
            "aclnnLstmBackward", "aclrtSynchronizeStream")
NULL_RETURNING = ("aclCreateTensor", "aclCreateTensorList", "aclCreateBoolArray")


def test_every_failure_point_raises_and_releases_everything(stub):
    """Fail each fallible call in turn (every occurrence): nothing may leak."""
    handle, lib = stub
    case = make_case(seed=7, L=1, bidirectional=True)
    call(case, lib)
    calls = {fn: handle.counter(f"calls.{fn}") for fn in FALLIBLE}
    assert all(calls.values()), calls
    runs = 0
    for fn, count in calls.items():
        for nth in range(1, count + 1):
            _quiet_finalize(lib)
            handle.reset()
            handle.fail(fn, 507011, nth)
            with pytest.raises(aclnn.AclnnError) as info:
                call(case, lib)
            err = info.value
            assert err.function == fn, (fn, nth, str(err))
            if fn in NULL_RETURNING:
                assert err.status is None and "returned NULL" in str(err)
            else:
                assert err.status == 507011 and err.status_name == "ACL_ERROR_RT_MODEL_EXECUTE"
            assert f"injected failure of {fn} (call {nth})" in str(err)
            assert_released(handle)
            runs += 1
    assert runs == sum(calls.values())


def test_workspace_allocation_failure_releases_the_unused_executor(stub):
    handle, lib = stub
    case = make_case(seed=8)
    call(case, lib)
    last_malloc = handle.counter("calls.aclrtMalloc")          # the workspace comes last
    _quiet_finalize(lib)
    handle.reset()
    handle.fail("aclrtMalloc", 207001, last_malloc)
    with pytest.raises(aclnn.AclnnError, match="ACL_ERROR_RT_MEMORY_ALLOCATION"):
        call(case, lib)
    assert handle.counter("calls.aclnnLstmBackward") == 0
    assert handle.counter("calls.aclSetAclOpExecutorRepeatable") == 1
    assert handle.counter("calls.aclDestroyAclOpExecutor") == 1
    assert_released(handle)          # made repeatable right after the first phase, not late


@pytest.mark.parametrize("second_phase", ["succeeds", "fails"])
def test_executor_is_repeatable_from_the_first_phase_and_destroyed_by_lstmcy(stub, second_phase):
    """aclSetAclOpExecutorRepeatable right after the first phase; the second phase keeps it."""
    handle, lib = stub
    case = make_case(seed=23)
    if second_phase == "fails":
        handle.fail("aclnnLstmBackward", 561002)
        with pytest.raises(aclnn.AclnnError, match="ACLNN_ERR_INNER_TILING_ERROR"):
            call(case, lib)
    else:
        dx, *_ = call(case, lib)
        np.testing.assert_array_equal(dx, stub_formula(2 * case["input"].astype(np.float64) + 1, np.float32))
    assert handle.counter("calls.aclSetAclOpExecutorRepeatable") == 1
    assert handle.counter("calls.aclDestroyAclOpExecutor") == 1
    assert handle.counter("calls.aclnnLstmBackward") == 1
    assert_released(handle)          # executors.created == executors.released, no errors.repeatable_late


def test_an_executor_the_runtime_will_not_reuse_is_left_to_the_second_phase(stub):
    handle, lib = stub
    handle.fail("aclSetAclOpExecutorRepeatable", 561000)     # "cant set executor repeatable ..."
    case = make_case(seed=24)
    dx, *_ = call(case, lib)
    np.testing.assert_array_equal(dx, stub_formula(2 * case["input"].astype(np.float64) + 1, np.float32))
    assert handle.counter("calls.aclDestroyAclOpExecutor") == 0   # it is not lstmcy's to destroy
    assert_released(handle)          # the second phase released it


def test_release_failure_is_reported_after_releasing_the_rest(stub):
    handle, lib = stub
    case = make_case(seed=9)
    handle.fail("aclDestroyTensorList", 161002, 1)
    with pytest.raises(aclnn.AclnnError) as info:
        call(case, lib)
    assert info.value.function == "aclDestroyTensorList"
    assert "releasing NPU resources" in str(info.value)
    c = handle.counters()
    assert c["lists.destroyed"] == c["lists.created"] - 1   # the one that refused
    assert c["mem.frees"] == c["mem.mallocs"] and c["mem.live_bytes"] == 0
    assert c["streams.destroyed"] == c["streams.created"] == 1
    assert c["boolarrays.destroyed"] == 1


def test_primary_error_wins_over_release_errors(stub):
    handle, lib = stub
    handle.fail("aclnnLstmBackwardGetWorkspaceSize", 161002)
    handle.fail("aclrtFree", 207002, 1)
    with pytest.raises(aclnn.AclnnError) as info:
        call(make_case(seed=10), lib)
    assert info.value.function == "aclnnLstmBackwardGetWorkspaceSize"
    assert handle.counter("mem.frees") == handle.counter("mem.mallocs") - 1


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("function, status, name", [
    ("aclnnLstmBackwardGetWorkspaceSize", 161001, "ACLNN_ERR_PARAM_NULLPTR"),
    ("aclnnLstmBackwardGetWorkspaceSize", 161002, "ACLNN_ERR_PARAM_INVALID"),
    ("aclnnLstmBackward", 561002, "ACLNN_ERR_INNER_TILING_ERROR"),
    ("aclnnLstmBackward", 561999, "ACLNN_ERR_INNER_XXX"),
    ("aclrtMemcpy", 507899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
])
def test_status_becomes_exception_with_name_number_and_message(stub, function, status, name):
    handle, lib = stub
    handle.fail(function, status)
    with pytest.raises(aclnn.AclnnError) as info:
        call(make_case(seed=11), lib)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.function, err.status, err.status_name) == (function, status, name)
    assert err.detail.startswith(f"stub: injected failure of {function}")
    assert str(err).startswith(f"{function} failed with {name} ({status}): stub: injected failure")
    assert_released(handle)


def test_validation_error_from_the_operator_reaches_the_caller(stub):
    """A status produced by the callee's own checks, not injected: wrong device id."""
    handle, lib = stub
    with pytest.raises(aclnn.AclnnError) as info:
        call(make_case(seed=12), lib, device_id=3)
    err = info.value
    assert (err.function, err.status, err.status_name) == ("aclrtSetDevice", 107001,
                                                           "ACL_ERROR_RT_INVALID_DEVICEID")
    assert "no device 3" in err.detail
    assert handle.counter("mem.mallocs") == 0                   # failed before allocating anything


def test_status_names():
    assert aclnn.status_name(0) == "ACLNN_SUCCESS"
    assert aclnn.status_name(161001) == "ACLNN_ERR_PARAM_NULLPTR"
    assert aclnn.status_name(161002) == "ACLNN_ERR_PARAM_INVALID"
    assert aclnn.status_name(361001) == "ACLNN_ERR_RUNTIME_ERROR"
    assert aclnn.status_name(561103) == "ACLNN_ERR_INNER_NULLPTR"
    assert aclnn.status_name(561777) == "ACLNN_ERR_INNER_XXX"
    assert aclnn.status_name(100002) == "ACL_ERROR_REPEAT_INITIALIZE"
    assert aclnn.status_name(207001) == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert aclnn.status_name(42) == "UNKNOWN_STATUS"


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_unsupported_dtype_is_a_type_error_before_any_library_use(dtype):
    case = make_case(seed=13)
    case = {k: ([a.astype(dtype) for a in v] if isinstance(v, list) else v) for k, v in case.items()}
    case["input"], case["dy"] = case["input"].astype(dtype), case["dy"].astype(dtype)
    with pytest.raises(TypeError, match="float32 and float16"):
        call(case, "/nonexistent/cann")    # raised before the library is even looked for


def test_bfloat16_is_a_type_error():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    case = make_case(seed=13)
    with pytest.raises(TypeError, match="bfloat16"):
        call(case, "/nonexistent/cann", input=case["input"].astype(ml_dtypes.bfloat16))


def test_mixed_dtypes_name_the_argument(stub):
    handle, lib = stub
    case = make_case(seed=14)
    case["dh"] = case["dh"].astype(np.float16)
    with pytest.raises(TypeError, match=r"^all arrays must share one dtype: input is float32 but dh is float16"):
        call(case, lib)
    bad = make_case(seed=14)
    bad["g"] = [bad["g"][0].astype(np.float64)]
    with pytest.raises(TypeError, match=r"but g\[0\] is float64"):
        call(bad, lib)
    assert handle.counter("mem.mallocs") == 0


def test_list_lengths_are_checked(stub):
    handle, lib = stub
    case = make_case(seed=15, L=2)
    with pytest.raises(ValueError, match=r"params must hold 8 arrays \(4 per layer and direction.*\), got 7"):
        call(case, lib, params=case["params"][:-1])
    with pytest.raises(ValueError, match=r"tanhc must hold 2 arrays \(one \[T, B, H\] array.*\), got 1"):
        call(case, lib, tanhc=case["tanhc"][:1])


def test_direct_calls_check_every_shape(stub):
    # lstmcy.lstm_backward(backend="aclnn") validates before it calls the operator; a direct
    # call of lstmcy.aclnn.lstm_backward must refuse the same inconsistent shapes, before
    # anything reaches the device.
    handle, lib = stub
    case = make_case(seed=16)
    T, B, H = case["i"][0].shape
    bad = {
        r"dy must have shape \(3, 2, 5\)": dict(dy=np.ones((2, B, H), np.float32)),
        r"params\[0\] \(w_ih of layer 0, forward direction\) must have shape":
            dict(params=[np.ones((3, 2), np.float32)] + case["params"][1:]),
        r"hx\[0\] \(h0\) must have shape": dict(hx=(np.ones((1, 1, 1), np.float32), case["hx"][1])),
        r"i\[0\] must have shape": dict(i=[np.ones((1, 1, 1), np.float32)]),
    }
    for message, override in bad.items():
        with pytest.raises(ValueError, match=message):
            call(case, lib, **override)
    assert handle.counter("mem.mallocs") == 0
    with pytest.raises(ValueError, match="dh and dc must be arrays"):
        call(case, lib, dh=None)
    with pytest.raises(ValueError, match="device_id must be a non-negative int or None, got 'x'"):
        call(case, lib, device_id="x")
    with pytest.raises(ValueError, match="device_id must be a non-negative int"):
        call(case, lib, device_id=-1)
    with pytest.raises(TypeError, match="library must be None, a path or an AclnnLibrary, got int"):
        aclnn.lstm_backward(*[case[k] for k in ("input", "hx", "params", "dy", "dh", "dc") + GATES],
                            **{k: v for k, v in case.items()
                               if k not in ("input", "hx", "params", "dy", "dh", "dc") + GATES},
                            library=5)


def test_dropout_between_layers_is_refused(stub):
    handle, lib = stub
    case = make_case(seed=16, L=2)
    with pytest.raises(ValueError, match="dropout.*no dropout masks"):
        call(case, lib, dropout=0.3)
    assert "dropout masks" in aclnn.unsupported_reason(np.float32, dropout=0.3, train=True, num_layers=2)
    assert aclnn.unsupported_reason(np.float32, dropout=0.3, train=False, num_layers=2) is None
    assert aclnn.unsupported_reason(np.float16, dropout=0.3, train=True, num_layers=1) is None
    assert "float32 and float16" in aclnn.unsupported_reason(np.float64)
    assert handle.counter("calls.aclInit") == 0


# ------------------------------------------------------------------ lifetime


def test_acl_is_initialized_once_and_finalized_once(stub):
    handle, lib = stub
    case = make_case(seed=17)
    call(case, lib)
    call(case, lib)
    assert handle.counter("acl.inits") == 1
    assert handle.counter("device.sets") == 1                  # once per thread and device
    assert handle.counter("streams.created") == handle.counter("streams.destroyed") == 2
    aclnn.finalize(lib)
    assert handle.counter("device.resets") == 1
    assert handle.counter("acl.finalizes") == 1
    aclnn.finalize(lib)                                          # idempotent
    assert handle.counter("acl.finalizes") == 1
    assert_released(handle)


def test_someone_else_owns_acl_init(stub):
    """torch_npu (or the user) already called aclInit: lstmcy must not finalize it."""
    handle, lib = stub
    assert lib.aclInit(None) == 0
    call(make_case(seed=18), lib)
    assert handle.counter("acl.inits") == 2                   # ours returned REPEAT_INITIALIZE
    aclnn.finalize(lib)
    assert handle.counter("acl.finalizes") == 0
    assert handle.counter("acl.initialized") == 1
    assert_released(handle)


def test_device_id_argument_and_environment(stub, monkeypatch):
    handle, lib = stub
    handle.set_device_count(3)
    call(make_case(seed=19), lib, device_id=2)
    assert handle.counter("device.last") == 2
    monkeypatch.setenv(aclnn.ENV_DEVICE, "1")
    call(make_case(seed=19), lib)
    assert handle.counter("device.last") == 1
    assert_released(handle)


def test_each_call_runs_on_its_device_whatever_the_thread_ran_before(stub):
    """aclrtSetDevice is how a thread switches device: 0, then 1, then 0 again runs on 0."""
    handle, lib = stub
    handle.set_device_count(2)
    case = make_case(seed=26)
    for device in (0, 1, 0):
        call(case, lib, device_id=device)
    assert [e["device"] for e in handle.entries("aclnnLstmBackwardGetWorkspaceSize")] == [0, 1, 0]
    assert [e["device"] for e in handle.entries("aclnnLstmBackward")] == [0, 1, 0]
    assert_released(handle)          # memory, stream and kernel on one device each time
    aclnn.finalize(lib)
    assert handle.counter("device.resets") == 2       # lstmcy initialised ACL: it resets what it set


def test_a_device_another_owner_made_current_is_current_again_after_the_call(stub):
    handle, lib = stub
    handle.set_device_count(2)
    case = make_case(seed=27)
    call(case, lib, device_id=0)
    assert lib.aclrtSetDevice(1) == 0                  # torch_npu switches this thread to device 1
    call(case, lib, device_id=0)
    assert [e["device"] for e in handle.entries("aclnnLstmBackward")] == [0, 0]
    assert handle.current_device() == 1                # as torch_npu left it
    handle.fail("aclnnLstmBackward", 507011)
    with pytest.raises(aclnn.AclnnError, match="ACL_ERROR_RT_MODEL_EXECUTE"):
        call(case, lib, device_id=0)
    assert handle.current_device() == 1                # also after a failed call
    assert_released(handle)


def test_finalize_leaves_the_devices_of_another_acl_owner_alone(stub):
    """torch_npu initialised ACL and works on device 0: lstmcy's finalize, and its exit, reset nothing."""
    handle, lib = stub
    assert lib.aclInit(None) == 0                      # the other owner
    assert lib.aclrtSetDevice(0) == 0
    owner_stream = ctypes.c_void_p()
    assert lib.aclrtCreateStream(ctypes.byref(owner_stream)) == 0
    case = make_case(seed=25)
    results = [call(case, lib)]                        # on the owner's thread
    worker = threading.Thread(target=lambda: results.append(call(case, lib)))
    worker.start()                                     # a thread where lstmcy sets the device itself
    worker.join()
    assert len(results) == 2
    aclnn.finalize(lib)
    aclnn.finalize()                                   # what runs at exit
    assert handle.counter("device.resets") == 0
    assert handle.counter("acl.finalizes") == 0
    assert lib.aclrtSynchronizeStream(owner_stream) == 0   # the owner's context and stream live on
    assert lib.aclrtDestroyStream(owner_stream) == 0
    assert_released(handle)


def test_without_a_kernel_path_auto_uses_the_cpu_and_says_why(stub, stub_path, tmp_path, clean_env):
    """CANN found through a default prefix without set_env.sh: libraries, but no $ASCEND_OPP_PATH."""
    import lstmcy

    handle, lib = stub
    root = tmp_path / "latest"
    _install(stub_path, root / "lib64")
    clean_env.setenv(aclnn.ENV_ROOTS, str(root))
    clean_env.delenv(aclnn.ENV_OPP_PATH)
    case = make_case(seed=28)
    args, kwargs = _public_args(case)
    with pytest.warns(aclnn.AclnnWarning, match=r"cannot run: the aclnn engine cannot find its kernels: "
                                                r"\$ASCEND_OPP_PATH is not set.*backend='auto' computes on the CPU"):
        auto = lstmcy.lstm_backward(*args, backend="auto", **kwargs)
    cpu = lstmcy.lstm_backward(*args, **kwargs)
    for a, b in zip(auto[:3], cpu[:3]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(auto[3], cpu[3]):
        np.testing.assert_array_equal(a, b)
    with pytest.warns(aclnn.AclnnWarning):
        assert aclnn.is_available() is False
    with pytest.raises(aclnn.AclnnError, match=r"ASCEND_OPP_PATH is not set .*set_env\.sh"):
        lstmcy.lstm_backward(*args, backend="aclnn", **kwargs)
    assert handle.counter("calls.aclnnLstmBackwardGetWorkspaceSize") == 0
    assert handle.counter("mem.mallocs") == 0

    clean_env.setenv(aclnn.ENV_OPP_PATH, str(tmp_path / "missing"))
    assert f"$ASCEND_OPP_PATH={str(tmp_path / 'missing')!r} does not exist" in aclnn.unavailable_reason()
    (tmp_path / "home" / "opp_latest").mkdir(parents=True)
    clean_env.setenv("ASCEND_HOME_PATH", str(tmp_path / "home"))      # the newer layout
    assert aclnn.kernel_path_problem() is None and aclnn.is_available() is True
    clean_env.delenv("ASCEND_HOME_PATH")
    clean_env.setenv(aclnn.ENV_OPP_PATH, str(tmp_path))
    assert aclnn.kernel_path_problem() is None and aclnn.is_available() is True

    # What the engine itself does without one (lstmcy's check bypassed): the stand-in models it.
    clean_env.delenv(aclnn.ENV_OPP_PATH)
    with pytest.raises(aclnn.AclnnError) as info:
        device_call(case, lib)
    assert (info.value.function, info.value.status) == ("aclnnLstmBackwardGetWorkspaceSize", 561103)
    assert "ASCEND_OPP_PATH" in info.value.detail
    assert_released(handle)


def test_is_available_reflects_devices(stub):
    handle, lib = stub
    assert aclnn.is_available(lib) is True
    assert aclnn.unavailable_reason(lib) is None
    _quiet_finalize(lib)
    handle.reset()
    handle.set_device_count(0)
    with pytest.warns(aclnn.AclnnWarning, match="cannot run: the runtime reports no NPU; backend='auto'"):
        assert aclnn.is_available(lib) is False
    handle.fail("aclInit", 500001)
    _quiet_finalize(lib)
    with pytest.warns(aclnn.AclnnWarning, match="aclInit failed with ACL_ERROR_FAILURE"):
        assert aclnn.is_available(lib) is False


# ------------------------------------------------------------------ discovery


def _install(stub_path, directory, opapi="libopapi.so", roles=("libascendcl.so", "libnnopbase.so")):
    """Lay the stub out as CANN would: one symlink per library file."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in (*roles, opapi):
        if name:
            (directory / name).symlink_to(stub_path)
    return directory


def test_explicit_file(stub_path, clean_env):
    lib = aclnn.load_library(stub_path)
    assert lib.route == "library argument"
    assert set(lib.paths.values()) == {str(stub_path)}
    assert aclnn.load_library(stub_path) is lib               # cached


@pytest.mark.parametrize("sub", ["", "lib64", "lib"])
def test_explicit_directory(stub_path, clean_env, tmp_path, sub):
    root = tmp_path / "cann"
    _install(stub_path, root / sub if sub else root)
    lib = aclnn.load_library(root)
    assert lib.route == "library argument"
    folder = root / sub if sub else root
    assert lib.paths == {"ascendcl": str(folder / "libascendcl.so"),
                         "nnopbase": str(folder / "libnnopbase.so"),
                         "opapi": str(folder / "libopapi.so")}


def test_env_library_variable(stub_path, clean_env, tmp_path):
    folder = _install(stub_path, tmp_path / "x" / "lib64", opapi="libopapi_nn.so")
    clean_env.setenv("LSTMCY_ACLNN_LIB", str(tmp_path / "x"))
    clean_env.setenv("ASCEND_HOME_PATH", str(tmp_path / "elsewhere"))   # not consulted
    lib = aclnn.load_library()
    assert lib.route == "$LSTMCY_ACLNN_LIB"
    assert lib.paths["opapi"] == str(folder / "libopapi_nn.so")


def test_ascend_home_path(stub_path, clean_env, tmp_path):
    home = tmp_path / "toolkit"
    _install(stub_path, home / "lib64")
    other = tmp_path / "other"
    _install(stub_path, other / "lib64")
    clean_env.setenv("ASCEND_HOME_PATH", str(home))
    clean_env.setenv("ASCEND_TOOLKIT_HOME", str(other))           # second choice
    lib = aclnn.load_library()
    assert lib.route == "$ASCEND_HOME_PATH"
    assert lib.paths["ascendcl"] == str(home / "lib64" / "libascendcl.so")


def test_ascend_toolkit_home_arch_dir_prefers_libopapi_nn(stub_path, clean_env, tmp_path):
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    folder = tmp_path / "tk" / f"{machine}-linux" / "lib64"
    _install(stub_path, folder, opapi="libopapi_nn.so")
    (folder / "libopapi.so").symlink_to(stub_path)
    clean_env.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "tk"))
    lib = aclnn.load_library()
    assert lib.route == "$ASCEND_TOOLKIT_HOME"
    assert lib.paths["opapi"] == str(folder / "libopapi_nn.so")


def test_default_prefix(stub_path, clean_env, tmp_path):
    _install(stub_path, tmp_path / "latest" / "lib64")
    clean_env.setenv(aclnn.ENV_ROOTS, os.pathsep.join([str(tmp_path / "missing"),
                                                     str(tmp_path / "latest")]))
    lib = aclnn.load_library()
    assert lib.route == "default prefix"


def test_default_prefixes_are_the_installs_unless_the_environment_lists_others(monkeypatch):
    monkeypatch.delenv(aclnn.ENV_ROOTS, raising=False)
    roots = aclnn.default_roots()
    assert roots[:2] == ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/nnae/latest")
    assert roots[2] == os.path.expanduser("~/Ascend/ascend-toolkit/latest") and "~" not in roots[2]
    monkeypatch.setenv(aclnn.ENV_ROOTS, os.pathsep.join(["/opt/a", "", "~/b"]))
    assert aclnn.default_roots() == ("/opt/a", os.path.expanduser("~/b"))
    monkeypatch.setenv(aclnn.ENV_ROOTS, "")
    assert aclnn.default_roots() == ()


def test_loader_search_path(stub_path, tmp_path):
    """Only LD_LIBRARY_PATH points at the libraries (read by the loader at start-up: subprocess)."""
    folder = _install(stub_path, tmp_path / "ld")
    env = {k: v for k, v in os.environ.items() if k not in ROUTE_ENV}
    env["LD_LIBRARY_PATH"] = str(folder)
    env[aclnn.ENV_OPP_PATH] = str(tmp_path)
    env[aclnn.ENV_ROOTS] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(aclnn.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    script = (
        "import lstmcy.aclnn as a\n"
        "lib = a.load_library()\n"
        "print(lib.route, sorted(lib.paths.values()), a.is_available())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "loader search path ['libascendcl.so', 'libnnopbase.so', 'libopapi_nn.so'] True" \
        or out.stdout.strip() == "loader search path ['libascendcl.so', 'libnnopbase.so', 'libopapi.so'] True"


def _loader_has_cann():
    try:
        ctypes.CDLL("libascendcl.so")
    except OSError:
        return False
    return True


def test_nothing_found_lists_every_route(clean_env, tmp_path):
    if _loader_has_cann():
        pytest.skip("a real libascendcl.so is on the loader path")
    empty = tmp_path / "empty"
    (empty / "lib64").mkdir(parents=True)
    (empty / "lib64" / "libascendcl.so").write_bytes(b"")      # only one of the three
    clean_env.setenv("ASCEND_HOME_PATH", str(empty))
    clean_env.setenv(aclnn.ENV_ROOTS, str(tmp_path / "nope"))
    with pytest.raises(aclnn.AclnnLibraryNotFound) as info:
        aclnn.load_library()
    err = info.value
    text = str(err)
    assert isinstance(err, aclnn.AclnnError) and isinstance(err, RuntimeError)
    assert f"$ASCEND_HOME_PATH: {empty / 'lib64'}: lacks libnnopbase.so, libopapi_nn.so or libopapi.so" in text
    assert "$ASCEND_TOOLKIT_HOME: not set" in text
    assert f"default prefix: {tmp_path / 'nope'}: no such directory" in text
    assert "loader search path: libascendcl.so" in text
    assert "LSTMCY_ACLNN_LIB" in text and "set_env.sh" in text
    assert len(err.searched) >= 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # no CANN at all: nothing to warn about
        assert aclnn.is_available() is False
    assert aclnn.unavailable_reason().startswith("CANN (the Ascend runtime providing aclnnLstmBackward) "
                                                 "was not found")
    with pytest.raises(aclnn.AclnnLibraryNotFound):
        call(make_case(seed=20), None)


def test_explicit_path_is_exclusive(stub_path, clean_env, tmp_path):
    _install(stub_path, tmp_path / "good" / "lib64")
    clean_env.setenv("ASCEND_HOME_PATH", str(tmp_path / "good"))   # would work, must not be used
    with pytest.raises(aclnn.AclnnLibraryNotFound) as info:
        aclnn.load_library(tmp_path / "bad")
    assert info.value.searched == [f"library argument: {tmp_path / 'bad'}: no such file or directory"]
    partial = _install(stub_path, tmp_path / "partial", opapi=None, roles=("libascendcl.so",))
    with pytest.raises(aclnn.AclnnLibraryNotFound, match="without libnnopbase.so, libopapi_nn.so or libopapi.so"):
        aclnn.load_library(partial)


def test_library_without_the_symbols(clean_env, tmp_path):
    source = tmp_path / "empty.c"
    source.write_text("int lstmcy_unrelated(void) { return 0; }\n")
    path = _compile(source, tmp_path / "libunrelated.so")
    with pytest.raises(aclnn.AclnnLibraryNotFound) as info:
        aclnn.load_library(path)
    assert f"library argument: {path}: lacks required symbols aclInit" in str(info.value)
    for name in ("aclInit", "aclCreateTensor", "aclnnLstmBackwardGetWorkspaceSize", "aclnnLstmBackward"):
        assert name in str(info.value)
    assert aclnn.is_available(path) is False


# ------------------------------------------------------------------ REAL HARDWARE


@pytest.mark.skipif(os.environ.get("LSTMCY_TEST_REAL_NPU") != "1",
                    reason="real-NPU check: set LSTMCY_TEST_REAL_NPU=1 on a machine with CANN and an Ascend NPU")
def test_real_npu_matches_cpu():
    """REAL HARDWARE ONLY: the NPU's gradients against lstmcy's CPU path (numerics, not marshalling)."""
    import lstmcy

    if not aclnn.is_available():
        pytest.fail("LSTMCY_TEST_REAL_NPU=1 but lstmcy.aclnn.is_available() is False")
    rng = np.random.default_rng(0)
    T, B, I, H = 5, 3, 4, 6
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    hx = (rng.standard_normal((1, B, H)).astype(np.float32), rng.standard_normal((1, B, H)).astype(np.float32))
    params = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dh, dc = rng.standard_normal(h_n.shape).astype(np.float32), rng.standard_normal(c_n.shape).astype(np.float32)
    args = (x, hx, params, dy, dh, dc, cache.i, cache.g, cache.f, cache.o, cache.h, cache.c, cache.tanhc)
    cpu = lstmcy.lstm_backward(*args)
    npu = aclnn.lstm_backward(*args, batch_sizes=None, has_bias=True, num_layers=1, dropout=0.0, train=True,
                              bidirectional=False, batch_first=False, output_mask=(True,) * 4)
    for got, want in zip(npu[:3], cpu[:3]):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    for got, want in zip(npu[3], cpu[3]):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


# ------------------------------------------------------- through the public API


def _public_args(case):
    args = [case[k] for k in ("input", "hx", "params", "dy", "dh", "dc") + GATES]
    kwargs = {k: case[k] for k in ("batch_sizes", "has_bias", "num_layers", "dropout", "train",
                                   "bidirectional", "batch_first", "output_mask")}
    return args, kwargs


def test_public_backend_aclnn_routes_to_the_operator(stub, stub_path):
    import lstmcy

    handle, lib = stub
    case = make_case(seed=3, L=2, bidirectional=True)
    args, kwargs = _public_args(case)
    clean = [np.array(a, copy=True) for a in args[:2] + [args[3]]]
    os.environ[aclnn.ENV_LIBRARY] = str(stub_path)
    try:
        via_public = lstmcy.lstm_backward(*args, backend="aclnn", **kwargs)
        via_auto = lstmcy.lstm_backward(*args, backend="auto", **kwargs)
    finally:
        del os.environ[aclnn.ENV_LIBRARY]
    direct = aclnn.lstm_backward(*args, library=lib, **kwargs)
    on_cpu = lstmcy.lstm_backward(*args, **kwargs)
    for got in (via_public, via_auto):
        np.testing.assert_array_equal(got[0], direct[0])
        np.testing.assert_array_equal(got[1], direct[1])
        for a, b in zip(got[3], direct[3]):
            np.testing.assert_array_equal(a, b)
    # The stand-in's formula is not an LSTM: the CPU result differs, so the routing is real.
    assert not np.allclose(on_cpu[0], direct[0])
    np.testing.assert_array_equal(args[0], clean[0])
    assert_released(handle)


def test_public_backend_auto_falls_back_to_the_cpu(stub, stub_path):
    import lstmcy

    case = make_case(seed=4, dtype=np.float64)  # float64: the operator does not take it
    args, kwargs = _public_args(case)
    os.environ[aclnn.ENV_LIBRARY] = str(stub_path)
    try:
        auto = lstmcy.lstm_backward(*args, backend="auto", **kwargs)
    finally:
        del os.environ[aclnn.ENV_LIBRARY]
    cpu = lstmcy.lstm_backward(*args, **kwargs)
    for a, b in zip(auto[:3], cpu[:3]):
        np.testing.assert_array_equal(a, b)


def test_public_backend_validates_before_touching_the_library(stub, stub_path):
    import lstmcy

    handle, _ = stub
    case = make_case(seed=5)
    args, kwargs = _public_args(case)
    args[3] = args[3][:, :, :-1]  # dy one feature short
    with pytest.raises(ValueError, match="dy"):
        lstmcy.lstm_backward(*args, backend="aclnn", **kwargs)
    with pytest.raises(ValueError, match="backend"):
        lstmcy.lstm_backward(*_public_args(case)[0], backend="gpu", **kwargs)
    assert handle.counters().get("tensors.created", 0) == 0
