"""Peak memory of a training loop: ``lstmcy.torch.LSTM`` against ``torch.nn.LSTM``.

The loop is the word-level language model of PyTorch's examples
(``examples/word_language_model``, its defaults): embedding, a 2-layer LSTM of 200 units
with dropout 0.2, a linear decoder over the vocabulary, cross-entropy, truncated BPTT
(hidden state carried over, detached), gradient clipping and plain SGD, on random token
ids. Each model trains in a fresh process (memory is a per-process figure), which
imports both libraries first so that their code and libraries count alike. Reported, in
MiB: the resident set before the first step, its peak during training (``VmHWM``) and
the growth between the two.

Run::

    python benchmarks/bench_torch_memory.py                    # 30 steps, vocabulary 33278
    python benchmarks/bench_torch_memory.py --steps 50 --vocab 10000 --hidden 650
"""
import argparse
import json
import os
import subprocess
import sys

from _env import reexec_without_openblas_overrides  # (no numpy import)


def _status_mib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def train(kind, steps, vocab, hidden, layers, bptt, batch, threads):
    """One training loop in this process; returns the memory figures."""
    import torch
    from torch import nn

    import lstmcy.torch

    if threads:
        torch.set_num_threads(threads)
        lstmcy.set_num_threads(threads)
    lstm_class = nn.LSTM if kind == "torch" else lstmcy.torch.LSTM
    torch.manual_seed(0)

    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(vocab, hidden)
            self.rnn = lstm_class(hidden, hidden, layers, dropout=0.2)
            self.decoder = nn.Linear(hidden, vocab)

        def forward(self, tokens, state):
            output, state = self.rnn(self.drop(self.encoder(tokens)), state)
            return self.decoder(self.drop(output)), state

    model = LanguageModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=20.0)
    data = torch.randint(vocab, (bptt * steps + 1, batch))
    before = _status_mib("VmRSS")
    state = None
    for step in range(steps):
        tokens = data[step * bptt:(step + 1) * bptt]
        targets = data[step * bptt + 1:(step + 1) * bptt + 1]
        if state is not None:
            state = tuple(s.detach() for s in state)
        optimizer.zero_grad()
        logits, state = model(tokens, state)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
    peak = _status_mib("VmHWM")
    return {"before": before, "peak": peak, "growth": peak - before}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=33278, help="wikitext-2's vocabulary")
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2, help="processes per model")
    parser.add_argument("--child", choices=("torch", "lstmcy"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = (args.steps, args.vocab, args.hidden, args.layers, args.bptt, args.batch,
             args.threads)
    if args.child:
        print(json.dumps(train(args.child, *sizes)))
        return
    print(f"language model: vocabulary {args.vocab}, {args.layers} layers of {args.hidden}, "
          f"bptt {args.bptt}, batch {args.batch}, {args.steps} steps; MiB, one process each")
    print(f"{'model':>8} | {'before':>8} {'peak':>8} {'growth':>8}")
    base = [sys.executable, os.path.abspath(__file__)] + [
        f"--{name}={value}" for name, value in vars(args).items()
        if name not in ("child", "repeats") and value is not None]
    for _ in range(args.repeats):
        for kind in ("torch", "lstmcy"):
            out = subprocess.run(base + [f"--child={kind}"], capture_output=True, text=True,
                                 check=True).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            print(f"{kind:>8} | {figures['before']:>8.1f} {figures['peak']:>8.1f} "
                  f"{figures['growth']:>8.1f}", flush=True)


if __name__ == "__main__":
    reexec_without_openblas_overrides()
    main()
