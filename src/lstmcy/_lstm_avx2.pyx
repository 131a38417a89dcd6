"""LSTM kernels (one layer, both directions, forward and backward) built for AVX2 (with FMA).

The code is ``_lstm_kernels.pxi``; :mod:`lstmcy._dispatch` imports the best build the CPU
supports. The AVX2 and AVX-512 builds give bitwise identical results (no FMA contraction by
the compiler, explicit fused multiply-adds where the code asks for them, no reductions
across vector lanes); the baseline build, for CPUs without FMA, rounds those multiply-adds
in two steps.
"""
include "_lstm_kernels.pxi"
