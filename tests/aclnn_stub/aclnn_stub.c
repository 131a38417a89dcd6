/*
 * aclnn_stub.c -- a host-memory stand-in for the parts of Huawei CANN that
 * lstmcy.aclnn binds (libascendcl.so, libnnopbase.so, libopapi.so).
 *
 * It exists only for tests: tests/test_aclnn.py compiles it with
 *     cc -shared -fPIC -o libaclnn_stub.so aclnn_stub.c
 * and points lstmcy.aclnn at the result.  It proves the *binding* (symbol
 * names, argument order and types, enum values) and the *marshalling*
 * (shapes, strides, dtypes, formats, list order, scalars, workspace, data in
 * both directions, handle and buffer lifetimes).  It does NOT compute an LSTM
 * gradient; numerics on real hardware are not tested by it.
 *
 * Exported functions carry the exact C signatures of the vendor's public
 * headers (see the comments in lstmcy/aclnn.py for the sources):
 *   acl/acl.h, acl/acl_rt.h, acl/acl_base_rt.h (hicann/runtime)
 *   aclnn/acl_meta.h                          (hicann/opbase)
 *   aclnnop/aclnn_lstm_backward.h             (hicann/ops-nn, documented in
 *       rnn/single_layer_lstm_grad/docs/aclnnLstmBackward.md)
 *
 * "Device" memory is host memory from posix_memalign, tracked in a table so
 * that every pointer handed to aclCreateTensor, aclrtMemcpy, aclrtFree and
 * aclnnLstmBackward can be checked.  New allocations are filled with the
 * poison byte 0xAB (STUB_POISON) so that an output nobody wrote, or one read
 * before the kernel ran, shows up as garbage.
 *
 * The runtime behaviour lstmcy depends on, modelled after the vendor's
 * sources (each function cites its own):
 *   - devices: aclrtSetDevice makes the device's default context the calling
 *     thread's current one, per thread, with up to MAX_DEVICES devices
 *     (LSTMCY_STUB_DEVICES); aclrtGetDevice / aclrtGetCurrentContext report
 *     it and fail without one; aclrtSetCurrentContext switches back.  Memory
 *     and streams belong to the current context's device; a launch on, or
 *     the destruction of, a stream of another context fails
 *     (errors.stream_context); a kernel whose tensors live on another device
 *     than its stream is flagged (errors.cross_device).
 *   - aclrtResetDevice releases the device's default context and its streams
 *     at once, whoever set it (acl_rt.h); aclFinalize releases them all.
 *     aclInit by another owner first makes lstmcy's aclInit return
 *     ACL_ERROR_REPEAT_INITIALIZE.
 *   - the first phase's EmptyCheck: a tensor without elements gives success,
 *     workspace 0 and an executor that writes no output.
 *   - kernels are found through $ASCEND_HOME_PATH/opp_latest or
 *     $ASCEND_OPP_PATH; without either the first phase of a non-empty
 *     problem fails.
 *   - executors: aclSetAclOpExecutorRepeatable only right after the first
 *     phase, on the same thread (errors.repeatable_late otherwise); the
 *     second phase releases a non-repeatable executor, failed or not, and
 *     keeps a repeatable one for aclDestroyAclOpExecutor.
 *
 * Validation done by aclnnLstmBackwardGetWorkspaceSize mirrors the public op
 * (rnn/single_layer_lstm_grad/op_api/aclnn_lstm_backward.cpp in ops-nn):
 *   - null required tensors/lists           -> 161001 ACLNN_ERR_PARAM_NULLPTR
 *   - list lengths (hx 2, gates D*L, params D*(2|4)*L, dparams like params),
 *     dtypes (FLOAT/FLOAT16, all equal; batchSizes INT64),
 *     ranks (input/dy/dx 2-D with batchSizes, else 3-D),
 *     formats (input/dy/dx NCL, or ND with batchSizes; hx, dh, dc, dhPrev,
 *     dcPrev and the seven gate lists NCL; params, dparams, batchSizes ND)
 *                                            -> 161002 ACLNN_ERR_PARAM_INVALID
 *
 * Streams are modelled as asynchronous: from aclnnLstmBackward (successful
 * or not) until aclrtSynchronizeStream the stream has pending work, and
 * aclrtFree or a device-to-host aclrtMemcpy in that window is flagged
 * ("errors.free_while_pending", "errors.read_before_sync").
 *
 * Deterministic "kernel" (run by aclnnLstmBackward).  Elements are visited in
 * C order of each tensor's view shape, read and written through its strides
 * and offset, computed in double and stored in the tensor's dtype
 * (double -> float, then float -> half with round-to-nearest-even):
 *   dxOut[k]          = 2 * input[k] + 1
 *   dhPrevOut[k]      = hx[0][k] + 10 * dh[k]
 *   dcPrevOut[k]      = hx[1][k] + 10 * dc[k]
 *   dparamsOut[j][k]  = params[j][k] + 0.5 * (j + 1)
 * and for every input tensor it logs two checksums, sum_k x[k] and
 * sum_k (k + 1) * x[k] (the second one changes under any permutation).
 *
 * Test-only exports (prefix stub_):
 *   void        stub_reset(void)            forget everything, re-read env
 *   long long   stub_counter(const char *)   named counters, 0 if never set
 *   const char *stub_get_log(void)          JSON array of recorded calls
 *   void        stub_set_fail(const char *fn, int status, long long nth)
 *               make the nth call (1-based; 0 = every call) of fn fail with
 *               status (functions returning a handle return NULL instead)
 *   void        stub_clear_fail(void)
 *   void        stub_set_workspace_size(unsigned long long)
 *   void        stub_set_device_count(int)
 * Environment (read at load and by stub_reset):
 *   LSTMCY_STUB_FAIL="fn:status[:nth][,fn:status[:nth]...]"
 *   LSTMCY_STUB_WORKSPACE=<bytes>   (default 4096)
 *   LSTMCY_STUB_DEVICES=<count>     (default 1)
 *
 * Counter names: "calls.<function>", "tensors.created", "tensors.destroyed",
 * "tensors.destroyed_via_list", "lists.created", "lists.destroyed",
 * "boolarrays.created", "boolarrays.destroyed", "mem.mallocs", "mem.frees",
 * "mem.live_bytes", "mem.malloc_bytes", "streams.created",
 * "streams.destroyed", "executors.created", "executors.released",
 * "memcpy.h2d", "memcpy.d2h", "memcpy.other", "acl.inits", "acl.finalizes",
 * "acl.initialized", "device.sets", "device.resets", "device.contexts_created",
 * "context.sets", "streams.orphaned_use", "kernel.runs", and
 * "errors.<kind>" for every misuse detected (double destroy, bad free,
 * out-of-bounds copy, use after destroy, ...).  A correct caller leaves
 * every "errors.*" counter at 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- status codes (acl_base_rt.h, rt_error_codes.h, aclnn return codes) */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_CONTEXT 107003
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_MEMORY_FREE 207002
#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_INNER 561000
#define ACLNN_ERR_INNER_NULLPTR 561103
#define ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND 561107

/* ---- enum values (acl_base_rt.h, acl_rt.h) */
#define ACL_FLOAT 0
#define ACL_FLOAT16 1
#define ACL_INT64 9
#define ACL_DOUBLE 11
#define ACL_FORMAT_ND 2
#define ACL_FORMAT_NCL 47
#define ACL_MEMCPY_HOST_TO_DEVICE 1
#define ACL_MEMCPY_DEVICE_TO_HOST 2

typedef int aclError;
typedef int32_t aclnnStatus;
typedef void *aclrtStream;
typedef int aclDataType;
typedef int aclFormat;
typedef int aclrtMemcpyKind;
typedef int aclrtMemMallocPolicy;

#define MAX_DIMS 8
#define STUB_POISON 0xAB /* every byte of a new device allocation */
#define MAGIC_TENSOR 0x7e450001
#define MAGIC_LIST 0x7e450002
#define MAGIC_BOOLS 0x7e450003
#define MAGIC_EXEC 0x7e450004
#define MAGIC_STREAM 0x7e450005
#define MAGIC_CONTEXT 0x7e450006
#define MAX_DEVICES 16

typedef struct aclTensor {
    int magic;
    int id;
    int live;
    int owned;              /* 1 while a live list owns it */
    uint64_t ndim;
    int64_t dims[MAX_DIMS];
    int64_t strides[MAX_DIMS];
    int64_t offset;
    uint64_t sndim;
    int64_t sdims[MAX_DIMS];
    int dtype;
    int format;
    void *data;
} aclTensor;

typedef struct aclTensorList {
    int magic;
    int id;
    int live;
    uint64_t n;
    aclTensor **items;
} aclTensorList;

typedef struct aclBoolArray {
    int magic;
    int live;
    uint64_t n;
    bool *v;
} aclBoolArray;

typedef struct aclOpExecutor {
    int magic;
    int live;
    int repeatable;
    int empty;              /* planned by the EmptyCheck early return: nothing to run */
    int device;             /* current device of the thread that planned it */
    uint64_t workspace_size;
    const aclTensor *input, *dy, *dh, *dc, *batch_sizes, *dx, *dh_prev, *dc_prev;
    const aclTensorList *hx, *params, *gates[7], *dparams;
} aclOpExecutor;

/* A device's default context, made by aclrtSetDevice (acl_rt.h; api_impl.cc
   ApiImpl::SetDevice retains the primary context and makes it the thread's
   current one).  Released by aclrtResetDevice or aclFinalize. */
typedef struct StubContext {
    int magic;
    int live;
    int device;
} StubContext;

typedef struct StubStream {
    int magic;
    int live;
    int pending;            /* work launched and not yet synchronized */
    StubContext *ctx;       /* the context current when it was created */
} StubStream;

/* ------------------------------------------------------------------ state */

typedef struct { char name[96]; long long value; } Counter;
typedef struct { void *p; size_t size; int live; int device; } Alloc;
typedef struct { char name[96]; int status; long long nth; } Failure;

static Counter g_counters[256];
static int g_ncounters;
static Alloc *g_allocs;
static size_t g_nallocs, g_cap_allocs;
static void **g_objects;          /* every struct ever handed out */
static size_t g_nobjects, g_cap_objects;
static Failure g_fail[16];
static int g_nfail;
static char *g_log;
static size_t g_log_len, g_log_cap;
static int g_log_entries;
static char g_errmsg[512];
static unsigned long long g_workspace_size = 4096;
static int g_device_count = 1;
static int g_initialized;
static StubContext *g_primary[MAX_DEVICES]; /* each device's live default context, or NULL */
static long long g_epoch = 1;               /* bumped by stub_reset: older thread state is void */
/* The calling thread's current context (the runtime keeps it per thread:
   InnerThreadLocalContainer::SetCurRef in api_impl.cc). */
static __thread StubContext *t_ctx;
static __thread long long t_ctx_epoch;
/* The executor the calling thread's latest first phase returned, until the
   thread's next runtime call: aclSetAclOpExecutorRepeatable is only valid
   then (aclSetAclOpExecutorRepeatable.md: "immediately" after the first
   phase; op_executor.cpp SetRepeatable reads the thread's state of its latest
   first phase). */
static __thread aclOpExecutor *t_planned;
static __thread long long t_planned_epoch;
static int g_next_id = 1;
static int g_pending_streams;   /* streams with launched, unsynchronized work */

static long long *counter_slot(const char *name)
{
    for (int k = 0; k < g_ncounters; ++k)
        if (strcmp(g_counters[k].name, name) == 0) return &g_counters[k].value;
    if (g_ncounters == (int)(sizeof g_counters / sizeof g_counters[0])) return NULL;
    snprintf(g_counters[g_ncounters].name, sizeof g_counters[0].name, "%s", name);
    g_counters[g_ncounters].value = 0;
    return &g_counters[g_ncounters++].value;
}

static long long bump(const char *name, long long by)
{
    long long *slot = counter_slot(name);
    if (!slot) return 0;
    *slot += by;
    return *slot;
}

static void set_errmsg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
}

static void misuse(const char *kind, const char *detail)
{
    char name[96];
    snprintf(name, sizeof name, "errors.%s", kind);
    bump(name, 1);
    set_errmsg("stub: misuse (%s): %s", kind, detail);
}

static void *track(void *p)
{
    if (!p) return NULL;
    if (g_nobjects == g_cap_objects) {
        size_t cap = g_cap_objects ? 2 * g_cap_objects : 256;
        void **grown = realloc(g_objects, cap * sizeof *grown);
        if (!grown) return p;
        g_objects = grown;
        g_cap_objects = cap;
    }
    g_objects[g_nobjects++] = p;
    return p;
}

static StubContext *current_ctx(void)
{
    if (t_ctx_epoch != g_epoch) {
        t_ctx = NULL;
        t_ctx_epoch = g_epoch;
    }
    return (t_ctx && t_ctx->live) ? t_ctx : NULL;
}

/* Count the call; return the injected status (0 = succeed). */
static int enter(const char *fn)
{
    if (strcmp(fn, "aclSetAclOpExecutorRepeatable") != 0) t_planned = NULL;
    char name[128];
    snprintf(name, sizeof name, "calls.%s", fn);
    long long n = bump(name, 1);
    for (int k = 0; k < g_nfail; ++k) {
        if (strcmp(g_fail[k].name, fn) == 0 && (g_fail[k].nth == 0 || g_fail[k].nth == n)) {
            set_errmsg("stub: injected failure of %s (call %lld) with status %d", fn, n,
                       g_fail[k].status);
            bump("injected.hits", 1);
            return g_fail[k].status;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- the log */

static void log_append(const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        size_t room = g_log_cap - g_log_len;
        va_start(ap, fmt);
        int need = vsnprintf(g_log ? g_log + g_log_len : NULL, g_log ? room : 0, fmt, ap);
        va_end(ap);
        if (need < 0) return;
        if (g_log && (size_t)need < room) {
            g_log_len += (size_t)need;
            return;
        }
        size_t cap = g_log_cap ? g_log_cap : 4096;
        while (cap < g_log_len + (size_t)need + 1) cap *= 2;
        char *grown = realloc(g_log, cap);
        if (!grown) return;
        g_log = grown;
        g_log_cap = cap;
    }
}

static void log_begin_entry(const char *call)
{
    if (!g_log) log_append("[");
    else if (g_log_len > 0 && g_log[g_log_len - 1] == ']') g_log_len--; /* reopen */
    log_append("%s{\"call\": \"%s\"", g_log_entries ? ", " : "", call);
    g_log_entries++;
}

static void log_end_entry(void) { log_append("}]"); }

static void log_double(double v)
{
    if (v != v) log_append("NaN");
    else if (v > 1.7976931348623157e308) log_append("Infinity");
    else if (v < -1.7976931348623157e308) log_append("-Infinity");
    else log_append("%.17g", v);
}

/* ------------------------------------------------------------ allocations */

static Alloc *find_alloc(const void *p, size_t need, int *inside)
{
    const char *c = (const char *)p;
    for (size_t k = 0; k < g_nallocs; ++k) {
        Alloc *a = &g_allocs[k];
        if (!a->live) continue;
        const char *base = (const char *)a->p;
        if (c >= base && c <= base + a->size) {
            *inside = (size_t)(c - base) + need <= a->size;
            return a;
        }
    }
    *inside = 0;
    return NULL;
}

static Alloc *exact_alloc(const void *p)
{
    for (size_t k = 0; k < g_nallocs; ++k)
        if (g_allocs[k].live && g_allocs[k].p == p) return &g_allocs[k];
    return NULL;
}

/* ------------------------------------------------------- half <-> float */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            float f = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24, exact */
            return sign ? -f : f;
        }
    } else if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t hm = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (hm & 1u))) hm++;
        return (uint16_t)(sign | hm);
    }
    uint32_t hm = mant >> 13;
    uint32_t rem = mant & 0x1fffu;
    uint32_t h = sign | ((uint32_t)e << 10) | hm;
    if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) h++;
    return (uint16_t)h;
}

/* ------------------------------------------------------- tensor access */

static size_t dtype_size(int dtype)
{
    switch (dtype) {
    case ACL_FLOAT: return 4;
    case ACL_FLOAT16: return 2;
    case ACL_INT64: return 8;
    case ACL_DOUBLE: return 8;
    default: return 0;
    }
}

static int64_t numel(const aclTensor *t)
{
    int64_t n = 1;
    for (uint64_t d = 0; d < t->ndim; ++d) n *= t->dims[d];
    return n;
}

/* element offset (in elements) of the flat C-order index k of the view */
static int64_t elem_offset(const aclTensor *t, int64_t k)
{
    int64_t off = t->offset;
    for (int64_t d = (int64_t)t->ndim - 1; d >= 0; --d) {
        int64_t idx = k % t->dims[d];
        k /= t->dims[d];
        off += idx * t->strides[d];
    }
    return off;
}

static double read_elem(const aclTensor *t, int64_t k)
{
    const char *base = (const char *)t->data + elem_offset(t, k) * (int64_t)dtype_size(t->dtype);
    switch (t->dtype) {
    case ACL_FLOAT: { float v; memcpy(&v, base, 4); return v; }
    case ACL_FLOAT16: { uint16_t v; memcpy(&v, base, 2); return f16_to_f32(v); }
    case ACL_INT64: { int64_t v; memcpy(&v, base, 8); return (double)v; }
    case ACL_DOUBLE: { double v; memcpy(&v, base, 8); return v; }
    default: return 0.0;
    }
}

static void write_elem(const aclTensor *t, int64_t k, double value)
{
    char *base = (char *)t->data + elem_offset(t, k) * (int64_t)dtype_size(t->dtype);
    switch (t->dtype) {
    case ACL_FLOAT: { float v = (float)value; memcpy(base, &v, 4); break; }
    case ACL_FLOAT16: { uint16_t v = f32_to_f16((float)value); memcpy(base, &v, 2); break; }
    case ACL_DOUBLE: { memcpy(base, &value, 8); break; }
    default: break;
    }
}

/* bytes spanned by the view, from its first element */
static size_t view_extent_bytes(const aclTensor *t)
{
    int64_t n = numel(t);
    if (n == 0) return 0;
    int64_t last = t->offset;
    for (uint64_t d = 0; d < t->ndim; ++d) last += (t->dims[d] - 1) * t->strides[d];
    return (size_t)(last + 1) * dtype_size(t->dtype);
}

static int tensor_ok(const aclTensor *t)
{
    return t && t->magic == MAGIC_TENSOR && t->live;
}

static int list_ok(const aclTensorList *l)
{
    if (!l || l->magic != MAGIC_LIST || !l->live) return 0;
    for (uint64_t k = 0; k < l->n; ++k)
        if (!tensor_ok(l->items[k])) return 0;
    return 1;
}

static void log_tensor(const aclTensor *t)
{
    if (!t) { log_append("null"); return; }
    log_append("{\"id\": %d, \"shape\": [", t->id);
    for (uint64_t d = 0; d < t->ndim; ++d) log_append("%s%lld", d ? ", " : "", (long long)t->dims[d]);
    log_append("], \"strides\": [");
    for (uint64_t d = 0; d < t->ndim; ++d) log_append("%s%lld", d ? ", " : "", (long long)t->strides[d]);
    log_append("], \"storage_shape\": [");
    for (uint64_t d = 0; d < t->sndim; ++d) log_append("%s%lld", d ? ", " : "", (long long)t->sdims[d]);
    log_append("], \"offset\": %lld, \"dtype\": %d, \"format\": %d, \"data\": %llu}",
               (long long)t->offset, t->dtype, t->format, (unsigned long long)(uintptr_t)t->data);
}

static void log_list(const aclTensorList *l)
{
    if (!l) { log_append("null"); return; }
    log_append("[");
    for (uint64_t k = 0; k < l->n; ++k) {
        if (k) log_append(", ");
        log_tensor(l->items[k]);
    }
    log_append("]");
}

static void log_checksum(const aclTensor *t)
{
    if (!t) { log_append("null"); return; }
    double sum = 0.0, wsum = 0.0;
    int64_t n = numel(t);
    if (t->data)
        for (int64_t k = 0; k < n; ++k) {
            double v = read_elem(t, k);
            sum += v;
            wsum += (double)(k + 1) * v;
        }
    log_append("{\"n\": %lld, \"sum\": ", (long long)n);
    log_double(sum);
    log_append(", \"wsum\": ");
    log_double(wsum);
    log_append("}");
}

static void log_list_checksums(const aclTensorList *l)
{
    if (!l) { log_append("null"); return; }
    log_append("[");
    for (uint64_t k = 0; k < l->n; ++k) {
        if (k) log_append(", ");
        log_checksum(l->items[k]);
    }
    log_append("]");
}

/* ------------------------------------------------------------- test API */

static void parse_env(void)
{
    const char *ws = getenv("LSTMCY_STUB_WORKSPACE");
    if (ws && *ws) g_workspace_size = strtoull(ws, NULL, 10);
    const char *dev = getenv("LSTMCY_STUB_DEVICES");
    if (dev && *dev) g_device_count = atoi(dev);
    const char *spec = getenv("LSTMCY_STUB_FAIL");
    if (spec && *spec) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", spec);
        char *save = NULL;
        for (char *item = strtok_r(buf, ",", &save); item && g_nfail < 16;
             item = strtok_r(NULL, ",", &save)) {
            char *colon = strchr(item, ':');
            if (!colon) continue;
            *colon = '\0';
            Failure *f = &g_fail[g_nfail++];
            snprintf(f->name, sizeof f->name, "%s", item);
            char *rest = colon + 1;
            f->status = (int)strtol(rest, &rest, 10);
            f->nth = (*rest == ':') ? strtoll(rest + 1, NULL, 10) : 0;
        }
    }
}

EXPORT void stub_reset(void)
{
    for (size_t k = 0; k < g_nobjects; ++k) free(g_objects[k]);
    free(g_objects);
    g_objects = NULL;
    g_nobjects = g_cap_objects = 0;
    for (size_t k = 0; k < g_nallocs; ++k)
        if (g_allocs[k].live) free(g_allocs[k].p);
    free(g_allocs);
    g_allocs = NULL;
    g_nallocs = g_cap_allocs = 0;
    free(g_log);
    g_log = NULL;
    g_log_len = g_log_cap = 0;
    g_log_entries = 0;
    g_ncounters = 0;
    g_nfail = 0;
    g_errmsg[0] = '\0';
    g_workspace_size = 4096;
    g_device_count = 1;
    g_initialized = 0;
    memset(g_primary, 0, sizeof g_primary); /* the contexts themselves are tracked objects */
    g_epoch++;
    g_next_id = 1;
    g_pending_streams = 0;
    parse_env();
}

__attribute__((constructor)) static void stub_load(void) { parse_env(); }

EXPORT long long stub_counter(const char *name)
{
    for (int k = 0; k < g_ncounters; ++k)
        if (strcmp(g_counters[k].name, name) == 0) return g_counters[k].value;
    return 0;
}

/* newline-separated "name=value" lines, for listing every counter */
EXPORT const char *stub_counters(void)
{
    static char *buf;
    static size_t cap;
    size_t need = 1;
    for (int k = 0; k < g_ncounters; ++k) need += strlen(g_counters[k].name) + 24;
    if (need > cap) {
        char *grown = realloc(buf, need);
        if (!grown) return "";
        buf = grown;
        cap = need;
    }
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < g_ncounters; ++k)
        len += (size_t)snprintf(buf + len, cap - len, "%s=%lld\n", g_counters[k].name, g_counters[k].value);
    return buf;
}

EXPORT const char *stub_get_log(void) { return g_log ? g_log : "[]"; }

EXPORT void stub_set_fail(const char *fn, int status, long long nth)
{
    if (g_nfail == 16) return;
    Failure *f = &g_fail[g_nfail++];
    snprintf(f->name, sizeof f->name, "%s", fn);
    f->status = status;
    f->nth = nth;
}

EXPORT void stub_clear_fail(void) { g_nfail = 0; }
EXPORT void stub_set_workspace_size(unsigned long long bytes) { g_workspace_size = bytes; }
EXPORT void stub_set_device_count(int count) { g_device_count = count; }

/* ------------------------------------------------ acl/acl.h, acl_rt.h */

EXPORT aclError aclInit(const char *configPath)
{
    int st = enter("aclInit");
    if (st) return st;
    bump("acl.inits", 1);
    if (configPath) bump("acl.init_with_config", 1);
    if (g_initialized) {
        set_errmsg("stub: aclInit called twice");
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    g_initialized = 1;
    *counter_slot("acl.initialized") = 1;
    return ACL_SUCCESS;
}

EXPORT aclError aclFinalize(void)
{
    int st = enter("aclFinalize");
    if (st) return st;
    bump("acl.finalizes", 1);
    if (!g_initialized) {
        set_errmsg("stub: aclFinalize without aclInit");
        return ACL_ERROR_REPEAT_FINALIZE;
    }
    g_initialized = 0;
    for (int d = 0; d < MAX_DEVICES; ++d) /* finalizing resets every device */
        if (g_primary[d]) {
            g_primary[d]->live = 0;
            g_primary[d] = NULL;
        }
    *counter_slot("acl.initialized") = 0;
    return ACL_SUCCESS;
}

EXPORT const char *aclGetRecentErrMsg(void)
{
    bump("calls.aclGetRecentErrMsg", 1);
    return g_errmsg[0] ? g_errmsg : NULL;
}

EXPORT aclError aclrtGetDeviceCount(uint32_t *count)
{
    int st = enter("aclrtGetDeviceCount");
    if (st) return st;
    if (!count) return ACL_ERROR_INVALID_PARAM;
    *count = (uint32_t)(g_device_count < 0 ? 0 : g_device_count);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    int st = enter("aclrtSetDevice");
    if (st) return st;
    if (!g_initialized) {
        misuse("device_before_init", "aclrtSetDevice before aclInit");
        return ACL_ERROR_UNINITIALIZE;
    }
    if (deviceId < 0 || deviceId >= g_device_count || deviceId >= MAX_DEVICES) {
        set_errmsg("stub: no device %d (have %d)", deviceId, g_device_count);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    /* the device's default context, made on first use, becomes the thread's
       current one: this is how a thread switches device */
    if (!g_primary[deviceId]) {
        StubContext *c = track(calloc(1, sizeof *c));
        if (!c) return ACL_ERROR_RT_MEMORY_ALLOCATION;
        c->magic = MAGIC_CONTEXT;
        c->live = 1;
        c->device = deviceId;
        g_primary[deviceId] = c;
        bump("device.contexts_created", 1);
    }
    current_ctx();
    t_ctx = g_primary[deviceId];
    bump("device.sets", 1);
    *counter_slot("device.last") = deviceId;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetDevice(int32_t *deviceId)
{
    int st = enter("aclrtGetDevice");
    if (st) return st;
    if (!deviceId) return ACL_ERROR_INVALID_PARAM;
    StubContext *c = current_ctx();
    if (!c) return ACL_ERROR_RT_CONTEXT_NULL; /* no current context; not logged (api_c_device.cc) */
    *deviceId = c->device;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetCurrentContext(void **context)
{
    int st = enter("aclrtGetCurrentContext");
    if (st) return st;
    if (!context) return ACL_ERROR_INVALID_PARAM;
    StubContext *c = current_ctx();
    if (!c) {
        set_errmsg("stub: the thread has no current context");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    *context = c;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtSetCurrentContext(void *context)
{
    int st = enter("aclrtSetCurrentContext");
    if (st) return st;
    StubContext *c = context;
    if (!c || c->magic != MAGIC_CONTEXT || !c->live) {
        misuse("bad_context", "aclrtSetCurrentContext with an unknown or released context");
        return ACL_ERROR_INVALID_PARAM;
    }
    current_ctx();
    t_ctx = c;
    bump("context.sets", 1);
    return ACL_SUCCESS;
}

/* As acl_rt.h documents: one reset releases the device's default context and
   every stream in it, however many times the device was set and by whom.
   (The runtime's own implementation counts references, runtime.cc
   PrimaryContextRelease; a caller cannot rely on that.) */
EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    int st = enter("aclrtResetDevice");
    if (st) return st;
    if (deviceId < 0 || deviceId >= MAX_DEVICES) {
        set_errmsg("stub: no device %d", deviceId);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    bump("device.resets", 1);
    if (g_primary[deviceId]) {
        g_primary[deviceId]->live = 0;
        g_primary[deviceId] = NULL;
    }
    return ACL_SUCCESS;
}

EXPORT aclError aclrtCreateStream(aclrtStream *stream)
{
    int st = enter("aclrtCreateStream");
    if (st) return st;
    if (!stream) return ACL_ERROR_INVALID_PARAM;
    StubContext *c = current_ctx();
    if (!c) {
        misuse("stream_without_device", "aclrtCreateStream without a current device on this thread");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    StubStream *s = track(calloc(1, sizeof *s));
    if (!s) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    s->magic = MAGIC_STREAM;
    s->live = 1;
    s->ctx = c;
    *stream = s;
    bump("streams.created", 1);
    return ACL_SUCCESS;
}

static int stream_ok(aclrtStream stream)
{
    StubStream *s = (StubStream *)stream;
    return s && s->magic == MAGIC_STREAM && s->live && s->ctx->live;
}

/* Launching on, or destroying, a stream of another context than the thread's
   current one fails (api_impl.cc: RT_ERROR_STREAM_CONTEXT). */
static int stream_in_current_context(aclrtStream stream, const char *what)
{
    if (((StubStream *)stream)->ctx == current_ctx()) return 1;
    misuse("stream_context", what);
    return 0;
}

EXPORT aclError aclrtSynchronizeStream(aclrtStream stream)
{
    /* even a failed synchronization means the stream's work is over */
    if (stream_ok(stream) && ((StubStream *)stream)->pending) {
        ((StubStream *)stream)->pending = 0;
        g_pending_streams--;
    }
    int st = enter("aclrtSynchronizeStream");
    if (st) return st;
    StubStream *s = (StubStream *)stream;
    if (s && s->magic == MAGIC_STREAM && s->live && !s->ctx->live) {
        /* its context was released (aclrtResetDevice, aclFinalize) under its owner */
        set_errmsg("stub: the stream's context was released by aclrtResetDevice or aclFinalize");
        bump("streams.orphaned_use", 1);
        return ACL_ERROR_RT_STREAM_CONTEXT;
    }
    if (!stream_ok(stream)) {
        misuse("bad_stream", "aclrtSynchronizeStream on an unknown stream");
        return ACL_ERROR_INVALID_PARAM;
    }
    bump("streams.synchronized", 1);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtDestroyStream(aclrtStream stream)
{
    int st = enter("aclrtDestroyStream");
    if (st) return st;
    if (!stream_ok(stream)) {
        misuse("bad_stream", "aclrtDestroyStream on an unknown or destroyed stream");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!stream_in_current_context(stream, "aclrtDestroyStream of a stream of another context"))
        return ACL_ERROR_RT_STREAM_CONTEXT;
    if (((StubStream *)stream)->pending) { /* real CANN waits for the work first */
        ((StubStream *)stream)->pending = 0;
        g_pending_streams--;
    }
    ((StubStream *)stream)->live = 0;
    bump("streams.destroyed", 1);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    int st = enter("aclrtMalloc");
    if (st) return st;
    if (!devPtr) return ACL_ERROR_INVALID_PARAM;
    StubContext *c = current_ctx();
    if (!c) { /* memory belongs to the current context's device */
        misuse("malloc_without_device", "aclrtMalloc without a current device on this thread");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    if (size == 0) { /* documented: size must not be 0 */
        misuse("malloc_zero", "aclrtMalloc with size 0");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (policy != 0) bump("mem.non_default_policy", 1);
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    memset(p, STUB_POISON, size); /* what an output never written reads back as */
    if (g_nallocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? 2 * g_cap_allocs : 256;
        Alloc *grown = realloc(g_allocs, cap * sizeof *grown);
        if (!grown) { free(p); return ACL_ERROR_RT_MEMORY_ALLOCATION; }
        g_allocs = grown;
        g_cap_allocs = cap;
    }
    g_allocs[g_nallocs].p = p;
    g_allocs[g_nallocs].size = size;
    g_allocs[g_nallocs].live = 1;
    g_allocs[g_nallocs].device = c->device;
    g_nallocs++;
    *devPtr = p;
    bump("mem.mallocs", 1);
    bump("mem.malloc_bytes", (long long)size);
    bump("mem.live_bytes", (long long)size);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtFree(void *devPtr)
{
    int st = enter("aclrtFree");
    if (st) return st;
    if (g_pending_streams > 0)
        misuse("free_while_pending", "aclrtFree while launched work is not synchronized");
    Alloc *a = exact_alloc(devPtr);
    if (!a) {
        misuse("bad_free", "aclrtFree of a pointer that is not a live allocation");
        return ACL_ERROR_RT_MEMORY_FREE;
    }
    a->live = 0;
    free(a->p);
    bump("mem.frees", 1);
    bump("mem.live_bytes", -(long long)a->size);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                            aclrtMemcpyKind kind)
{
    int st = enter("aclrtMemcpy");
    if (st) return st;
    int inside = 0;
    if (count > destMax) {
        misuse("memcpy_overflow", "aclrtMemcpy count > destMax");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (kind == ACL_MEMCPY_HOST_TO_DEVICE) {
        if (!find_alloc(dst, count, &inside) || !inside || find_alloc(src, 0, &inside)) {
            misuse("memcpy_bad_h2d", "host-to-device copy not into device memory / from device memory");
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        bump("memcpy.h2d", 1);
        bump("memcpy.h2d_bytes", (long long)count);
    } else if (kind == ACL_MEMCPY_DEVICE_TO_HOST) {
        if (!find_alloc(src, count, &inside) || !inside || find_alloc(dst, 0, &inside)) {
            misuse("memcpy_bad_d2h", "device-to-host copy not from device memory / into device memory");
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        if (g_pending_streams > 0)
            misuse("read_before_sync", "device-to-host copy while launched work is not synchronized");
        bump("memcpy.d2h", 1);
        bump("memcpy.d2h_bytes", (long long)count);
    } else {
        bump("memcpy.other", 1);
    }
    if (count) memcpy(dst, src, count);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------- aclnn/acl_meta.h */

EXPORT aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                                  const int64_t *stride, int64_t offset, aclFormat format,
                                  const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData)
{
    if (enter("aclCreateTensor")) return NULL;
    if (viewDimsNum > MAX_DIMS || storageDimsNum > MAX_DIMS || (viewDimsNum && (!viewDims || !stride)) ||
        (storageDimsNum && !storageDims) || offset < 0) {
        misuse("bad_tensor_args", "aclCreateTensor with bad dims/strides");
        return NULL;
    }
    aclTensor *t = track(calloc(1, sizeof *t));
    if (!t) return NULL;
    t->magic = MAGIC_TENSOR;
    t->id = g_next_id++;
    t->live = 1;
    t->ndim = viewDimsNum;
    for (uint64_t d = 0; d < viewDimsNum; ++d) {
        if (viewDims[d] < 0 || stride[d] < 0) misuse("negative_dims", "negative dim or stride");
        t->dims[d] = viewDims[d];
        t->strides[d] = stride[d];
    }
    t->sndim = storageDimsNum;
    for (uint64_t d = 0; d < storageDimsNum; ++d) t->sdims[d] = storageDims[d];
    t->offset = offset;
    t->dtype = dataType;
    t->format = format;
    t->data = tensorData;
    if (dtype_size(dataType) == 0) misuse("unknown_dtype", "aclCreateTensor with an unknown dtype");
    /* the data must be device memory covering the whole view */
    size_t extent = view_extent_bytes(t);
    int inside = 0;
    if (!tensorData) {
        bump("tensors.null_data", 1);
        if (extent) misuse("tensor_null_data", "non-empty tensor with NULL data");
    } else if (!find_alloc(tensorData, extent, &inside) || !inside) {
        misuse("tensor_data_not_device", "tensor data outside device allocations");
    } else if (((uintptr_t)tensorData) % 32u) {
        misuse("tensor_data_unaligned", "tensor data not 32-byte aligned");
    }
    /* storage must hold the view */
    int64_t storage_elems = 1;
    for (uint64_t d = 0; d < storageDimsNum; ++d) storage_elems *= storageDims[d];
    if (extent && (int64_t)(extent / dtype_size(dataType)) > storage_elems)
        misuse("storage_too_small", "view exceeds storage shape");
    bump("tensors.created", 1);
    return t;
}

EXPORT aclnnStatus aclDestroyTensor(const aclTensor *tensor)
{
    int st = enter("aclDestroyTensor");
    if (st) return st;
    aclTensor *t = (aclTensor *)tensor;
    if (!t || t->magic != MAGIC_TENSOR) {
        misuse("bad_destroy", "aclDestroyTensor of an unknown handle");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (!t->live) {
        misuse("double_destroy", "aclDestroyTensor of a destroyed tensor");
        return ACLNN_ERR_PARAM_INVALID;
    }
    if (t->owned) {
        /* the list owns it: on real CANN this is a double free later */
        misuse("destroy_owned_tensor", "aclDestroyTensor of a tensor owned by a live aclTensorList");
        return ACLNN_ERR_PARAM_INVALID;
    }
    t->live = 0;
    bump("tensors.destroyed", 1);
    return ACLNN_SUCCESS;
}

EXPORT aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size)
{
    if (enter("aclCreateTensorList")) return NULL;
    if (!value || size == 0) {
        misuse("bad_list_args", "aclCreateTensorList with NULL/empty array");
        return NULL;
    }
    for (uint64_t k = 0; k < size; ++k) {
        const aclTensor *t = value[k];
        if (!tensor_ok(t) || t->owned) {
            misuse("bad_list_member", "aclCreateTensorList with a dead or already-owned tensor");
            return NULL;
        }
    }
    aclTensorList *l = track(calloc(1, sizeof *l));
    if (!l) return NULL;
    l->items = track(calloc(size, sizeof *l->items));
    if (!l->items) return NULL;
    l->magic = MAGIC_LIST;
    l->id = g_next_id++;
    l->live = 1;
    l->n = size;
    for (uint64_t k = 0; k < size; ++k) {
        l->items[k] = (aclTensor *)value[k];
        l->items[k]->owned = 1;
    }
    bump("lists.created", 1);
    return l;
}

EXPORT aclnnStatus aclDestroyTensorList(const aclTensorList *array)
{
    int st = enter("aclDestroyTensorList");
    if (st) return st;
    aclTensorList *l = (aclTensorList *)array;
    if (!l || l->magic != MAGIC_LIST) {
        misuse("bad_destroy", "aclDestroyTensorList of an unknown handle");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (!l->live) {
        misuse("double_destroy", "aclDestroyTensorList of a destroyed list");
        return ACLNN_ERR_PARAM_INVALID;
    }
    /* documented: the tensors in the list are released with it */
    for (uint64_t k = 0; k < l->n; ++k) {
        aclTensor *t = l->items[k];
        if (!t->live) {
            misuse("double_destroy", "list member destroyed before its list");
            continue;
        }
        t->live = 0;
        t->owned = 0;
        bump("tensors.destroyed", 1);
        bump("tensors.destroyed_via_list", 1);
    }
    l->live = 0;
    bump("lists.destroyed", 1);
    return ACLNN_SUCCESS;
}

EXPORT aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size)
{
    if (enter("aclCreateBoolArray")) return NULL;
    if (!value || size == 0) {
        misuse("bad_boolarray_args", "aclCreateBoolArray with NULL/empty array");
        return NULL;
    }
    aclBoolArray *b = track(calloc(1, sizeof *b));
    if (!b) return NULL;
    b->v = track(calloc(size, sizeof *b->v));
    if (!b->v) return NULL;
    memcpy(b->v, value, size * sizeof *value); /* documented: values are copied */
    b->magic = MAGIC_BOOLS;
    b->live = 1;
    b->n = size;
    bump("boolarrays.created", 1);
    return b;
}

EXPORT aclnnStatus aclDestroyBoolArray(const aclBoolArray *array)
{
    int st = enter("aclDestroyBoolArray");
    if (st) return st;
    aclBoolArray *b = (aclBoolArray *)array;
    if (!b || b->magic != MAGIC_BOOLS) {
        misuse("bad_destroy", "aclDestroyBoolArray of an unknown handle");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (!b->live) {
        misuse("double_destroy", "aclDestroyBoolArray of a destroyed array");
        return ACLNN_ERR_PARAM_INVALID;
    }
    b->live = 0;
    bump("boolarrays.destroyed", 1);
    return ACLNN_SUCCESS;
}

static void release_executor(aclOpExecutor *e)
{
    e->live = 0;
    bump("executors.released", 1);
}

EXPORT aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor)
{
    int st = enter("aclSetAclOpExecutorRepeatable");
    if (st) return st;
    if (!executor || executor->magic != MAGIC_EXEC || !executor->live) {
        misuse("bad_executor", "aclSetAclOpExecutorRepeatable on an unknown executor");
        return ACLNN_ERR_INNER_NULLPTR;
    }
    if (executor != t_planned || t_planned_epoch != g_epoch) {
        misuse("repeatable_late", "aclSetAclOpExecutorRepeatable not right after the executor's first phase");
        return ACLNN_ERR_INNER;
    }
    executor->repeatable = 1;
    return ACLNN_SUCCESS;
}

EXPORT aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    int st = enter("aclDestroyAclOpExecutor");
    if (st) return st;
    if (!executor || executor->magic != MAGIC_EXEC || !executor->live) {
        misuse("bad_executor", "aclDestroyAclOpExecutor on an unknown or released executor");
        return ACLNN_ERR_INNER_NULLPTR;
    }
    if (!executor->repeatable) {
        misuse("destroy_non_repeatable_executor", "aclDestroyAclOpExecutor needs a repeatable executor");
        return ACLNN_ERR_PARAM_INVALID;
    }
    release_executor(executor);
    return ACLNN_SUCCESS;
}

/* ------------------------------------------- aclnnop/aclnn_lstm_backward.h */

static int path_exists(const char *path)
{
    struct stat sb;
    return path && *path && stat(path, &sb) == 0;
}

static int kernel_path_found(void)
{
    const char *home = getenv("ASCEND_HOME_PATH");
    if (home && *home) {
        char latest[4096];
        snprintf(latest, sizeof latest, "%s/opp_latest", home);
        if (path_exists(latest)) return 1;
    }
    return path_exists(getenv("ASCEND_OPP_PATH"));
}

/* the device of the allocation holding t's data, or -1 */
static int data_device(const aclTensor *t)
{
    int inside = 0;
    Alloc *a = t && t->data ? find_alloc(t->data, 0, &inside) : NULL;
    return a ? a->device : -1;
}

static int check_format(const aclTensor *t, int want, const char *name)
{
    if (t && t->format != want) {
        set_errmsg("stub: %s format %d, expected %d", name, t->format, want);
        return 0;
    }
    return 1;
}

static int check_list_format(const aclTensorList *l, int want, const char *name)
{
    for (uint64_t k = 0; k < l->n; ++k)
        if (l->items[k]->format != want) {
            set_errmsg("stub: %s[%llu] format %d, expected %d", name, (unsigned long long)k,
                       l->items[k]->format, want);
            return 0;
        }
    return 1;
}

static int check_dtype(const aclTensor *t, int want, const char *name)
{
    if (t && t->dtype != want) {
        set_errmsg("stub: %s dtype %d, expected %d", name, t->dtype, want);
        return 0;
    }
    return 1;
}

static int check_list_dtype(const aclTensorList *l, int want, const char *name)
{
    for (uint64_t k = 0; k < l->n; ++k)
        if (l->items[k]->dtype != want) {
            set_errmsg("stub: %s[%llu] dtype %d, expected %d", name, (unsigned long long)k,
                       l->items[k]->dtype, want);
            return 0;
        }
    return 1;
}

static int check_rank(const aclTensor *t, uint64_t want, const char *name)
{
    if (t && t->ndim != want) {
        set_errmsg("stub: %s has %llu dims, expected %llu", name, (unsigned long long)t->ndim,
                   (unsigned long long)want);
        return 0;
    }
    return 1;
}

static const char *GATE_NAMES[7] = {"i", "g", "f", "o", "h", "c", "tanhc"};

EXPORT aclnnStatus aclnnLstmBackwardGetWorkspaceSize(
    const aclTensor *input, const aclTensorList *hx, const aclTensorList *params, const aclTensor *dy,
    const aclTensor *dh, const aclTensor *dc, const aclTensorList *i, const aclTensorList *g,
    const aclTensorList *f, const aclTensorList *o, const aclTensorList *h, const aclTensorList *c,
    const aclTensorList *tanhc, const aclTensor *batchSizesOptional, bool hasBias, int64_t numLayers,
    double dropout, bool train, bool bidirectional, bool batchFirst, const aclBoolArray *outputMask,
    aclTensor *dxOut, aclTensor *dhPrevOut, aclTensor *dcPrevOut, aclTensorList *dparamsOut,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    int st = enter("aclnnLstmBackwardGetWorkspaceSize");
    if (st) return st;
    const aclTensorList *gates[7] = {i, g, f, o, h, c, tanhc};

    /* 161001: required pointers */
    if (!input || !hx || !params || !dxOut || !dhPrevOut || !dcPrevOut || !dparamsOut || !workspaceSize ||
        !executor) {
        set_errmsg("stub: a required tensor, list or output pointer is NULL");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    for (int k = 0; k < 7; ++k)
        if (!gates[k]) {
            set_errmsg("stub: gate list %s is NULL", GATE_NAMES[k]);
            return ACLNN_ERR_PARAM_NULLPTR;
        }

    /* every handle must be alive */
    const aclTensor *singles[] = {input, dy, dh, dc, batchSizesOptional, dxOut, dhPrevOut, dcPrevOut};
    for (size_t k = 0; k < sizeof singles / sizeof singles[0]; ++k)
        if (singles[k] && !tensor_ok(singles[k])) {
            misuse("use_after_destroy", "dead tensor passed to aclnnLstmBackwardGetWorkspaceSize");
            return ACLNN_ERR_PARAM_INVALID;
        }
    const aclTensorList *lists[] = {hx, params, i, g, f, o, h, c, tanhc, dparamsOut};
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; ++k)
        if (!list_ok(lists[k])) {
            misuse("use_after_destroy", "dead list passed to aclnnLstmBackwardGetWorkspaceSize");
            return ACLNN_ERR_PARAM_INVALID;
        }
    if (outputMask && (outputMask->magic != MAGIC_BOOLS || !outputMask->live)) {
        misuse("use_after_destroy", "dead bool array passed to aclnnLstmBackwardGetWorkspaceSize");
        return ACLNN_ERR_PARAM_INVALID;
    }

    /* 161002: the public op's checks (lengths, dtypes, ranks, formats) */
    uint64_t D = bidirectional ? 2 : 1;
    if (numLayers <= 0) {
        set_errmsg("stub: numLayers must be > 0, got %lld", (long long)numLayers);
        return ACLNN_ERR_PARAM_INVALID;
    }
    uint64_t per_layer = (hasBias && bidirectional) ? 8 : (hasBias || bidirectional) ? 4 : 2;
    if (hx->n != 2) {
        set_errmsg("stub: hx has %llu tensors, expected 2", (unsigned long long)hx->n);
        return ACLNN_ERR_PARAM_INVALID;
    }
    for (int k = 0; k < 7; ++k)
        if (gates[k]->n != D * (uint64_t)numLayers) {
            set_errmsg("stub: list %s has %llu tensors, expected %llu", GATE_NAMES[k],
                       (unsigned long long)gates[k]->n, (unsigned long long)(D * (uint64_t)numLayers));
            return ACLNN_ERR_PARAM_INVALID;
        }
    if (params->n != per_layer * (uint64_t)numLayers || dparamsOut->n != params->n) {
        set_errmsg("stub: params/dparams have %llu/%llu tensors, expected %llu", (unsigned long long)params->n,
                   (unsigned long long)dparamsOut->n, (unsigned long long)(per_layer * (uint64_t)numLayers));
        return ACLNN_ERR_PARAM_INVALID;
    }
    int base = input->dtype;
    if (base != ACL_FLOAT && base != ACL_FLOAT16) {
        set_errmsg("stub: input dtype %d not supported", base);
        return ACLNN_ERR_PARAM_INVALID;
    }
    if (!check_dtype(dy, base, "dy") || !check_dtype(dh, base, "dh") || !check_dtype(dc, base, "dc") ||
        !check_dtype(dxOut, base, "dx") || !check_dtype(dhPrevOut, base, "dhPrev") ||
        !check_dtype(dcPrevOut, base, "dcPrev") || !check_dtype(batchSizesOptional, ACL_INT64, "batchSizes") ||
        !check_list_dtype(hx, base, "hx") || !check_list_dtype(params, base, "params") ||
        !check_list_dtype(dparamsOut, base, "dparams"))
        return ACLNN_ERR_PARAM_INVALID;
    for (int k = 0; k < 7; ++k)
        if (!check_list_dtype(gates[k], base, GATE_NAMES[k])) return ACLNN_ERR_PARAM_INVALID;
    uint64_t seq_rank = batchSizesOptional ? 2 : 3;
    if (!check_rank(input, seq_rank, "input") || !check_rank(dy, seq_rank, "dy") ||
        !check_rank(dxOut, seq_rank, "dx") || !check_rank(batchSizesOptional, 1, "batchSizes") ||
        !check_rank(dh, 3, "dh") || !check_rank(dc, 3, "dc") || !check_rank(dhPrevOut, 3, "dhPrev") ||
        !check_rank(dcPrevOut, 3, "dcPrev"))
        return ACLNN_ERR_PARAM_INVALID;
    int seq_format = batchSizesOptional ? ACL_FORMAT_ND : ACL_FORMAT_NCL;
    if (!check_format(input, seq_format, "input") || !check_format(dy, seq_format, "dy") ||
        !check_format(dxOut, seq_format, "dx") || !check_format(dh, ACL_FORMAT_NCL, "dh") ||
        !check_format(dc, ACL_FORMAT_NCL, "dc") || !check_format(dhPrevOut, ACL_FORMAT_NCL, "dhPrev") ||
        !check_format(dcPrevOut, ACL_FORMAT_NCL, "dcPrev") ||
        !check_format(batchSizesOptional, ACL_FORMAT_ND, "batchSizes") ||
        !check_list_format(hx, ACL_FORMAT_NCL, "hx") || !check_list_format(params, ACL_FORMAT_ND, "params") ||
        !check_list_format(dparamsOut, ACL_FORMAT_ND, "dparams"))
        return ACLNN_ERR_PARAM_INVALID;
    for (int k = 0; k < 7; ++k)
        if (!check_list_format(gates[k], ACL_FORMAT_NCL, GATE_NAMES[k])) return ACLNN_ERR_PARAM_INVALID;

    /* EmptyCheck (aclnn_lstm_backward.cpp): a tensor without elements among
       input, dy, dh, dc, hx, params and the gate lists ends the first phase
       with success, workspace 0 and an executor that computes nothing. */
    int empty = numel(input) == 0 || numel(dy) == 0 || numel(dh) == 0 || numel(dc) == 0;
    const aclTensorList *checked[] = {hx, params, gates[0], gates[1], gates[2], gates[3], gates[4], gates[5],
                                      gates[6]};
    for (size_t k = 0; k < sizeof checked / sizeof checked[0]; ++k)
        for (uint64_t j = 0; j < checked[k]->n; ++j)
            if (numel(checked[k]->items[j]) == 0) empty = 1;

    /* Past that check the engine builds the graph and loads the kernels from
       $ASCEND_HOME_PATH/opp_latest, else $ASCEND_OPP_PATH (kernel_utils.cpp
       GetOppKernelPath, 561107); the op reports a failed build as
       ACLNN_ERR_INNER_NULLPTR (CHECK_RET after ExecLstm*Backward). */
    if (!empty && !kernel_path_found()) {
        set_errmsg("stub: cannot find the operator kernels: ASCEND_OPP_PATH is not set or does not exist "
                   "(ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND %d)", ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND);
        return ACLNN_ERR_INNER_NULLPTR;
    }

    aclOpExecutor *e = track(calloc(1, sizeof *e));
    if (!e) return ACLNN_ERR_INNER_NULLPTR;
    e->magic = MAGIC_EXEC;
    e->live = 1;
    e->empty = empty;
    e->device = current_ctx() ? current_ctx()->device : -1;
    e->workspace_size = empty ? 0 : g_workspace_size;
    e->input = input; e->dy = dy; e->dh = dh; e->dc = dc; e->batch_sizes = batchSizesOptional;
    e->dx = dxOut; e->dh_prev = dhPrevOut; e->dc_prev = dcPrevOut;
    e->hx = hx; e->params = params; e->dparams = dparamsOut;
    for (int k = 0; k < 7; ++k) e->gates[k] = gates[k];
    bump("executors.created", 1);

    log_begin_entry("aclnnLstmBackwardGetWorkspaceSize");
    log_append(", \"scalars\": {\"hasBias\": %s, \"numLayers\": %lld, \"dropout\": ", hasBias ? "true" : "false",
               (long long)numLayers);
    log_double(dropout);
    log_append(", \"train\": %s, \"bidirectional\": %s, \"batchFirst\": %s}", train ? "true" : "false",
               bidirectional ? "true" : "false", batchFirst ? "true" : "false");
    log_append(", \"outputMask\": ");
    if (!outputMask) log_append("null");
    else {
        log_append("[");
        for (uint64_t k = 0; k < outputMask->n; ++k) log_append("%s%s", k ? ", " : "", outputMask->v[k] ? "true" : "false");
        log_append("]");
    }
    log_append(", \"tensors\": {\"input\": "); log_tensor(input);
    log_append(", \"dy\": "); log_tensor(dy);
    log_append(", \"dh\": "); log_tensor(dh);
    log_append(", \"dc\": "); log_tensor(dc);
    log_append(", \"batchSizes\": "); log_tensor(batchSizesOptional);
    log_append(", \"dxOut\": "); log_tensor(dxOut);
    log_append(", \"dhPrevOut\": "); log_tensor(dhPrevOut);
    log_append(", \"dcPrevOut\": "); log_tensor(dcPrevOut);
    log_append("}, \"lists\": {\"hx\": "); log_list(hx);
    log_append(", \"params\": "); log_list(params);
    for (int k = 0; k < 7; ++k) { log_append(", \"%s\": ", GATE_NAMES[k]); log_list(gates[k]); }
    log_append(", \"dparamsOut\": "); log_list(dparamsOut);
    log_append("}, \"workspace_size\": %llu, \"executor\": %llu, \"empty\": %s, \"device\": %d",
               (unsigned long long)e->workspace_size, (unsigned long long)(uintptr_t)e, empty ? "true" : "false",
               e->device);
    log_end_entry();

    *workspaceSize = e->workspace_size;
    *executor = e;
    t_planned = e;
    t_planned_epoch = g_epoch;
    return ACLNN_SUCCESS;
}

static void run_elementwise(const aclTensor *out, const aclTensor *a, double ka, const aclTensor *b, double kb,
                            double add)
{
    int64_t n = numel(out);
    if (!out->data) return;
    for (int64_t k = 0; k < n; ++k) {
        double v = add;
        if (a && k < numel(a)) v += ka * read_elem(a, k);
        if (b && k < numel(b)) v += kb * read_elem(b, k);
        write_elem(out, k, v);
    }
}

EXPORT aclnnStatus aclnnLstmBackward(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                     aclrtStream stream)
{
    int st = enter("aclnnLstmBackward");
    aclOpExecutor *e = executor;
    if (!e || e->magic != MAGIC_EXEC || !e->live) {
        misuse("bad_executor", "aclnnLstmBackward with an unknown or released executor");
        return st ? st : ACLNN_ERR_PARAM_NULLPTR;
    }
    /* a non-repeatable executor is consumed by the second phase, failed or not;
       a repeatable one is kept for aclDestroyAclOpExecutor (op_executor.cpp,
       CommonOpExecutorRun) */
    if (!e->repeatable) release_executor(e);
    /* model an asynchronous launch: even a failing second phase may have queued
       work, so the caller must synchronize before freeing or reading memory */
    if (stream_ok(stream) && !((StubStream *)stream)->pending) {
        ((StubStream *)stream)->pending = 1;
        g_pending_streams++;
    }
    if (st) return st;
    if (!stream_ok(stream)) {
        misuse("bad_stream", "aclnnLstmBackward on an unknown stream");
        return ACLNN_ERR_PARAM_INVALID;
    }
    if (!stream_in_current_context(stream, "aclnnLstmBackward on a stream of another context"))
        return ACL_ERROR_RT_STREAM_CONTEXT;
    int device = ((StubStream *)stream)->ctx->device;
    if (e->empty) { /* the EmptyCheck executor: nothing runs, no output is written */
        log_begin_entry("aclnnLstmBackward");
        log_append(", \"workspace\": %llu, \"workspace_size\": %llu, \"executor\": %llu, \"stream\": %llu, "
                   "\"device\": %d, \"empty\": true",
                   (unsigned long long)(uintptr_t)workspace, (unsigned long long)workspaceSize,
                   (unsigned long long)(uintptr_t)e, (unsigned long long)(uintptr_t)stream, device);
        log_end_entry();
        return ACLNN_SUCCESS;
    }
    if (workspaceSize != e->workspace_size) {
        misuse("bad_workspace", "workspaceSize differs from the planned size");
        return ACLNN_ERR_PARAM_INVALID;
    }
    int inside = 0;
    if (e->workspace_size > 0) {
        if (!workspace || !find_alloc(workspace, e->workspace_size, &inside) || !inside) {
            misuse("bad_workspace", "workspace is not device memory of the planned size");
            return ACLNN_ERR_PARAM_INVALID;
        }
        memset(workspace, 0x5A, e->workspace_size); /* the kernel may scribble on it */
    }
    const aclTensor *singles[] = {e->input, e->dy, e->dh, e->dc, e->batch_sizes, e->dx, e->dh_prev, e->dc_prev};
    for (size_t k = 0; k < sizeof singles / sizeof singles[0]; ++k) {
        if (singles[k] && !tensor_ok(singles[k])) {
            misuse("use_after_destroy", "tensor destroyed between the two phases");
            return ACLNN_ERR_PARAM_INVALID;
        }
        if (singles[k] && data_device(singles[k]) != device)
            misuse("cross_device", "a tensor's memory is on another device than the stream");
    }
    const aclTensorList *lists[] = {e->hx, e->params, e->dparams, e->gates[0], e->gates[1], e->gates[2],
                                    e->gates[3], e->gates[4], e->gates[5], e->gates[6]};
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; ++k)
        if (!list_ok(lists[k])) {
            misuse("use_after_destroy", "list destroyed between the two phases");
            return ACLNN_ERR_PARAM_INVALID;
        }

    log_begin_entry("aclnnLstmBackward");
    log_append(", \"workspace\": %llu, \"workspace_size\": %llu, \"executor\": %llu, \"stream\": %llu, "
               "\"device\": %d, \"empty\": false",
               (unsigned long long)(uintptr_t)workspace, (unsigned long long)workspaceSize,
               (unsigned long long)(uintptr_t)e, (unsigned long long)(uintptr_t)stream, device);
    log_append(", \"checksums\": {\"input\": "); log_checksum(e->input);
    log_append(", \"dy\": "); log_checksum(e->dy);
    log_append(", \"dh\": "); log_checksum(e->dh);
    log_append(", \"dc\": "); log_checksum(e->dc);
    log_append(", \"batchSizes\": "); log_checksum(e->batch_sizes);
    log_append(", \"hx\": "); log_list_checksums(e->hx);
    log_append(", \"params\": "); log_list_checksums(e->params);
    for (int k = 0; k < 7; ++k) { log_append(", \"%s\": ", GATE_NAMES[k]); log_list_checksums(e->gates[k]); }
    log_append("}");
    log_end_entry();

    run_elementwise(e->dx, e->input, 2.0, NULL, 0.0, 1.0);
    run_elementwise(e->dh_prev, e->hx->items[0], 1.0, e->dh, 10.0, 0.0);
    run_elementwise(e->dc_prev, e->hx->items[1], 1.0, e->dc, 10.0, 0.0);
    for (uint64_t j = 0; j < e->dparams->n && j < e->params->n; ++j)
        run_elementwise(e->dparams->items[j], e->params->items[j], 1.0, NULL, 0.0, 0.5 * (double)(j + 1));
    bump("kernel.runs", 1);
    return ACLNN_SUCCESS;
}
