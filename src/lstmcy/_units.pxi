# The units split's worker loop, shared by the forward and the backward.
#
# A recurrence too thin for row groups splits the hidden units of every step into parts
# (unit_range): part u of step s is one TASK_UNIT_STEP, and a step starts once every part
# of the one before is done (step_done counts the parts done per direction). Any thread
# may run any part, so a part whose thread is descheduled does not hold up the others:
# a thread takes its own direction's steps first and of each step its own part first (so
# that a part's columns of w_hh stay in one thread's cache), then any part nobody has
# taken. A thread with no part of its own leaves at once (the backward's gradients, or
# nothing, are left for it): the threads that have parts take every part left over. The
# forward has T unit steps per direction; the backward T + 1, its last giving dh of h0.


cdef void units_worker(UnitsCall *call, floating *like, int worker) noexcept nogil:
    """A thread's part of the units split of ``call``: its own direction and part first,
    then whatever is left elsewhere."""
    cdef Py_ssize_t D = call.D
    cdef Py_ssize_t steps = call.steps.T + (0 if UnitsCall is ForwardCall else 1)
    cdef Py_ssize_t parts = call.groups
    cdef Py_ssize_t own_d = worker % D
    cdef Py_ssize_t own_u = (worker // D) % parts
    cdef Py_ssize_t k, d, s, j, u
    cdef int *claims
    cdef bint left
    if worker >= D * parts:
        return
    for k in range(D):
        d = (own_d + k) % D
        for s in range(steps):
            claims = call.unit_claims + (d * steps + s) * parts
            left = False
            for j in range(parts):
                if load_acquire(&claims[j]) == 0:
                    left = True
                    break
            if not left:
                continue
            if s > 0:
                job_wait(&call.step_done[d], <int>(parts * s), call.spin_ns)
            for j in range(parts):
                u = (own_u + j) % parts if d == own_d else j
                if claim(&claims[u]):
                    if UnitsCall is ForwardCall:
                        _unit_step(call, like, d, s, u, worker)
                    else:
                        _unit_step_bwd(call, like, d, s, u, worker)
