# Events, claims and the clock for the kernel threads (see _sync.h).

cdef extern from "_sync.h" nogil:
    ctypedef struct lstmcy_event:
        int value
    int event_get "lstmcy_event_get"(lstmcy_event *e)
    void event_set "lstmcy_event_set"(lstmcy_event *e, int value)
    void event_add "lstmcy_event_add"(lstmcy_event *e, int delta)
    void event_wait "lstmcy_event_wait"(lstmcy_event *e, int target, long long spin_ns)
    int load_acquire "lstmcy_load_acquire"(const int *p)
    void store_release "lstmcy_store_release"(int *p, int v)
    bint compare_exchange "lstmcy_compare_exchange"(int *p, int expected, int desired)
    int take_next "lstmcy_take_next"(int *counter)
    bint claim "lstmcy_claim"(int *flag)
    long long now_ns "lstmcy_now_ns"()
    void prefetch "lstmcy_prefetch"(const void *p)
    unsigned flush_denormals_mode "lstmcy_flush_denormals"()
    void restore_fp_mode "lstmcy_restore_fp_mode"(unsigned mode)
