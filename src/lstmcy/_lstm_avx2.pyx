"""LSTM kernels (one layer, both directions, forward and backward) built for AVX2.

The code is ``_lstm_kernels.pxi``; :mod:`lstmcy._dispatch` imports the best build the CPU
supports. All builds give bitwise identical results (no FMA contraction, and vectorised
loops do no reductions across lanes).
"""
include "_lstm_kernels.pxi"
