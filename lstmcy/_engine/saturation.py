"""Where the kernels' float64 tanh reaches exactly 1: PyTorch's point on this CPU.

In float64 the kernels' sigmoid and tanh give exactly 0 or 1 where PyTorch's do, because
there an exact 0 or 1 decides whether an infinity in the backward gives NaN or Inf
(``src/lstmcy/_fastmath.pxd``). PyTorch's float64 tanh on x86-64 is MKL's, and MKL runs
code of its own on Intel CPUs with AVX-512 that reaches 1 later than its code
elsewhere; its sigmoid reaches 1 at the same point everywhere. The points were bisected
on ``torch.tanh`` (torch 2.13, MKL 2024.2, float64) on an Intel Xeon with AVX-512, with
MKL's AVX-512 code and with ``MKL_ENABLE_INSTRUCTIONS=AVX2``, and on an AMD EPYC (Zen 4);
``tests/test_nonfinite.py`` checks the one this machine gets against PyTorch. The rule
follows ``MKL_ENABLE_INSTRUCTIONS`` (a value not starting with AVX512 is taken as MKL's
older code, as measured for AVX2); other settings that pin MKL's code path (such as
``MKL_CBWR``) and PyTorch builds without MKL are not followed.
"""

#: The first double whose correctly rounded float64 tanh is 1 (no point of PyTorch's is
#: below it; ``set_tanh_one_from`` refuses one that is).
CORRECTLY_ROUNDED_TANH_ONE_FROM = 19.061547465398498
#: The first double whose float64 tanh is exactly 1 in PyTorch: MKL's code on AMD CPUs,
#: on CPUs without AVX-512 and under MKL_ENABLE_INSTRUCTIONS=AVX2 (about 7e-11 above
#: CORRECTLY_ROUNDED_TANH_ONE_FROM).
TANH_ONE_FROM = 19.061547465468465
#: The same with MKL's AVX-512 code (Intel CPUs with AVX-512F).
TANH_ONE_FROM_MKL_AVX512 = 19.061555615949707


def tanh_one_from(vendor, avx512f, mkl_instructions=None):
    """The float64 tanh's first argument whose PyTorch result is exactly 1, on a CPU of
    ``vendor`` (CPUID's, e.g. ``"GenuineIntel"``; None if unknown) with or without
    AVX-512F (``avx512f``), ``MKL_ENABLE_INSTRUCTIONS`` being ``mkl_instructions``
    (None: unset)."""
    mkl_avx512 = (vendor == "GenuineIntel" and bool(avx512f)
                  and (mkl_instructions is None
                       or mkl_instructions.strip().upper().startswith("AVX512")))
    return TANH_ONE_FROM_MKL_AVX512 if mkl_avx512 else TANH_ONE_FROM
