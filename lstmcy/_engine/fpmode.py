"""Subnormal numbers in the kernels: flushed to zero (the default) or kept.

Subnormal operands and results (below 1.2e-38 in float32, 2.2e-308 in float64) cost
10-100 times a normal operation on x86 CPUs. A gradient that enters only at the last
hidden state (a classifier on h_n) decays through a long recurrence into that range, and a
backward that took a millisecond takes ten. So the kernels' threads run with subnormal
results flushed to zero and subnormal inputs read as zero (x86: MXCSR's FTZ and DAZ;
aarch64: FPCR.FZ) for the duration of a call, as TensorFlow's CPU kernels do; the caller's
floating-point mode is restored afterwards, on every thread.

What changes: any value below the smallest normal number, read or computed inside a
kernel, is 0 (with its sign); nothing else does. ``set_flush_denormals(False)`` keeps IEEE
subnormals (results then equal the IEEE computation bit for bit, at the cost above).
"""

_flush = True


def set_flush_denormals(flush):
    """Flush subnormal numbers to zero inside lstmcy's kernels (True, the default) or keep
    them as IEEE arithmetic does (False)."""
    global _flush
    if not isinstance(flush, (bool,)) and flush not in (0, 1):
        raise TypeError(f"flush must be a bool, got {flush!r}")
    _flush = bool(flush)


def get_flush_denormals():
    """Whether lstmcy's kernels flush subnormal numbers to zero."""
    return _flush
