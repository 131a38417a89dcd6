"""Training-step benchmark: ``lstmcy.torch.LSTM`` against ``torch.nn.LSTM`` on the CPU.

A step: the LSTM, a linear head on the last layer's final state, cross-entropy, backward,
optimiser step; both models start from the same weights and see the same batches, in
alternate blocks of ``--block`` steps in one process (the first ``SETTLE`` of a block not
timed: a step right after the other model's runs on evicted caches and the other
library's spinning threads). ``--breakdown`` also times each LSTM alone and its forward
alone, and the machine's GEMM peak. Run::

    python benchmarks/bench_torch_module.py                 # default shapes, float32, Adam
    python benchmarks/bench_torch_module.py --optim sgd --dtype float64 --repeats 100
    python benchmarks/bench_torch_module.py --shape 32,16,32,64,1,0,1  # T,B,I,H,L,bidir,packed
    python benchmarks/bench_torch_module.py --shape 50,32,80,512,1,0 --proj-size 128  # LSTMP
    python benchmarks/bench_torch_module.py --threads 1 --clock cpu --breakdown
"""
import argparse
import statistics
import time

from _env import reexec_without_openblas_overrides  # (no numpy import)

reexec_without_openblas_overrides(__name__)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

import lstmcy  # noqa: E402
import lstmcy.torch as lstmcy_torch  # noqa: E402

DEFAULT_SHAPES = [
    # T, B, I, H, num_layers, bidirectional, packed
    (32, 16, 32, 64, 1, False, False),     # the target case
    (32, 16, 32, 64, 2, True, False),
    (32, 16, 32, 64, 1, False, True),
    (64, 32, 64, 128, 1, False, False),
    (128, 64, 128, 256, 1, False, False),
]
NUM_CLASSES = 10
# Steps at the start of each block that are run but not timed (see the module docstring).
SETTLE = 2


class Classifier(nn.Module):
    """LSTM followed by a linear layer on the final hidden state of the last layer."""

    def __init__(self, lstm_class, T, B, I, H, num_layers, bidirectional, dtype, proj_size=0):
        super().__init__()
        self.rnn = lstm_class(I, H, num_layers=num_layers, bidirectional=bidirectional,
                              proj_size=proj_size, dtype=dtype)
        self.head = nn.Linear((2 if bidirectional else 1) * (proj_size or H), NUM_CLASSES, dtype=dtype)
        self.bidirectional = bidirectional

    def forward(self, x):
        _, (h_n, _) = self.rnn(x)
        last = torch.cat([h_n[-2], h_n[-1]], dim=1) if self.bidirectional else h_n[-1]
        return self.head(last)


def make_step(model, optim_name, lr=1e-3):
    optimizer = (torch.optim.Adam(model.parameters(), lr=lr) if optim_name == "adam"
                 else torch.optim.SGD(model.parameters(), lr=lr))
    loss_fn = nn.CrossEntropyLoss()

    def step(x, target):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        optimizer.step()
        return loss

    return step


def make_lstm_only(model, seed=1):
    """The model's LSTM alone: forward, then backward of a fixed gradient on ``h_n``
    (what the head sends back), parameters' gradients set to None first as in a step."""
    grads = {}

    def lstm_only(x, target):
        model.zero_grad(set_to_none=True)
        _, (h_n, _) = model.rnn(x)
        grad = grads.get(h_n.shape)
        if grad is None:
            generator = torch.Generator().manual_seed(seed)
            grad = grads[h_n.shape] = torch.randn(h_n.shape, dtype=h_n.dtype,
                                                  generator=generator)
        torch.autograd.backward(h_n, grad)

    return lstm_only


def step_flops(shape):
    """FLOPs of the LSTM's forward and backward in a training step (as ``cases.py`` counts
    them), less the input gradient of layer 0 (8 T B H I per direction), which a step does
    not need. (Packed batches count all T B positions: an upper bound.)"""
    from cases import Case, backward_flops, forward_flops

    case = Case("step", *shape[:5], bidirectional=shape[5])
    return forward_flops(case) + backward_flops(case) - case.D * 8.0 * case.T * case.B * case.H * case.I


def make_batches(shape, dtype, count=8, seed=0):
    """``count`` (input, target) pairs: padded ``[T, B, I]`` tensors, or PackedSequences."""
    T, B, I, H, L, bidir, packed = shape
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        x = torch.randn(T, B, I, dtype=dtype, generator=generator)
        if packed:
            lengths = torch.randint(max(T // 2, 1), T + 1, (B,), generator=generator)
            lengths[0] = T
            x = pack_padded_sequence(x, lengths, enforce_sorted=False)
        batches.append((x, torch.randint(NUM_CLASSES, (B,), generator=generator)))
    return batches


def bench_shape(shape, dtype, optim_name, repeats, warmup, seed=0, breakdown=False, block=10,
                clock=time.perf_counter, proj_size=0):
    T, B, I, H, L, bidir, packed = shape
    torch.manual_seed(seed)
    ours = Classifier(lstmcy_torch.LSTM, T, B, I, H, L, bidir, dtype, proj_size)
    ref = Classifier(nn.LSTM, T, B, I, H, L, bidir, dtype, proj_size)
    ref.load_state_dict(ours.state_dict())
    steps = {"lstmcy": make_step(ours, optim_name), "torch": make_step(ref, optim_name)}
    if breakdown:
        steps["lstmcy_lstm"] = make_lstm_only(ours)
        steps["torch_lstm"] = make_lstm_only(ref)
        # The LSTM's forward alone, recording the graph as in a step (then dropped): the
        # LSTM's backward is the LSTM alone minus this.
        steps["lstmcy_forward"] = lambda x, target: ours.rnn(x)
        steps["torch_forward"] = lambda x, target: ref.rnn(x)
    batches = make_batches(shape, dtype)
    for name in steps:  # warm-up, not timed
        for k in range(warmup):
            steps[name](*batches[k % len(batches)])
    settle = SETTLE if block > SETTLE else 0
    times = {name: [] for name in steps}
    names = list(steps)
    k = 0
    for round_ in range(-(-repeats // (block - settle))):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            for j in range(block):
                x, target = batches[(k + j) % len(batches)]
                start = clock()
                steps[name](x, target)
                elapsed = clock() - start
                if j >= settle:
                    times[name].append(elapsed)
        k += block
    return {name: statistics.median(values) for name, values in times.items()}


def parse_shape(text):
    values = [int(v) for v in text.split(",")]
    if len(values) not in (6, 7):
        raise argparse.ArgumentTypeError(
            "shape is T,B,I,H,num_layers,bidirectional(0/1)[,packed(0/1)]")
    return (*values[:5], bool(values[5]), len(values) == 7 and bool(values[6]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--optim", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--repeats", type=int, default=60, help="timed steps per model and shape")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--block", type=int, default=10,
                        help=f"steps of one model in a row; the first {SETTLE} of each are "
                             f"not timed (1: alternate single steps, all timed)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both torch and lstmcy (default: each library's own)")
    parser.add_argument("--shape", type=parse_shape, action="append",
                        help="T,B,I,H,num_layers,bidirectional(0/1)[,packed(0/1)]; repeatable")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time steps by the wall clock, or by this process's CPU time "
                             "(with --threads 1, less sensitive to other processes' load)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each LSTM alone and report the rest of the step, "
                             "with the GEMM peak")
    parser.add_argument("--proj-size", type=int, default=0,
                        help="proj_size of every shape's LSTM (LSTMP; default 0: none)")
    parser.add_argument("--target", type=float, default=1.5,
                        help="speed-up the breakdown works back from (default 1.5)")
    args = parser.parse_args(argv)
    if args.block < 1 or args.repeats < 1:
        parser.error("--block and --repeats must be at least 1")
    dtype = getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        lstmcy.set_num_threads(args.threads)
    shapes = args.shape or DEFAULT_SHAPES
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
          f"lstmcy threads {lstmcy.get_num_threads() or 'auto'}, "
          f"mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}; "
          f"{args.dtype}, {args.optim}, median of {args.repeats} steps (after {args.warmup} warm-up; "
          f"blocks of {args.block}; {args.clock} clock"
          + (f"; proj_size {args.proj_size}" if args.proj_size else "") + ")")
    print(f"{SHAPE_HEADER} | {'lstmcy ms':>10} {'torch ms':>10} {'speed-up':>9}")
    results = []
    for shape in shapes:
        result = bench_shape(shape, dtype, args.optim, args.repeats, args.warmup,
                             breakdown=args.breakdown, block=args.block,
                             clock=time.process_time if args.clock == "cpu" else time.perf_counter,
                             proj_size=args.proj_size)
        results.append(result)
        ours, ref = result["lstmcy"] * 1e3, result["torch"] * 1e3
        print(f"{shape_label(shape)} | {ours:>10.3f} {ref:>10.3f} {ref / ours:>8.2f}x", flush=True)
    if args.breakdown:
        print_breakdown(shapes, results, args.dtype, args.target, args.threads)


SHAPE_HEADER = f"{'T':>4} {'B':>4} {'I':>4} {'H':>4} {'L':>2} {'bi':>3} {'pk':>3}"


def shape_label(shape):
    T, B, I, H, L, bidir, packed = shape
    return (f"{T:>4} {B:>4} {I:>4} {H:>4} {L:>2} {('yes' if bidir else 'no'):>3} "
            f"{('yes' if packed else 'no'):>3}")


def print_breakdown(shapes, results, dtype, target, threads=None):
    """Each module's LSTM alone, the rest of the step, and what ``target`` would need; the
    GEMM peak is measured with the steps' thread count."""
    from threadpoolctl import threadpool_limits  # imports numpy/scipy: only here
    from machine import gemm_peak

    with threadpool_limits(limits=threads):  # None: the libraries' own settings
        peak = gemm_peak(dtype)["peak_gflops"]
    print(f"\nWhere the step goes (ms; rest = step - LSTM alone; GEMM peak {peak:.0f} GF/s "
          f"{dtype}, measured now):")
    print(f"{SHAPE_HEADER} | {'LSTM lstmcy':>11} {'LSTM torch':>10} {'ratio':>6} | "
          f"{'rest lstmcy':>11} {'rest torch':>10} | "
          f"{'LSTM for ' + format(target, 'g') + 'x':>12} {'FLOPs at peak':>13} | "
          f"{'fwd lstmcy':>10} {'fwd torch':>9} {'ratio':>6} | {'bwd lstmcy':>10} "
          f"{'bwd torch':>9} {'ratio':>6}")
    for shape, result in zip(shapes, results):
        ms = {name: value * 1e3 for name, value in result.items()}
        rest_ours = ms["lstmcy"] - ms["lstmcy_lstm"]
        rest_ref = ms["torch"] - ms["torch_lstm"]
        # The LSTM part lstmcy's step could spend and still be `target` times faster.
        needed = ms["torch"] / target - rest_ours
        at_peak = step_flops(shape) / (peak * 1e9) * 1e3
        # The LSTM's backward (with autograd's part): the LSTM alone minus its forward.
        bwd_ours = ms["lstmcy_lstm"] - ms["lstmcy_forward"]
        bwd_ref = ms["torch_lstm"] - ms["torch_forward"]
        print(f"{shape_label(shape)} | "
              f"{ms['lstmcy_lstm']:>11.3f} {ms['torch_lstm']:>10.3f} "
              f"{ms['torch_lstm'] / ms['lstmcy_lstm']:>5.2f}x | {rest_ours:>11.3f} "
              f"{rest_ref:>10.3f} | {needed:>12.3f} {at_peak:>13.3f} | "
              f"{ms['lstmcy_forward']:>10.3f} {ms['torch_forward']:>9.3f} "
              f"{ms['torch_forward'] / ms['lstmcy_forward']:>5.2f}x | {bwd_ours:>10.3f} "
              f"{bwd_ref:>9.3f} {bwd_ref / bwd_ours:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
