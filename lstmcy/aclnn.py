"""Optional Ascend NPU backend: a ctypes binding to CANN's ``aclnnLstmBackward``.

This module lets code written against :func:`lstmcy.lstm_backward` run the
backward pass on a Huawei Ascend NPU, through the vendor's own operator,
without compiling anything: it loads the CANN runtime libraries
(``libascendcl.so``, ``libnnopbase.so`` and ``libopapi_nn.so`` or
``libopapi.so``) with :mod:`ctypes`, copies the numpy arrays to device
tensors, runs the two-phase call ``aclnnLstmBackwardGetWorkspaceSize`` /
``aclnnLstmBackward`` and copies the results back into numpy arrays shaped as
on the CPU path.

Nothing here imports the Cython extension, so ``import lstmcy.aclnn`` works
on a machine without a compiler or an NPU; without CANN, :func:`is_available`
returns ``False`` and :func:`lstm_backward` raises
:class:`AclnnLibraryNotFound`, which says what was searched.

Where to look for CANN (first match wins)
-----------------------------------------
1. The ``library`` argument, else the ``LSTMCY_ACLNN_LIB`` environment
   variable. Either names a directory (searched directly and in its ``lib64``
   and ``lib``) or one shared library that exports every symbol (a test
   stand-in or a merged shim). When given, nothing else is searched.
2. ``$ASCEND_HOME_PATH`` and ``$ASCEND_TOOLKIT_HOME`` (set by CANN's
   ``set_env.sh``): their ``lib64``, ``<machine>-linux/lib64`` and ``lib``.
3. The default install prefixes ``/usr/local/Ascend/ascend-toolkit/latest``
   and ``/usr/local/Ascend/nnae/latest``, same sub-directories.
4. The dynamic loader's own search path (``LD_LIBRARY_PATH``, ``ld.so.cache``),
   by bare library name.

The libraries alone do not run the operator: the aclnn engine loads its
kernels from ``$ASCEND_HOME_PATH/opp_latest`` or ``$ASCEND_OPP_PATH`` [opp]
(both set by ``set_env.sh``). Without either, :func:`is_available` is False
(with an :class:`AclnnWarning` giving the reason, so ``backend="auto"`` says
why it computes on the CPU) and :func:`lstm_backward` raises before any
device work.

Sharing the runtime with another owner (torch_npu)
--------------------------------------------------
Before each call the calling thread's current device is read
(``aclrtGetDevice``); when it is not the requested one, ``aclrtSetDevice``
switches to it and the thread's previous context is made current again
afterwards, so another library's notion of the thread's device is left as
it was. When ``aclInit`` was already called by someone else, that owner
keeps the ACL lifetime: :func:`finalize` (also run at exit) then neither
resets a device nor calls ``aclFinalize``.

Problems with an empty dimension (T, B, I or H = 0) are accepted by the
operator, which then returns at once and writes none of its outputs
[opsrc]; their gradients are computed on the host instead, by the CPU path.

Vendor sources (public headers and documentation) for every signature and
constant used below, cited inline as [tag]:

[rt]    hicann/runtime  include/external/acl/acl_rt.h  (aclrtMemcpyKind,
        aclrtMemMallocPolicy, aclrtSetDevice, aclrtMalloc, aclrtMemcpy, ...)
[base]  hicann/runtime  include/external/acl/acl_base_rt.h  (aclError = int,
        aclrtStream = void*, aclDataType, aclFormat, ACL_ERROR_* codes)
[rterr] hicann/runtime  include/external/acl/error_codes/rt_error_codes.h
[acl]   CANN acl/acl.h: ``aclError aclInit(const char *configPath)``,
        ``aclError aclFinalize()``, ``const char *aclGetRecentErrMsg()``
        (same prototypes in MegEngine/MegEngine dnn/atlas-stub/include/acl/acl.h
        and in the hicann/runtime pyacl docs, get_recent_err_msg)
[meta]  hicann/opbase  include/nnopbase/aclnn/acl_meta.h  (aclnnStatus =
        int32_t, aclCreateTensor, aclCreateTensorList, aclCreateBoolArray, the
        aclDestroy* functions, aclSetAclOpExecutorRepeatable,
        aclDestroyAclOpExecutor)
[op]    hicann/ops-nn  rnn/single_layer_lstm_grad/docs/aclnnLstmBackward_en.md
        (prototypes of aclnnLstmBackwardGetWorkspaceSize / aclnnLstmBackward,
        argument order, dtypes, shapes, error codes 161001 / 161002)
[opsrc] hicann/ops-nn  rnn/single_layer_lstm_grad/op_api/aclnn_lstm_backward.cpp
        (the exact format checks: input/dy/dx NCL, or ND with batchSizes;
        hx, dh, dc, dhPrev, dcPrev and the gate lists NCL; params/dparams ND;
        batchSizes ND INT64; outputMask unused; ``EmptyCheck``: when any
        input tensor has no elements the first phase returns success with
        workspaceSize 0 and the outputs are never written)
[codes] hicann/ops-nn  docs/en/context/aclnn_return_codes_nn.md  (ACLNN_*)
[docs]  hiascend.com CANN API reference (aolapi "operatorlist" pages):
        aclDestroyTensorList also releases the tensors in the list ("The
        aclTensor in the aclTensorList does not need to be destroyed again");
        aclCreateBoolArray copies its values; aclCreateTensor strides are in
        elements and its data must be 32-byte aligned device memory;
        aclrtMalloc refuses size 0.
[exec]  hicann/opbase  docs/en/api/nnopbase/aclnn/aclSetAclOpExecutorRepeatable.md,
        aclDestroyAclOpExecutor.md and src/nnopbase/composite_op/aclnn_engine/
        op_executor.cpp (``CommonOpExecutorRun``): an executor is made
        repeatable right after the first phase or not at all (``SetRepeatable``
        reads the calling thread's state of its latest first phase, and some
        executors refuse); the second phase deletes a non-repeatable executor
        whatever its result and keeps a repeatable one, which
        ``aclDestroyAclOpExecutor`` releases.
[dev]   hicann/runtime  include/external/acl/acl_rt.h, src/acl/aclrt_impl/device.cpp,
        src/runtime/api/impl/api_impl.cc: ``aclrtSetDevice`` makes the
        device's default context the calling thread's current one (it is how
        a thread switches device); ``aclrtGetDevice`` reports the current
        context's device, or fails without one; streams are launched on and
        destroyed from their own context; ``aclrtResetDevice`` releases the
        default context and every stream in it (one call, however many times
        the device was set, as acl_rt.h documents).
[opp]   hicann/opbase  src/nnopbase/composite_op/aclnn_engine/kernel_utils.cpp
        (``GetOppKernelPath``): the aclnn engine loads its kernels from
        ``$ASCEND_HOME_PATH/opp_latest`` if that exists, else from
        ``$ASCEND_OPP_PATH``, else fails with ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND.
[libs]  hicann/ops-nn docs/zh/invocation/quick_op_invocation.md links built-in
        ops against lib64/libopapi_nn.so (CANN split packages); older
        toolkits ship them in lib64/libopapi.so.

Not taken from a header (judgement calls, flagged where used): how an empty
tensor's data pointer should look (we pass a 32-byte placeholder buffer rather
than NULL), and whether ``aclrtGetDeviceCount`` needs ``aclInit`` first (we
call it after).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import platform
import threading
import warnings
from typing import NamedTuple

import numpy as np

from lstmcy._engine.cache import SAVED_NAMES
from lstmcy._engine.validation import check_backward, check_output_mask

__all__ = [
    "AclnnError",
    "AclnnLibrary",
    "AclnnLibraryNotFound",
    "AclnnWarning",
    "ENV_DEVICE",
    "ENV_LIBRARY",
    "STATUS_NAMES",
    "finalize",
    "is_available",
    "kernel_path_problem",
    "load_library",
    "lstm_backward",
    "status_name",
    "unavailable_reason",
    "unsupported_reason",
]

ENV_LIBRARY = "LSTMCY_ACLNN_LIB"
ENV_DEVICE = "LSTMCY_ACLNN_DEVICE"
ROOT_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
ENV_OPP_PATH = "ASCEND_OPP_PATH"
ENV_ROOTS = "LSTMCY_ACLNN_ROOTS"
#: Install prefixes searched after ``$ASCEND_HOME_PATH`` / ``$ASCEND_TOOLKIT_HOME``: a root
#: install's toolkit and runtime, and a user's install (CANN's default without root).
#: ``$LSTMCY_ACLNN_ROOTS`` (paths separated by ``os.pathsep``; empty: none) replaces them.
DEFAULT_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/nnae/latest",
                 "~/Ascend/ascend-toolkit/latest")


def default_roots():
    """The install prefixes searched after the environment's: ``$LSTMCY_ACLNN_ROOTS`` if set,
    else :data:`DEFAULT_ROOTS` (``~`` expanded)."""
    value = os.environ.get(ENV_ROOTS)
    roots = DEFAULT_ROOTS if value is None else [r for r in value.split(os.pathsep) if r]
    return tuple(os.path.expanduser(root) for root in roots)

# library role -> file names, in order of preference [libs]
LIBRARY_ROLES = {
    "ascendcl": ("libascendcl.so",),
    "nnopbase": ("libnnopbase.so",),
    "opapi": ("libopapi_nn.so", "libopapi.so"),
}

# ---------------------------------------------------------------- constants
# aclDataType [base]
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT64 = 9
# aclFormat [base]
ACL_FORMAT_ND = 2
ACL_FORMAT_NCL = 47
# aclrtMemcpyKind: HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, ... [rt]
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
# aclrtMemMallocPolicy: ACL_MEM_MALLOC_HUGE_FIRST is the first enumerator [rt]
ACL_MEM_MALLOC_HUGE_FIRST = 0

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002  # [base]

_NUMPY_TO_ACL = {np.dtype(np.float32): ACL_FLOAT, np.dtype(np.float16): ACL_FLOAT16}

#: Names of the status codes an aclnn or acl call can return.
STATUS_NAMES = {
    # aclnn return codes [codes]
    0: "ACLNN_SUCCESS",
    161001: "ACLNN_ERR_PARAM_NULLPTR",
    161002: "ACLNN_ERR_PARAM_INVALID",
    361001: "ACLNN_ERR_RUNTIME_ERROR",
    561000: "ACLNN_ERR_INNER",
    561001: "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
    561002: "ACLNN_ERR_INNER_TILING_ERROR",
    561003: "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
    561101: "ACLNN_ERR_INNER_CREATE_EXECUTOR",
    561102: "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
    561103: "ACLNN_ERR_INNER_NULLPTR",
    561104: "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE",
    561105: "ACLNN_ERR_INNER_KEY_CONFILICT",  # (sic, vendor spelling)
    561106: "ACLNN_ERR_INNER_INVALID_IMPL_MODE",
    561107: "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
    561108: "ACLNN_ERR_INNER_LOAD_JSON_FAILED",
    561109: "ACLNN_ERR_INNER_JSON_VALUE_NOT_FOUND",
    561110: "ACLNN_ERR_INNER_JSON_FORMAT_INVALID",
    561111: "ACLNN_ERR_INNER_JSON_DTYPE_INVALID",
    561112: "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND",
    561113: "ACLNN_ERR_INNER_OP_FILE_INVALID",
    561114: "ACLNN_ERR_INNER_ATTR_NUM_OUT_OF_BOUND",
    561115: "ACLNN_ERR_INNER_ATTR_LEN_NOT_ENOUGH",
    561116: "ACLNN_ERR_INNER_INPUT_NUM_IN_JSON_TOO_LARGE",
    561117: "ACLNN_ERR_INNER_INPUT_JSON_IS_NULL",
    561118: "ACLNN_ERR_INNER_STATIC_WORKSPACE_INVALID",
    561119: "ACLNN_ERR_INNER_STATIC_BLOCK_DIM_INVALID",
    # acl runtime codes [base]
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    200001: "ACL_ERROR_API_NOT_SUPPORT",
    200002: "ACL_ERROR_INVALID_DEVICE",
    200003: "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
    200004: "ACL_ERROR_RESOURCE_NOT_MATCH",
    200005: "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    200006: "ACL_ERROR_FEATURE_UNSUPPORTED",
    300000: "ACL_ERROR_STORAGE_OVER_LIMIT",
    500000: "ACL_ERROR_INTERNAL_ERROR",
    500001: "ACL_ERROR_FAILURE",
    500002: "ACL_ERROR_GE_FAILURE",
    500003: "ACL_ERROR_RT_FAILURE",
    500004: "ACL_ERROR_DRV_FAILURE",
    # runtime codes [rterr] (the ones a memory/stream/device call can return)
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",
    107008: "ACL_ERROR_RT_ADDR_UNALIGNED",
    107017: "ACL_ERROR_RT_INVALID_HANDLE",
    107020: "ACL_ERROR_RT_TASK_TIMEOUT",
    207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207002: "ACL_ERROR_RT_MEMORY_FREE",
    207004: "ACL_ERROR_RT_NO_DEVICE",
    207005: "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL",
    207006: "ACL_ERROR_RT_NO_PERMISSION",
    207008: "ACL_ERROR_RT_NO_STREAM_RESOURCE",
    207018: "ACL_ERROR_RT_DEVICE_OOM",
    507000: "ACL_ERROR_RT_INTERNAL_ERROR",
    507001: "ACL_ERROR_RT_TS_ERROR",
    507011: "ACL_ERROR_RT_MODEL_EXECUTE",
    507014: "ACL_ERROR_RT_AICORE_TIMEOUT",
    507015: "ACL_ERROR_RT_AICORE_EXCEPTION",
    507033: "ACL_ERROR_RT_DEV_SETUP_ERROR",
    507035: "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION",
    507046: "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}


def status_name(status):
    """Return the vendor's name for an acl/aclnn status code.

    Parameters
    ----------
    status : int
        A value returned by an ``acl*`` or ``aclnn*`` function.

    Returns
    -------
    str
        For example ``"ACLNN_ERR_PARAM_INVALID"`` for 161002; for a code not
        in :data:`STATUS_NAMES`, ``"ACLNN_ERR_INNER_XXX"`` in the 561xxx
        range (the vendor's catch-all) and ``"UNKNOWN_STATUS"`` otherwise.
    """
    status = int(status)
    if status in STATUS_NAMES:
        return STATUS_NAMES[status]
    if 561000 <= status < 562000:
        return "ACLNN_ERR_INNER_XXX"
    return "UNKNOWN_STATUS"


# ------------------------------------------------------------------- errors


class AclnnError(RuntimeError):
    """A CANN call failed.

    Attributes
    ----------
    function : str or None
        The C function that failed.
    status : int or None
        Its non-zero status, or None when it returned a NULL handle (or
        when no call was made, as for :class:`AclnnLibraryNotFound`).
    status_name : str or None
        The vendor's name for ``status`` (see :func:`status_name`).
    detail : str
        The runtime's own description from ``aclGetRecentErrMsg()``, or ``""``.
    """

    def __init__(self, message, *, function=None, status=None, detail=""):
        self.function = function
        self.status = None if status is None else int(status)
        self.status_name = None if status is None else status_name(status)
        self.detail = detail or ""
        super().__init__(message)


class AclnnLibraryNotFound(AclnnError):
    """No usable CANN installation was found.

    Attributes
    ----------
    searched : list of str
        One line per place looked at, with the reason it was rejected.
    """

    def __init__(self, message, searched):
        self.searched = list(searched)
        super().__init__(message)


class AclnnWarning(RuntimeWarning):
    """CANN was found, but the NPU backend cannot run here (see :func:`unavailable_reason`)."""


# ---------------------------------------------------------------- binding

_vp = ctypes.c_void_p
_i64p = ctypes.POINTER(ctypes.c_int64)

# (name, library role, restype, argtypes, required)
_SIGNATURES = (
    # aclError aclInit(const char *configPath) [acl]
    ("aclInit", "ascendcl", ctypes.c_int, (ctypes.c_char_p,), True),
    # aclError aclFinalize() [acl]
    ("aclFinalize", "ascendcl", ctypes.c_int, (), True),
    # const char *aclGetRecentErrMsg() [acl]
    ("aclGetRecentErrMsg", "ascendcl", ctypes.c_char_p, (), True),
    # aclError aclrtSetDevice(int32_t deviceId) [rt]
    ("aclrtSetDevice", "ascendcl", ctypes.c_int, (ctypes.c_int32,), True),
    # aclError aclrtGetDevice(int32_t *deviceId) [rt]
    ("aclrtGetDevice", "ascendcl", ctypes.c_int, (ctypes.POINTER(ctypes.c_int32),), True),
    # aclError aclrtGetCurrentContext(aclrtContext *context) [rt] (aclrtContext = void* [base])
    ("aclrtGetCurrentContext", "ascendcl", ctypes.c_int, (ctypes.POINTER(_vp),), True),
    # aclError aclrtSetCurrentContext(aclrtContext context) [rt]
    ("aclrtSetCurrentContext", "ascendcl", ctypes.c_int, (_vp,), True),
    # aclError aclrtResetDevice(int32_t deviceId) [rt]
    ("aclrtResetDevice", "ascendcl", ctypes.c_int, (ctypes.c_int32,), True),
    # aclError aclrtGetDeviceCount(uint32_t *count) [rt]
    ("aclrtGetDeviceCount", "ascendcl", ctypes.c_int, (ctypes.POINTER(ctypes.c_uint32),), False),
    # aclError aclrtCreateStream(aclrtStream *stream) [rt]
    ("aclrtCreateStream", "ascendcl", ctypes.c_int, (ctypes.POINTER(_vp),), True),
    # aclError aclrtSynchronizeStream(aclrtStream stream) [rt]
    ("aclrtSynchronizeStream", "ascendcl", ctypes.c_int, (_vp,), True),
    # aclError aclrtDestroyStream(aclrtStream stream) [rt]
    ("aclrtDestroyStream", "ascendcl", ctypes.c_int, (_vp,), True),
    # aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) [rt]
    ("aclrtMalloc", "ascendcl", ctypes.c_int, (ctypes.POINTER(_vp), ctypes.c_size_t, ctypes.c_int), True),
    # aclError aclrtFree(void *devPtr) [rt]
    ("aclrtFree", "ascendcl", ctypes.c_int, (_vp,), True),
    # aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
    #                      aclrtMemcpyKind kind) [rt]
    ("aclrtMemcpy", "ascendcl", ctypes.c_int,
     (_vp, ctypes.c_size_t, _vp, ctypes.c_size_t, ctypes.c_int), True),
    # aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
    #     aclDataType dataType, const int64_t *stride, int64_t offset, aclFormat format,
    #     const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData) [meta]
    ("aclCreateTensor", "nnopbase", _vp,
     (_i64p, ctypes.c_uint64, ctypes.c_int, _i64p, ctypes.c_int64, ctypes.c_int, _i64p, ctypes.c_uint64, _vp),
     True),
    # aclnnStatus aclDestroyTensor(const aclTensor *tensor) [meta]
    ("aclDestroyTensor", "nnopbase", ctypes.c_int32, (_vp,), True),
    # aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size) [meta]
    ("aclCreateTensorList", "nnopbase", _vp, (ctypes.POINTER(_vp), ctypes.c_uint64), True),
    # aclnnStatus aclDestroyTensorList(const aclTensorList *array) [meta]
    ("aclDestroyTensorList", "nnopbase", ctypes.c_int32, (_vp,), True),
    # aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size) [meta]
    ("aclCreateBoolArray", "nnopbase", _vp, (ctypes.POINTER(ctypes.c_bool), ctypes.c_uint64), True),
    # aclnnStatus aclDestroyBoolArray(const aclBoolArray *array) [meta]
    ("aclDestroyBoolArray", "nnopbase", ctypes.c_int32, (_vp,), True),
    # aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) [meta]
    ("aclSetAclOpExecutorRepeatable", "nnopbase", ctypes.c_int32, (_vp,), False),
    # aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) [meta]
    ("aclDestroyAclOpExecutor", "nnopbase", ctypes.c_int32, (_vp,), False),
    # aclnnStatus aclnnLstmBackwardGetWorkspaceSize(
    #     const aclTensor *input, const aclTensorList *hx, const aclTensorList *params,
    #     const aclTensor *dy, const aclTensor *dh, const aclTensor *dc,
    #     const aclTensorList *i, const aclTensorList *g, const aclTensorList *f,
    #     const aclTensorList *o, const aclTensorList *h, const aclTensorList *c,
    #     const aclTensorList *tanhc, const aclTensor *batchSizesOptional,
    #     bool hasBias, int64_t numLayers, double dropout, bool train, bool bidirectional,
    #     bool batchFirst, const aclBoolArray *outputMask, aclTensor *dxOut,
    #     aclTensor *dhPrevOut, aclTensor *dcPrevOut, aclTensorList *dparamsOut,
    #     uint64_t *workspaceSize, aclOpExecutor **executor) [op] [opsrc]
    ("aclnnLstmBackwardGetWorkspaceSize", "opapi", ctypes.c_int32,
     (_vp, _vp, _vp, _vp, _vp, _vp,                       # input, hx, params, dy, dh, dc
      _vp, _vp, _vp, _vp, _vp, _vp, _vp,                  # i, g, f, o, h, c, tanhc
      _vp,                                                # batchSizesOptional
      ctypes.c_bool, ctypes.c_int64, ctypes.c_double,     # hasBias, numLayers, dropout
      ctypes.c_bool, ctypes.c_bool, ctypes.c_bool,        # train, bidirectional, batchFirst
      _vp,                                                # outputMask
      _vp, _vp, _vp, _vp,                                 # dxOut, dhPrevOut, dcPrevOut, dparamsOut
      ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_vp)), True),
    # aclnnStatus aclnnLstmBackward(void *workspace, uint64_t workspaceSize,
    #     aclOpExecutor *executor, aclrtStream stream) [op]
    ("aclnnLstmBackward", "opapi", ctypes.c_int32, (_vp, ctypes.c_uint64, _vp, _vp), True),
)


def _bind(handles, role, name, restype, argtypes):
    """Find ``name`` in the library of ``role`` first, then in the others."""
    order = [handles[role]] + [h for r, h in handles.items() if r != role]
    for handle in order:
        try:
            fn = getattr(handle, name)
        except AttributeError:
            continue
        fn.restype = restype
        fn.argtypes = list(argtypes)
        return fn
    return None


class AclnnLibrary:
    """The loaded CANN libraries with every entry point bound.

    Use :func:`load_library` to get one; it finds the files and caches the
    result. The ``acl*`` / ``aclnn*`` attributes are the bound C functions.

    Attributes
    ----------
    paths : dict
        Library role (``"ascendcl"``, ``"nnopbase"``, ``"opapi"``) to the file
        or loader name it was loaded from.
    route : str
        Which search route found it.
    """

    def __init__(self, paths, route):
        self.paths = dict(paths)
        self.route = route
        handles = {}
        opened = {}
        for role, path in self.paths.items():
            if path not in opened:
                # RTLD_GLOBAL so that libopapi*'s dependencies on libnnopbase /
                # libascendcl resolve against the copies loaded here.
                opened[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            handles[role] = opened[path]
        self._handles = handles
        missing = []
        for name, role, restype, argtypes, required in _SIGNATURES:
            fn = _bind(handles, role, name, restype, argtypes)
            if fn is None and required:
                missing.append(name)
            setattr(self, name, fn)
        if missing:
            raise AclnnLibraryNotFound(
                f"the CANN libraries at {self._describe_paths()} lack required symbols: "
                + ", ".join(missing),
                [f"{route}: {self._describe_paths()}: lacks required symbols {', '.join(missing)}"],
            )
        self._lock = threading.RLock()
        self._initialized = False          # aclInit has been called successfully (by anyone)
        self._initialized_by_us = False    # ... by this object: finalize() undoes it
        self._devices = set()              # devices this object passed to aclrtSetDevice

    def _describe_paths(self):
        unique = list(dict.fromkeys(self.paths.values()))
        return ", ".join(unique)

    def __repr__(self):
        return f"<AclnnLibrary {self._describe_paths()} via {self.route}>"

    # ------------------------------------------------------------ errors
    def recent_error_message(self):
        """Return (and clear) the runtime's last error description, or ``""``."""
        try:
            raw = self.aclGetRecentErrMsg()
        except Exception:  # pragma: no cover - a broken runtime must not mask the real error
            return ""
        if not raw:
            return ""
        return raw.decode("utf-8", errors="replace").strip()

    def check(self, status, function):
        """Raise :class:`AclnnError` if ``status`` is non-zero."""
        if status != 0:
            detail = self.recent_error_message()
            message = f"{function} failed with {status_name(status)} ({int(status)})"
            if detail:
                message += f": {detail}"
            raise AclnnError(message, function=function, status=status, detail=detail)

    def null_handle(self, function):
        """Build the :class:`AclnnError` for a creator that returned NULL."""
        detail = self.recent_error_message()
        message = f"{function} returned NULL"
        if detail:
            message += f": {detail}"
        return AclnnError(message, function=function, detail=detail)

    # ---------------------------------------------------- init / device
    def ensure_initialized(self):
        """Call ``aclInit(NULL)`` once; tolerate an already-initialized process."""
        with self._lock:
            if self._initialized:
                return
            status = self.aclInit(None)
            if status == ACL_ERROR_REPEAT_INITIALIZE:
                # someone else (e.g. torch_npu) owns the ACL lifetime
                self.recent_error_message()  # clear it
            else:
                self.check(status, "aclInit")
                self._initialized_by_us = True
            self._initialized = True

    def device_count(self):
        """Number of NPUs the runtime sees, or None if it cannot say."""
        if self.aclrtGetDeviceCount is None:
            return None
        count = ctypes.c_uint32(0)
        status = self.aclrtGetDeviceCount(ctypes.byref(count))
        if status != 0:
            self.recent_error_message()
            return 0
        return int(count.value)

    @contextlib.contextmanager
    def on_device(self, device_id):
        """Run the block with ``device_id`` current on the calling thread.

        The thread's current device is read, never assumed: another call,
        thread or library (torch_npu) may have switched it [dev]. When it is
        another device, ``aclrtSetDevice`` switches and the thread's previous
        context is made current again when the block ends.
        """
        device_id = int(device_id)
        current = ctypes.c_int32(-1)
        status = self.aclrtGetDevice(ctypes.byref(current))
        if status == 0 and current.value == device_id:
            yield
            return
        previous = ctypes.c_void_p()
        if status != 0:
            self.recent_error_message()  # no current context on this thread: nothing to restore
        elif self.aclrtGetCurrentContext(ctypes.byref(previous)) != 0:
            self.recent_error_message()
            previous = ctypes.c_void_p()
        self.check(self.aclrtSetDevice(device_id), "aclrtSetDevice")
        with self._lock:
            self._devices.add(device_id)
        try:
            yield
        except BaseException:
            if previous.value:
                self.aclrtSetCurrentContext(previous)  # the original error wins
            raise
        if previous.value:
            self.check(self.aclrtSetCurrentContext(previous), "aclrtSetCurrentContext")

    def finalize(self):
        """Undo what this object set up, when it owns the ACL lifetime.

        When this object's ``aclInit`` initialised ACL, reset the devices it
        set and call ``aclFinalize``. When another owner (torch_npu, the
        application) had initialised it, nothing is reset or finalized: one
        ``aclrtResetDevice`` releases a device's default context and its
        streams for every user in the process [dev]. Safe to call more than
        once. Registered with :mod:`atexit` for every library this module
        initialized.
        """
        with self._lock:
            first_error = None
            if self._initialized_by_us:
                for device in sorted(self._devices):
                    status = self.aclrtResetDevice(device)
                    if status != 0 and first_error is None:
                        first_error = (status, "aclrtResetDevice")
                status = self.aclFinalize()
                if status != 0 and first_error is None:
                    first_error = (status, "aclFinalize")
            self._devices.clear()
            self._initialized = False
            self._initialized_by_us = False
            if first_error is not None:
                self.check(*first_error)


# ------------------------------------------------------------- discovery

_cache_lock = threading.Lock()
_library_cache = {}   # tuple of (role, path) -> AclnnLibrary
_initialized_libraries = []


def _machine_subdir():
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine) + "-linux"


def _roles_in_directory(directory):
    """Map every role to a file in ``directory``; None if one is missing."""
    found = {}
    for role, names in LIBRARY_ROLES.items():
        for name in names:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate):
                found[role] = candidate
                break
        else:
            return None
    return found


def _missing_roles(directory):
    return [" or ".join(names) for role, names in LIBRARY_ROLES.items()
            if not any(os.path.isfile(os.path.join(directory, n)) for n in names)]


def _candidates(path):
    """Yield ``(route, paths or None, note)`` for every place to try, in order."""
    explicit = None
    if path is not None:
        explicit = ("library argument", os.fspath(path))
    elif os.environ.get(ENV_LIBRARY):
        explicit = (f"${ENV_LIBRARY}", os.environ[ENV_LIBRARY])
    if explicit is not None:
        route, spec = explicit
        spec = os.path.expanduser(spec)
        if os.path.isfile(spec):
            yield route, {role: spec for role in LIBRARY_ROLES}, spec
        elif os.path.isdir(spec):
            for sub in ("", "lib64", "lib"):
                directory = os.path.join(spec, sub) if sub else spec
                found = _roles_in_directory(directory)
                if found:
                    yield route, found, directory
                    break
            else:
                yield route, None, (f"{spec}: directory without {', '.join(_missing_roles(spec))} "
                                    "(also looked in its lib64/ and lib/)")
        else:
            yield route, None, f"{spec}: no such file or directory"
        return

    subdirs = ("lib64", os.path.join(_machine_subdir(), "lib64"), "lib")
    roots = [(f"${var}", os.environ[var]) for var in ROOT_ENV_VARS if os.environ.get(var)]
    for var in ROOT_ENV_VARS:
        if not os.environ.get(var):
            yield f"${var}", None, "not set"
    roots += [("default prefix", root) for root in default_roots()]
    seen = set()
    for route, root in roots:
        if not os.path.isdir(root):
            yield route, None, f"{root}: no such directory"
            continue
        for sub in subdirs:
            directory = os.path.join(root, sub)
            if directory in seen:
                continue
            seen.add(directory)
            if not os.path.isdir(directory):
                yield route, None, f"{directory}: no such directory"
                continue
            found = _roles_in_directory(directory)
            if found:
                yield route, found, directory
            else:
                yield route, None, f"{directory}: lacks {', '.join(_missing_roles(directory))}"
    # Last: the dynamic loader's search path, by bare name.
    yield "loader search path", "loader", "dlopen by name"


def _load_by_name():
    """Resolve every role through the dynamic loader; raise OSError if one fails."""
    paths = {}
    errors = []
    for role, names in LIBRARY_ROLES.items():
        for name in names:
            try:
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                errors.append(str(exc))
                continue
            paths[role] = name
            break
        else:
            raise OSError("; ".join(errors))
    return paths


def load_library(path=None):
    """Find, load and bind the CANN libraries.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A directory holding ``libascendcl.so``, ``libnnopbase.so`` and
        ``libopapi_nn.so`` (or ``libopapi.so``), directly or in ``lib64/`` or
        ``lib/``; or one shared library exporting every symbol. Defaults to
        ``$LSTMCY_ACLNN_LIB``, then the search described in the module
        docstring.

    Returns
    -------
    AclnnLibrary
        Cached: loading the same files again returns the same object.

    Raises
    ------
    AclnnLibraryNotFound
        If nothing usable was found; the message lists every place searched
        and how to point lstmcy at an installation.
    """
    searched = []
    for route, paths, note in _candidates(path):
        if paths is None:
            searched.append(f"{route}: {note}")
            continue
        if paths == "loader":
            try:
                paths = _load_by_name()
            except OSError as exc:
                searched.append(f"{route}: {exc}")
                continue
        key = tuple(sorted(paths.items()))
        with _cache_lock:
            cached = _library_cache.get(key)
        if cached is not None:
            return cached
        try:
            library = AclnnLibrary(paths, route)
        except AclnnLibraryNotFound as exc:
            searched.extend(exc.searched)
            continue
        except OSError as exc:
            searched.append(f"{route}: {note}: cannot load: {exc}")
            continue
        with _cache_lock:
            library = _library_cache.setdefault(key, library)
        return library
    message = (
        "CANN (the Ascend runtime providing aclnnLstmBackward) was not found.\n"
        "Searched:\n  " + "\n  ".join(searched) + "\n"
        "To use the NPU backend, install the CANN toolkit and source its set_env.sh "
        "(which sets ASCEND_HOME_PATH and LD_LIBRARY_PATH), or point lstmcy at the "
        f"directory holding libascendcl.so, libnnopbase.so and libopapi_nn.so/libopapi.so "
        f"with ${ENV_LIBRARY}=<dir> or lstmcy.aclnn.load_library(<dir>). "
        "backend='cpu' needs none of this."
    )
    raise AclnnLibraryNotFound(message, searched)


def _resolve(library):
    if isinstance(library, AclnnLibrary):
        return library
    return load_library(library)


def _ensure_initialized(library):
    was = library._initialized_by_us
    library.ensure_initialized()
    if library._initialized_by_us and not was:
        with _cache_lock:
            if library not in _initialized_libraries:
                _initialized_libraries.append(library)


def kernel_path_problem():
    """Why the aclnn engine would not find its kernels, or None.

    The engine loads them from ``$ASCEND_HOME_PATH/opp_latest`` when that
    exists, else from ``$ASCEND_OPP_PATH``, and fails otherwise [opp].
    CANN's ``set_env.sh`` sets both variables; a toolkit found through the
    default prefixes without it has its libraries but no kernel path.

    Returns
    -------
    str or None
    """
    home = os.environ.get("ASCEND_HOME_PATH")
    if home and os.path.exists(os.path.join(home, "opp_latest")):
        return None
    opp = os.environ.get(ENV_OPP_PATH)
    if opp and os.path.exists(opp):
        return None
    where = (f"${ENV_OPP_PATH}={opp!r} does not exist" if opp
             else f"${ENV_OPP_PATH} is not set")
    return (f"the aclnn engine cannot find its kernels: {where} (nor $ASCEND_HOME_PATH/opp_latest); "
            "source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) "
            f"or set ${ENV_OPP_PATH} to the toolkit's opp directory")


def _availability(library):
    """``(reason or None, library or None)``: why the backend cannot run, and what was found."""
    try:
        lib = _resolve(library)
    except AclnnLibraryNotFound as exc:
        return str(exc).splitlines()[0], None
    except (AclnnError, OSError) as exc:
        return f"CANN could not be loaded: {exc}", None
    problem = kernel_path_problem()
    if problem is not None:
        return problem, lib
    try:
        _ensure_initialized(lib)
        count = lib.device_count()
    except AclnnError as exc:
        return str(exc), lib
    if count == 0:
        return "the runtime reports no NPU", lib
    return None, lib


def unavailable_reason(library=None):
    """Why the NPU backend cannot run here, or None when it can.

    Parameters
    ----------
    library : str, os.PathLike or AclnnLibrary, optional
        Where to look (see :func:`load_library`).

    Returns
    -------
    str or None
        For example that CANN was not found, that the aclnn engine's kernel
        path is missing (see :func:`kernel_path_problem`), that ``aclInit``
        failed, or that there is no device.
    """
    return _availability(library)[0]


def is_available(library=None):
    """Whether the NPU backend can run here.

    True when the CANN libraries load, every required entry point binds, the
    aclnn engine's kernel path exists (:func:`kernel_path_problem`),
    ``aclInit`` succeeds and the runtime reports at least one device (if it
    can report a count at all). Raises no exception. When CANN is found but
    cannot run, an :class:`AclnnWarning` gives the reason (so that
    ``backend="auto"`` says why it computes on the CPU).

    Parameters
    ----------
    library : str, os.PathLike or AclnnLibrary, optional
        Where to look (see :func:`load_library`).

    Returns
    -------
    bool
    """
    reason, found = _availability(library)
    if reason is not None and found is not None:
        warnings.warn(f"CANN found ({found._describe_paths()}) but the Ascend NPU backend cannot run: "
                      f"{reason}; backend='auto' computes on the CPU", AclnnWarning, stacklevel=2)
    return reason is None


def finalize(library=None):
    """Reset the devices this module set and undo its ``aclInit``.

    Only where this module's ``aclInit`` initialised ACL: when another owner
    (torch_npu) had, the devices and the ACL lifetime are that owner's and
    nothing is reset (see :meth:`AclnnLibrary.finalize`). Normally not
    needed: it runs at interpreter exit. Call it at most once per process on
    real hardware (CANN documents ``aclInit`` as once per process).

    Parameters
    ----------
    library : str, os.PathLike or AclnnLibrary, optional
        Which library; by default every one this module initialized.
    """
    if library is None:
        with _cache_lock:
            libraries = list(_initialized_libraries)
    else:
        libraries = [_resolve(library)]
    for lib in libraries:
        lib.finalize()
        with _cache_lock:
            if lib in _initialized_libraries:
                _initialized_libraries.remove(lib)


@atexit.register
def _finalize_at_exit():  # pragma: no cover - runs at interpreter exit
    try:
        finalize()
    except Exception:
        pass


# --------------------------------------------------------- one call's resources


def _contiguous_strides(shape):
    """Element strides of a C-contiguous array (as in the vendor's samples)."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


class _Call:
    """Owns every handle and device buffer of one aclnnLstmBackward call.

    ``close()`` releases them all, in a safe order, whatever happened: after
    synchronizing the stream if work was launched, the executor if lstmcy
    owns it (a repeatable one [exec]), tensor lists (which release their
    tensors [docs]), standalone tensors, bool arrays, device buffers and the
    stream.
    """

    _PLACEHOLDER_BYTES = 32  # an empty tensor still gets an aligned device pointer

    def __init__(self, lib):
        self.lib = lib
        self.stream = None
        self.buffers = []
        self.tensors = []
        self.lists = []
        self.bool_arrays = []
        self.executor = None
        self.owns_executor = False  # repeatable: released by close(), not by the second phase
        self.launched = False
        self.synchronized = False

    # -- creation --------------------------------------------------------
    def create_stream(self):
        stream = ctypes.c_void_p()
        self.lib.check(self.lib.aclrtCreateStream(ctypes.byref(stream)), "aclrtCreateStream")
        self.stream = stream.value

    def device_buffer(self, nbytes):
        ptr = ctypes.c_void_p()
        size = max(int(nbytes), 1)
        self.lib.check(self.lib.aclrtMalloc(ctypes.byref(ptr), size, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc")
        if not ptr.value:
            raise AclnnError("aclrtMalloc returned a NULL pointer", function="aclrtMalloc")
        self.buffers.append(ptr.value)
        return ptr.value

    def _tensor(self, shape, acl_dtype, fmt, data_ptr):
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        strides = (ctypes.c_int64 * max(len(shape), 1))(*_contiguous_strides(shape))
        handle = self.lib.aclCreateTensor(dims, len(shape), acl_dtype, strides, 0, fmt,
                                          dims, len(shape), data_ptr)
        if not handle:
            raise self.lib.null_handle("aclCreateTensor")
        self.tensors.append(handle)
        return handle

    def upload(self, array, acl_dtype, fmt):
        """Copy ``array`` (C-contiguous) to a new device buffer; return its tensor."""
        nbytes = array.nbytes
        device = self.device_buffer(nbytes if nbytes else self._PLACEHOLDER_BYTES)
        if nbytes:
            status = self.lib.aclrtMemcpy(device, nbytes, array.ctypes.data, nbytes, ACL_MEMCPY_HOST_TO_DEVICE)
            self.lib.check(status, "aclrtMemcpy")
        return self._tensor(array.shape, acl_dtype, fmt, device)

    def output(self, shape, dtype, fmt):
        """An uninitialized device tensor; return ``(tensor, device pointer, nbytes)``."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        device = self.device_buffer(nbytes if nbytes else self._PLACEHOLDER_BYTES)
        return self._tensor(shape, _NUMPY_TO_ACL[np.dtype(dtype)], fmt, device), device, nbytes

    def tensor_list(self, handles):
        array = (ctypes.c_void_p * len(handles))(*handles)
        handle = self.lib.aclCreateTensorList(array, len(handles))
        if not handle:
            raise self.lib.null_handle("aclCreateTensorList")
        # from now on the list owns its tensors [docs]
        owned = set(handles)
        self.tensors = [t for t in self.tensors if t not in owned]
        self.lists.append(handle)
        return handle

    def adopt_executor(self, executor):
        """Keep the first phase's executor, made repeatable at once where it can be.

        Only right after the first phase [exec]; a repeatable executor
        survives the second phase, failed or not, and ``close()`` destroys it
        (also when the call fails before the second phase). One the runtime
        refuses stays the runtime's: the second phase deletes it.
        """
        self.executor = executor
        lib = self.lib
        if lib.aclSetAclOpExecutorRepeatable is None or lib.aclDestroyAclOpExecutor is None:
            return
        if lib.aclSetAclOpExecutorRepeatable(executor) == 0:
            self.owns_executor = True
        else:
            lib.recent_error_message()  # not an error: the second phase releases it

    def run(self, workspace, workspace_size):
        """The second phase on the adopted executor; return its status."""
        self.launched = True
        executor = self.executor
        if not self.owns_executor:
            self.executor = None  # deleted by the second phase, whatever its result [exec]
        return self.lib.aclnnLstmBackward(workspace, workspace_size, executor, self.stream)

    def bool_array(self, values):
        array = (ctypes.c_bool * len(values))(*[bool(v) for v in values])
        handle = self.lib.aclCreateBoolArray(array, len(values))
        if not handle:
            raise self.lib.null_handle("aclCreateBoolArray")
        self.bool_arrays.append(handle)
        return handle

    def download(self, device, nbytes, shape, dtype):
        host = np.empty(shape, dtype=dtype)
        if nbytes:
            status = self.lib.aclrtMemcpy(host.ctypes.data, nbytes, device, nbytes, ACL_MEMCPY_DEVICE_TO_HOST)
            self.lib.check(status, "aclrtMemcpy")
        return host

    # -- release ---------------------------------------------------------
    def close(self):
        """Release everything; return the first release failure as an AclnnError (or None)."""
        lib = self.lib
        failures = []

        def attempt(function, status):
            if status != 0:
                failures.append((function, status, lib.recent_error_message()))

        if self.launched and not self.synchronized and self.stream is not None:
            # never free memory the device may still be using
            attempt("aclrtSynchronizeStream", lib.aclrtSynchronizeStream(self.stream))
        if self.executor is not None and self.owns_executor:
            attempt("aclDestroyAclOpExecutor", lib.aclDestroyAclOpExecutor(self.executor))
        # An executor the runtime would not make repeatable and whose second phase
        # never ran has no public release function [exec]: it stays allocated.
        self.executor = None
        for handle in self.lists:
            attempt("aclDestroyTensorList", lib.aclDestroyTensorList(handle))
        self.lists = []
        for handle in self.tensors:
            attempt("aclDestroyTensor", lib.aclDestroyTensor(handle))
        self.tensors = []
        for handle in self.bool_arrays:
            attempt("aclDestroyBoolArray", lib.aclDestroyBoolArray(handle))
        self.bool_arrays = []
        for ptr in self.buffers:
            attempt("aclrtFree", lib.aclrtFree(ptr))
        self.buffers = []
        if self.stream is not None:
            attempt("aclrtDestroyStream", lib.aclrtDestroyStream(self.stream))
            self.stream = None
        if failures:
            function, status, detail = failures[0]
            message = f"releasing NPU resources: {function} failed with {status_name(status)} ({status})"
            if detail:
                message += f": {detail}"
            if len(failures) > 1:
                message += f" (and {len(failures) - 1} more release failures)"
            return AclnnError(message, function=function, status=status, detail=detail)
        return None


# ------------------------------------------------------------- the public call


def unsupported_reason(dtype, *, dropout=0.0, train=True, num_layers=1):
    """Why the NPU operator cannot take a call with these settings, or None.

    Meant for ``backend="auto"``: when this returns a string, use the CPU.

    Parameters
    ----------
    dtype : numpy dtype-like
    dropout : float
    train : bool
    num_layers : int

    Returns
    -------
    str or None
    """
    dtype = np.dtype(dtype)
    if dtype not in _NUMPY_TO_ACL:
        return (f"aclnnLstmBackward supports float32 and float16 only, got {dtype} "
                "(use backend='cpu' for float64 or bfloat16)")
    if dropout and train and num_layers > 1:
        return ("aclnnLstmBackward takes no dropout masks, so with dropout > 0, train=True and "
                "num_layers > 1 its gradients would not match lstm_forward's masks; use backend='cpu'")
    return None


def _check_npu_dtype(dtype):
    """Raise TypeError unless ``dtype`` (the input's; None: not known yet) is one the NPU
    operator computes in."""
    if dtype is not None and dtype not in _NUMPY_TO_ACL:
        raise TypeError(f"backend='aclnn' supports float32 and float16 (the NPU operator's "
                        f"dtypes); input has dtype {dtype}")


def _host(array):
    """A C-contiguous copy (or view) of a checked array; never modifies the input."""
    return np.ascontiguousarray(array)


def _default_device():
    value = os.environ.get(ENV_DEVICE, "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${ENV_DEVICE} must be an integer device id, got {value!r}") from None


def lstm_backward(input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, *,
                  batch_sizes, has_bias, num_layers, dropout, train, bidirectional,
                  batch_first, output_mask, library=None, device_id=None):
    """LSTM backward on an Ascend NPU through CANN's ``aclnnLstmBackward``.

    Same arguments and results as :func:`lstmcy.lstm_backward` (which calls
    this for ``backend="aclnn"`` after validating its arguments), restricted
    to what the NPU operator supports: float32 or float16, and no dropout
    masks between layers.

    Parameters
    ----------
    input : ndarray
        ``[T, B, I]`` (``[B, T, I]`` if ``batch_first``), or 2-D when
        ``batch_sizes`` is given: ``sum(batch_sizes)`` rows (packed, as
        PyTorch's PackedSequence; padded to ``T * B`` rows for the device and
        packed again on return) or ``T * B`` rows (padded time-major).
    hx : tuple of ndarray
        ``(h0, c0)``, each ``[D * L, B, H]``.
    params : list of ndarray
        Per layer and direction ``w_ih, w_hh[, b_ih, b_hh]``.
    dy : ndarray
        Gradient of the output, laid out like the output.
    dh, dc : ndarray
        Gradients of ``h_n`` and ``c_n``, ``[D * L, B, H]``.
    i, g, f, o, h, c, tanhc : list of ndarray
        The forward's saved activations, ``D * L`` arrays ``[T, B, H]``.
    batch_sizes : ndarray or None
        Active sequences per step, int64 ``[T]``.
    has_bias, num_layers, dropout, train, bidirectional, batch_first
        As in :func:`lstmcy.lstm_backward`.
    output_mask : sequence of 4 bool
        Which of ``(dx, dh_prev, dc_prev, dparams)`` to return; the NPU
        computes all four regardless (the operator ignores the mask), masked
        ones are returned as None.
        A problem with an empty dimension (T, B, I or H = 0) is computed on
        the host by the CPU path: the operator accepts it but writes no output.
    library : str, os.PathLike or AclnnLibrary, optional
        Where CANN is (see :func:`load_library`).
    device_id : int, optional
        NPU to use; defaults to ``$LSTMCY_ACLNN_DEVICE`` or 0. Made current on
        the calling thread for the call only (see the module docstring).

    Returns
    -------
    dx : ndarray or None
        Shaped like ``input``.
    dh_prev, dc_prev : ndarray or None
        Shaped like ``hx[0]``.
    dparams : list of ndarray or None
        Shaped like ``params``.

    Raises
    ------
    TypeError
        For a dtype other than float32/float16, or mixed dtypes.
    ValueError
        For list lengths that do not match, or dropout masks the NPU
        operator cannot apply.
    AclnnLibraryNotFound
        If CANN is not installed or not found.
    AclnnError
        If the aclnn engine's kernel path is missing (see
        :func:`kernel_path_problem`; raised before any device work), or a
        CANN call fails: then it carries the status name and number and the
        runtime's own message, and every handle and device buffer is
        released, and the thread's previous device made current again,
        before it propagates.
    """
    if device_id is not None and (isinstance(device_id, (bool, np.bool_))
                                  or not isinstance(device_id, (int, np.integer))
                                  or device_id < 0):
        raise ValueError(f"device_id must be a non-negative int or None, got {device_id!r}")
    if not (library is None or isinstance(library, (str, bytes, os.PathLike, AclnnLibrary))):
        raise TypeError(f"library must be None, a path or an AclnnLibrary, got "
                        f"{type(library).__name__}")
    # What the NPU operator cannot compute is refused first, whatever else is wrong.
    dtype = getattr(input, "dtype", None)
    _check_npu_dtype(dtype)
    reason = None if dtype is None else unsupported_reason(dtype, dropout=dropout, train=train,
                                                           num_layers=num_layers)
    if reason is not None:
        raise ValueError(f"dropout: {reason}")
    if hx is None:
        raise ValueError("hx must be a tuple (h0, c0) (the NPU operator takes both)")
    if dh is None or dc is None:
        raise ValueError("dh and dc must be arrays [D*L, B, H] (the NPU operator takes both)")
    problem, arrays = check_backward(input, hx, params, dy, dh, dc, (i, g, f, o, h, c, tanhc),
                                     batch_sizes=batch_sizes, has_bias=has_bias,
                                     num_layers=num_layers, dropout=dropout, train=train,
                                     bidirectional=bidirectional, batch_first=batch_first,
                                     dropout_masks=None)
    return run_backward(problem, arrays, input, hx, params, dropout=dropout, train=train,
                        output_mask=check_output_mask(output_mask), library=library,
                        device_id=device_id)


def run_backward(problem, arrays, input, hx, params, *, dropout, train, output_mask,
                 library=None, device_id=None):
    """:func:`lstm_backward` of a checked call: ``problem, arrays`` as
    :func:`lstmcy._engine.validation.check_backward` returns them for ``input, hx, params``
    (which must be given: the NPU takes both states, and ``arrays`` both ``dh`` and ``dc``),
    ``output_mask`` a tuple of 4 bools. Raises for what the NPU operator cannot compute."""
    p = problem
    if p.projected:
        raise ValueError("backend='aclnn' has no projections: aclnnLstmBackward takes no "
                         f"w_hr (got proj_size={p.P}); use backend='cpu'")
    dtype = p.dtype
    _check_npu_dtype(dtype)
    reason = unsupported_reason(dtype, dropout=dropout, train=train, num_layers=p.L)
    if reason is not None:
        raise ValueError(f"dropout: {reason}")
    host, valid_rows = host_call(p, arrays, input, hx, params, dropout=dropout, train=train)
    has_bias, num_layers, _, _, bidirectional, batch_first = host.settings
    mask = output_mask
    lib = _resolve(library)
    device = _default_device() if device_id is None else device_id
    if _empty_problem(host.arrays()):
        # The operator would return at once and write no output [opsrc].
        from lstmcy._engine.plan import lstm_backward as cpu_backward

        return tuple(cpu_backward(
            input, hx, params, arrays["dy"], arrays["dh"], arrays["dc"],
            *(arrays[name] for name in SAVED_NAMES), batch_sizes=host.batch_sizes,
            has_bias=has_bias, num_layers=num_layers, dropout=dropout, train=train, bidirectional=bidirectional,
            batch_first=batch_first, output_mask=mask))
    missing = kernel_path_problem()
    if missing is not None:
        raise AclnnError(f"backend='aclnn': {missing}")
    dx, dh_prev, dc_prev, dparams = device_backward(lib, device, host, mask)
    if dx is not None and valid_rows is not None:
        dx = np.ascontiguousarray(dx[valid_rows])
    return dx, dh_prev, dc_prev, dparams


class HostCall(NamedTuple):
    """One call's arrays in host memory as the device takes them (C-contiguous, the
    input's dtype; packed rows padded to ``T*B``) and the operator's settings."""

    x: np.ndarray
    h0: np.ndarray
    c0: np.ndarray
    params: list
    dy: np.ndarray
    dh: np.ndarray
    dc: np.ndarray
    gates: list                 # the seven saved lists, SAVED_NAMES order
    batch_sizes: np.ndarray     # int64 [T], or None
    seq_format: int             # ACL_FORMAT_NCL (3-D), ACL_FORMAT_ND (2-D with batch_sizes)
    settings: tuple             # has_bias, num_layers, dropout, train, bidirectional, batch_first

    def arrays(self):
        return [self.x, self.h0, self.c0, self.dy, self.dh, self.dc, *self.params,
                *itertools.chain.from_iterable(self.gates)]


def host_call(problem, arrays, input, hx, params, *, dropout, train):
    """The :class:`HostCall` of a checked call (as :func:`run_backward` takes it) and, for
    packed input, the padded row of each packed row (else None)."""
    p = problem
    has_bias, num_layers, bidirectional = p.has_bias, p.L, p.D == 2
    batch_first = p.layout == "batch_first"
    x, h0, c0 = _host(input), _host(hx[0]), _host(hx[1])
    ps = [_host(a) for a in params]
    dy_h, dh_h, dc_h = _host(arrays["dy"]), _host(arrays["dh"]), _host(arrays["dc"])
    gates = [[_host(a) for a in arrays[name]] for name in SAVED_NAMES]

    # Sequence layout. Without batch_sizes the device takes [T,B,*] / [B,T,*] in
    # NCL; with batch_sizes it takes 2-D [T*B, *] (padded, time-major) in ND [opsrc].
    valid_rows = None
    bs_h = None
    seq_format = ACL_FORMAT_NCL
    if p.layout in ("packed", "padded_2d"):
        bs_h = np.ascontiguousarray(p.batch_sizes, dtype=np.int64)
        seq_format = ACL_FORMAT_ND
        padded_rows = p.T * p.B
        if p.layout == "packed":
            # packed -> padded time-major: valid_rows[k] is the padded row of packed row k
            active = np.arange(p.B)[None, :] < bs_h[:, None]
            valid_rows = np.flatnonzero(active.ravel())
            x = _pad_rows(x, valid_rows, padded_rows)
            dy_h = _pad_rows(dy_h, valid_rows, padded_rows)
    host = HostCall(x, h0, c0, ps, dy_h, dh_h, dc_h, gates, bs_h, seq_format,
                    (has_bias, num_layers, float(dropout), train, bidirectional, batch_first))
    return host, valid_rows


def device_backward(lib, device, host, mask):
    """``aclnnLstmBackward`` of ``host`` (a :class:`HostCall`) on NPU ``device`` through
    ``lib``: upload, run, download the outputs ``mask`` asks for, release every handle.
    No guard of lstmcy's runs here (empty problems, the kernel path): what the runtime
    does with the call is what this returns or raises."""
    x, h0, c0, ps = host.x, host.h0, host.c0, host.params
    dtype, seq_format = x.dtype, host.seq_format
    acl_dtype = _NUMPY_TO_ACL[dtype]
    has_bias, num_layers, dropout, train, bidirectional, batch_first = host.settings
    _ensure_initialized(lib)
    with lib.on_device(device):
        call = _Call(lib)
        try:
            call.create_stream()
            t_input = call.upload(x, acl_dtype, seq_format)
            l_hx = call.tensor_list([call.upload(h0, acl_dtype, ACL_FORMAT_NCL),
                                     call.upload(c0, acl_dtype, ACL_FORMAT_NCL)])
            l_params = call.tensor_list([call.upload(p, acl_dtype, ACL_FORMAT_ND) for p in ps])
            t_dy = call.upload(host.dy, acl_dtype, seq_format)
            t_dh = call.upload(host.dh, acl_dtype, ACL_FORMAT_NCL)
            t_dc = call.upload(host.dc, acl_dtype, ACL_FORMAT_NCL)
            l_gates = [call.tensor_list([call.upload(a, acl_dtype, ACL_FORMAT_NCL) for a in arrays])
                       for arrays in host.gates]
            t_bs = (call.upload(host.batch_sizes, ACL_INT64, ACL_FORMAT_ND)
                    if host.batch_sizes is not None else None)
            b_mask = call.bool_array(mask)
            t_dx, d_dx, n_dx = call.output(x.shape, dtype, seq_format)
            t_dhp, d_dhp, n_dhp = call.output(h0.shape, dtype, ACL_FORMAT_NCL)
            t_dcp, d_dcp, n_dcp = call.output(c0.shape, dtype, ACL_FORMAT_NCL)
            dparam_out = [call.output(p.shape, dtype, ACL_FORMAT_ND) for p in ps]
            l_dparams = call.tensor_list([t for t, _, _ in dparam_out])

            workspace_size = ctypes.c_uint64(0)
            executor = ctypes.c_void_p()
            status = lib.aclnnLstmBackwardGetWorkspaceSize(
                t_input, l_hx, l_params, t_dy, t_dh, t_dc, *l_gates, t_bs,
                bool(has_bias), num_layers, float(dropout), bool(train), bool(bidirectional), bool(batch_first),
                b_mask, t_dx, t_dhp, t_dcp, l_dparams, ctypes.byref(workspace_size), ctypes.byref(executor))
            lib.check(status, "aclnnLstmBackwardGetWorkspaceSize")
            call.adopt_executor(executor.value)
            workspace = call.device_buffer(workspace_size.value) if workspace_size.value else None
            lib.check(call.run(workspace, workspace_size.value), "aclnnLstmBackward")
            status = lib.aclrtSynchronizeStream(call.stream)
            call.synchronized = True
            lib.check(status, "aclrtSynchronizeStream")

            dx = call.download(d_dx, n_dx, x.shape, dtype) if mask[0] else None
            dh_prev = call.download(d_dhp, n_dhp, h0.shape, dtype) if mask[1] else None
            dc_prev = call.download(d_dcp, n_dcp, c0.shape, dtype) if mask[2] else None
            dparams = ([call.download(d, n, p.shape, dtype) for (_, d, n), p in zip(dparam_out, ps)]
                       if mask[3] else None)
        except BaseException:
            call.close()  # the original error wins over any release failure
            raise
        release_error = call.close()
        if release_error is not None:
            raise release_error

    return dx, dh_prev, dc_prev, dparams


def _empty_problem(arrays):
    """Whether the operator's ``EmptyCheck`` would skip the call (a tensor without elements) [opsrc]."""
    return any(a.size == 0 for a in arrays)


def _pad_rows(packed, valid_rows, padded_rows):
    out = np.zeros((padded_rows,) + packed.shape[1:], dtype=packed.dtype)
    out[valid_rows] = packed
    return out
