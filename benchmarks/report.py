#!/usr/bin/env python
"""Tables (plain text or Markdown) and a PNG chart from a benchmark JSON file.

``run.py`` prints :func:`text_report` and draws :func:`chart`; ``report.py <run>.json``
turns a saved run into Markdown, and with ``--results-md`` (and ``--scaling``,
``--estimators``) writes the whole of ``RESULTS.md`` (docs/benchmarks.md).
"""
import argparse
import json
import sys
import textwrap

__all__ = ["format_peaks", "tables", "text_report", "markdown_report", "chart"]


#: Outside load (cores other processes used during a case) above which a case's targets
#: are not graded: its times measure the other processes as much as lstmcy.
LOAD_LIMIT = 0.3


def _graded(result):
    others = result.get("others_cores")
    return others is not None and others <= LOAD_LIMIT


def format_peaks(peaks):
    parts = []
    for dt, p in peaks.items():
        runs = ", ".join(f"{k} {v:.0f}" for k, v in p["runs"].items())
        parts.append(f"{dt} {p['peak_gflops']:.1f} GF/s ({runs})")
    return "; ".join(parts)


def _ms(seconds):
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _x(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(fraction):
    return f"{100 * fraction:.0f}%"


def _spread(t):
    """Median with the inter-quartile range as a +- percentage."""
    return f"{_ms(t['median'])} ±{100 * t['iqr'] / 2 / t['median']:.0f}%"


def _ref(result):
    ref = result["reference"]
    if ref["status"] != "ran":
        return f"skipped (~{ref['estimate_s']:.0f} s)"
    return f"{_ms(ref['fwd'])} / {_ms(ref['bwd'])}"


def tables(doc):
    """``[(title, header, rows, notes)]`` for a results document."""
    cases = doc["cases"]
    out = []
    header = ["case", "T,B,I,H,L", "dtype", "GFLOP", "lstmcy ms", "torch ms", "torch/ours",
              "ours GF/s (%)", "torch GF/s (%)", "load"]
    rows = []
    for r in cases:
        t, g, e = r["times"], r["gflops"], r.get("efficiency", {})
        rows.append([r["name"], r["label"] + (" packed" if r["packed"] else ""),
                     r["dtype"].replace("float", "f"), f"{r['flops']['bwd'] / 1e9:.3f}",
                     _spread(t["lstmcy_bwd"]), _spread(t["torch_bwd"]), _x(r["ratios"]["bwd_ratio"]),
                     f"{g['lstmcy_bwd']:.1f} ({_pct(e.get('lstmcy_bwd', 0))})",
                     f"{g['torch_bwd']:.1f} ({_pct(e.get('torch_bwd', 0))})",
                     "-" if r.get("others_cores") is None else f"{r['others_cores']:.1f}"])
    out.append(("Backward (median ± half the inter-quartile range)", header, rows,
                ["torch = torch.autograd.grad(retain_graph=True) on a recorded forward; packed rows "
                 "compare PyTorch's PackedSequence path.",
                 "GF/s from 16·T·B·H·(I_l+H) per layer-direction, tokens actually processed for packed "
                 "cases; (%) = share of the GEMM peak of that dtype measured in the same run.",
                 f"load = cores other processes used during the case's timing (/proc/stat): above "
                 f"{LOAD_LIMIT} the case is contaminated by outside load and its targets are not "
                 "graded."]))
    header = ["case", "dtype", "lstmcy fwd ms", "torch fwd ms", "torch/ours", "plan bwd / fwd ms",
              "numpy fwd / bwd ms", "max rel err"]
    rows = [[r["name"], r["dtype"].replace("float", "f"), _spread(r["times"]["lstmcy_fwd"]),
             _spread(r["times"]["torch_fwd"]), _x(r["ratios"]["fwd_ratio"]),
             (f"{_ms(r['times']['lstmcy_plan_bwd']['median'])} / "
              f"{_ms(r['times']['lstmcy_plan_fwd']['median'])}" if "lstmcy_plan_bwd" in r["times"] else "-"),
             _ref(r), f"{r['max_rel_err_vs_torch']:.1e}"] for r in cases]
    out.append(("Training forward, plans and the numpy reference", header, rows,
                ["plan = the same calls through one LSTMPlan; numpy = lstmcy.reference; max rel err = "
                 "the largest relative difference of any output from PyTorch's."]))

    packed = [r for r in cases if r["packed"]]
    if packed:
        header = ["case", "tokens / T·B", "lstmcy packed ms", "lstmcy padded ms",
                  "torch packed ms", "torch padded ms", "torch packed / lstmcy",
                  "lstmcy padded / packed", "torch packed / padded", "fwd padded / packed"]
        rows = []
        for r in packed:
            t, q = r["times"], r["ratios"]
            rows.append([r["name"], f"{r['tokens']} / {r['shape']['T'] * r['shape']['B']}",
                         _ms(t["lstmcy_bwd"]["median"]), _ms(t["lstmcy_padded_bwd"]["median"]),
                         _ms(t["torch_bwd"]["median"]), _ms(t["torch_padded_bwd"]["median"]),
                         _x(q["packed_vs_torch_packed"]), _x(q["packed_vs_own_padded"]),
                         _x(q["torch_packed_over_padded"]), _x(q["packed_fwd_vs_own_padded"])])
        out.append(("Variable-length batch (lengths spread 1..T): packed vs padded backward with the "
                    "same tokens", header, rows, []))

    header = ["case", "dtype", "target", "required", "measured", "met", "source"]
    rows = []
    for r in cases:
        for c in r.get("targets", []):
            metric = c["metric"]
            if metric == "bwd_efficiency":
                req, got = f">= {_pct(c['min'])} of peak", _pct(c["measured"])
            elif metric == "fwd_ratio" and c["min"] == 1.0:
                req, got = "> 1.00x", _x(c["measured"])
            else:
                req, got = f">= {c['min']:.2f}x", _x(c["measured"])
            rows.append([r["name"], r["dtype"].replace("float", "f"), metric, req, got,
                         ("yes" if c["met"] else "NO") if _graded(r) else "not graded", c["source"]])
    graded = [(r, c) for r in cases for c in r.get("targets", []) if _graded(r)]
    n_met = sum(1 for r, c in graded if c["met"])
    n_all = sum(len(r.get("targets", [])) for r in cases)
    title = f"Targets ({n_met} of {len(graded)} graded met"
    title += f"; {n_all - len(graded)} not graded: outside load)" if n_all > len(graded) else ")"
    out.append((title, header, rows,
                ["bwd_ratio / fwd_ratio = torch time / lstmcy time; bwd_efficiency = lstmcy backward "
                 "GF/s / GEMM peak. A case timed while other processes used more than "
                 f"{LOAD_LIMIT} cores is not graded."]))

    header = ["case", "fwd peak (results) MB", "bwd peak (results) MB", "plan fwd / bwd MB",
              "T·B·4H MB", "torch's top bwd op"]
    rows = []
    for r in cases:
        m = r["memory"]
        mp = r.get("memory_plan")
        rows.append([r["name"], f"{m['fwd_peak_bytes'] / 2**20:.2f} ({m['fwd_result_bytes'] / 2**20:.2f})",
                     f"{m['bwd_peak_bytes'] / 2**20:.2f} ({m['bwd_result_bytes'] / 2**20:.2f})",
                     (f"{mp['fwd_peak_bytes'] / 2**20:.2f} / {mp['bwd_peak_bytes'] / 2**20:.2f}"
                      if mp else "-"),
                     f"{m['T_B_4H_bytes'] / 2**20:.2f}", (r["torch_ops"]["bwd"] or ["-"])[0][:26]])
    out.append(("Memory per call (tracemalloc: numpy allocations, results included) and PyTorch's "
                "backward kernels", header, rows, ["peak = the most numpy memory a call held; results = "
                                                   "what it returned; plan = the same through an LSTMPlan."]))
    return out + peer_tables(doc)


# --------------------------------------------------------------------------- peers

def peer_names(cases):
    """``["torch", ...]`` and the other peers any case tried, in the order first seen."""
    names = ["torch"]
    for r in cases:
        names += [name for name in r.get("peers", {}) if name not in names]
    return names


def _peer_cell(r, name, value, fmt):
    """``fmt(value)`` for one peer in one case, or why it has no value."""
    if name != "torch":
        status = r["peers"].get(name)
        if status is None:
            return "-"
        if status["status"] != "ran":
            return "FAILED check" if status["status"] == "failed cross-check" else "error"
    return "-" if value is None else fmt(value)


def _median(r, name):
    """Median of a timed callable, or a derived time (``derived_times``), or None."""
    if name in r["times"]:
        return r["times"][name]["median"]
    return r.get("derived_times", {}).get(name)


def _ratio(r, name, kind):
    key = "bwd_ratio" if (name, kind) == ("torch", "bwd") else "fwd_ratio" if (name, kind) == ("torch", "fwd") \
        else f"{name}_{kind}_ratio"
    return r["ratios"].get(key)


def _gf(g):
    return f"{g:.1f}"


def peer_tables(doc):
    """Tables of the peer comparison (runs with ``--peers`` beyond torch); ``[]`` otherwise."""
    cases = [r for r in doc["cases"] if "peers" in r]
    if not cases:
        return []
    names = peer_names(cases)
    others = names[1:]
    meta_peers = doc["meta"].get("peers", {})
    labels = {name: st["label"] for r in cases for name, st in r["peers"].items() if "label" in st}
    out = []

    header = (["case", "T,B,I,H,L", "dtype", "lstmcy ms"] + [f"{n} ms" for n in names]
              + [f"{n}/lstmcy" for n in names])
    rows = []
    for r in cases:
        rows.append([r["name"], r["label"] + (" packed" if r["packed"] else ""), r["dtype"].replace("float", "f"),
                     _ms(r["times"]["lstmcy_fwdbwd"]["median"])]
                    + [_peer_cell(r, n, _median(r, f"{n}_fwdbwd"), _ms) for n in names]
                    + [_peer_cell(r, n, _ratio(r, n, "fwdbwd"), _x) for n in names])
    out.append(("Peers: forward+backward, one training step's gradients (median; peer time / lstmcy time, "
                "above 1: lstmcy is faster)", header, rows,
                ["lstmcy: lstm_forward(train=True) then lstm_backward; torch: nn.LSTM forward then "
                 "torch.autograd.grad; " + "; ".join(f"{n}: {labels[n]}" for n in others if n in labels) + ".",
                 "Same data, weights and cotangents for every framework, timed in the same interleaved "
                 f"rounds, {meta_peers.get('threads')} threads each ({_thread_note(meta_peers)})."]))
    header = ["case", "dtype", "lstmcy GF/s"] + [f"{n} GF/s" for n in names]
    rows = [[r["name"], r["dtype"].replace("float", "f"), _gf(r["gflops"]["lstmcy_fwdbwd"])]
            + [_peer_cell(r, n, r["gflops"].get(f"{n}_fwdbwd"), _gf) for n in names] for r in cases]
    out.append(("Peers: GF/s of forward+backward", header, rows,
                ["GF/s from 24·T·B·H·(I_l+H) per layer-direction (the forward and backward GEMMs)."]))

    derived = sorted({k.rsplit("_", 1)[0] for r in cases for k in r.get("derived_times", {})})
    for kind, title in (("bwd", "backward"), ("fwd", "training forward")):
        header = (["case", "dtype", f"lstmcy {kind} ms"] + [f"{n} {kind} ms" for n in names]
                  + [f"{n}/lstmcy {kind}" for n in names])
        rows = []
        for r in cases:
            rows.append([r["name"], r["dtype"].replace("float", "f"), _ms(r["times"][f"lstmcy_{kind}"]["median"])]
                        + [_peer_cell(r, n, _median(r, f"{n}_{kind}"), _ms)
                           + ("*" if kind == "bwd" and n in derived else "") for n in names]
                        + [_peer_cell(r, n, _ratio(r, n, kind), _x) for n in names])
        notes = []
        if kind == "bwd":
            notes.append("bwd: gradients from a saved forward (torch: autograd.grad(retain_graph=True); "
                         "JAX: the jitted vjp pullback).")
            if derived:
                notes.append("* " + ", ".join(derived) + ": (forward+backward) - forward, the difference of "
                             "the two medians (a GradientTape's backward cannot run apart from its forward).")
        else:
            notes.append("fwd: the training forward (JAX: jax.vjp's forward, residuals kept; Keras: the "
                         "forward alone, nothing kept for a backward).")
        out.append((f"Peers: {title} (median)", header, rows, notes))

    header = ["case", "dtype"] + [f"{n} max rel err (worst array)" for n in others]
    rows = []
    for r in cases:
        row = [r["name"], r["dtype"].replace("float", "f")]
        for n in others:
            st = r["peers"].get(n)
            if st is None:
                row.append("-")
            elif "check" not in st:
                row.append("error: " + st["error"][:80])
            else:
                c = st["check"]
                row.append(f"{c['max_rel_err']:.1e} ({c['worst']})" + ("" if c["ok"] else " FAILED"))
        rows.append(row)
    tolerances = sorted({(r["dtype"], st["check"]["tolerance"]) for r in cases
                         for st in r["peers"].values() if "check" in st})
    out.append(("Peers: cross-check against lstmcy before timing (outputs and every gradient)", header, rows,
                ["max over the arrays of max|peer - lstmcy| / max|lstmcy|; allowed: "
                 + ", ".join(f"{dt} {tol:g}" for dt, tol in tolerances) + "; a peer above it is not timed."]
                + [f"{n}: skipped, {why}" for n, why in meta_peers.get("skipped", {}).items()]))

    header = ["case", "dtype", "peer", "required", "measured", "met"]
    rows = [[r["name"], r["dtype"].replace("float", "f"), c["metric"].split("_")[0], "> 1.00x",
             _x(c["measured"]), "yes" if c["met"] else "NO"] for r in cases for c in r.get("peer_targets", [])]
    n_met = sum(1 for row in rows if row[-1] == "yes")
    out.append((f"Peer targets: forward+backward ahead of each peer ({n_met} of {len(rows)} met)",
                header, rows, []))
    return out


def _thread_note(meta_peers):
    parts = ["lstmcy and torch: --threads or the libraries' default"]
    for name, info in meta_peers.get("loaded", {}).items():
        if name == "jax":
            parts.append(f"JAX: NPROC={info.get('NPROC')}, XLA Eigen pool {info.get('xla_eigen_threads')}"
                         + (f", XLA_FLAGS={info['XLA_FLAGS']}" if info.get("XLA_FLAGS") else ""))
        elif name == "tf":
            parts.append(f"TF: intra-op {info.get('intra_op_threads')}, inter-op {info.get('inter_op_threads')}")
        else:
            parts.append(f"{name}: {info.get('threads')}")
    return "; ".join(parts)


def text_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _peak_lines(doc, detail=False):
    lines = []
    for dt, p in doc["peaks"].items():
        lines.append(f"{dt}: {p['peak_gflops']:.1f} GF/s ({p['best']}; best at start "
                     f"{p['start']['peak_gflops']:.1f}, at end {p['end']['peak_gflops']:.1f})")
        if detail:
            for when in ("start", "end"):
                lines.append(f"  {when}: {format_peaks({dt: p[when]}).split(' ', 1)[1]}")
    return lines


def _wrap(line, width=118):
    return textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False)


def text_report(doc):
    """The report as plain text, no line over 120 columns but a table's (which fit for the
    suite's cases)."""
    parts = ["GEMM peak (GF/s, same run):"] + [_wrap("  " + ln) for ln in _peak_lines(doc, detail=True)]
    for title, header, rows, notes in tables(doc):
        parts += ["", _wrap(title), text_table(header, rows)] + [_wrap(n) for n in notes]
    return "\n".join(parts)


def _run_line(meta, n_cases):
    git = meta.get("git") or {}
    commit = (git.get("commit") or "?")[:7] + (" + uncommitted kernel changes"
                                                 if git.get("kernel_changes_uncommitted") else "")
    proxy = (", AVX2 proxy: OpenBLAS Haswell, PyTorch AVX2" if meta.get("avx2_proxy") else "")
    if meta.get("lstmcy_kernels"):
        proxy = f", kernels {meta['lstmcy_kernels']}" + proxy
    return (f"run {meta['timestamp']} (lstmcy {commit}{proxy}): {n_cases} cases, {meta['repeats']} rounds, "
            f"threads={meta['threads'] or 'default'}, load average "
            f"{meta['loadavg_start'][0]:.2f} -> {meta['loadavg_end'][0]:.2f}, {meta['wall_s']:.0f} s")


def markdown_report(doc):
    parts = [f"- {_run_line(doc['meta'], len(doc['cases']))}"]
    parts += [f"  - GEMM peak {ln}" for ln in _peak_lines(doc)]
    for title, header, rows, notes in tables(doc):
        parts += ["", f"### {title}", "", md_table(header, rows)]
        if notes:
            parts += [""] + [f"- {n}" for n in notes]
    return "\n".join(parts)


def chart(doc, path):
    """Bar chart of torch/lstmcy backward and forward ratios and of efficiency; False without matplotlib.

    A run with peers beyond torch gets a third panel: each peer's forward+backward
    time over lstmcy's, and their GF/s.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cases = doc["cases"]
    names = [r["name"] for r in cases]
    xs = range(len(cases))
    with_peers = any("peers" in r for r in cases)
    fig, axes = plt.subplots(3 if with_peers else 2, 1, sharex=True,
                             figsize=(max(8, 0.6 * len(cases) + 3), 12 if with_peers else 8))
    ax1, ax2 = axes[:2]
    width = 0.4
    bwd = [r["ratios"]["bwd_ratio"] for r in cases]
    fwd = [r["ratios"]["fwd_ratio"] for r in cases]
    ax1.bar([x - width / 2 for x in xs], bwd, width, label="backward")
    ax1.bar([x + width / 2 for x in xs], fwd, width, label="training forward")
    for x, r in zip(xs, cases):
        for c in r.get("targets", []):
            if c["metric"] in ("bwd_ratio", "packed_vs_torch_packed"):
                ax1.plot([x - width, x], [c["min"]] * 2, color="black", lw=2)
    ax1.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax1.set_yscale("log")
    ax1.set_ylabel("torch time / lstmcy time")
    ax1.set_title("lstmcy vs PyTorch CPU (black ticks: backward targets)")
    ax1.legend()
    eff_cy = [100 * r["efficiency"]["lstmcy_bwd"] for r in cases]
    eff_pt = [100 * r["efficiency"]["torch_bwd"] for r in cases]
    ax2.bar([x - width / 2 for x in xs], eff_cy, width, label="lstmcy backward")
    ax2.bar([x + width / 2 for x in xs], eff_pt, width, label="torch backward")
    ax2.axhline(80, color="black", lw=0.8, ls="--")
    ax2.set_ylabel("% of GEMM peak (same run)")
    if with_peers:
        _peer_panel(axes[2], cases)
    axes[-1].set_xticks(list(xs))
    axes[-1].set_xticklabels(names, rotation=45, ha="right")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _peer_panel(ax, cases):
    """Bars of peer forward+backward time / lstmcy's per case (missing: not timed), GF/s on top."""
    names = peer_names(cases)
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs, ratios, gflops = [], [], []
        for x, r in enumerate(cases):
            ratio = r.get("ratios", {}).get(f"{name}_fwdbwd_ratio")
            if ratio is not None:
                xs.append(x - 0.4 + (k + 0.5) * width)
                ratios.append(ratio)
                gflops.append(r["gflops"][f"{name}_fwdbwd"])
        bars = ax.bar(xs, ratios, width, label=name)
        for bar, g in zip(bars, gflops):
            ax.annotate(f"{g:.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=6)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_ylabel("peer time / lstmcy time")
    ax.set_title("forward+backward vs peers (above 1: lstmcy faster; numbers: the peer's GF/s)")
    ax.legend()


METHOD = """\
Every number here comes from the result files named below, measured side by side in one
process: each case runs lstmcy and PyTorch in interleaved rounds on the same data, and a
table shows medians and the ratio of medians. The GEMM peak (the best of numpy, scipy and
PyTorch matrix products at 1024 and 2048, at the start and the end of the run) is the
scale for the efficiencies. The run records the cores other processes used during each
case; a case measured with more than 0.3 of them busy is not graded against its target.
OpenBLAS's `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE` are unset in the benchmark's own
command. What each script measures: `docs/benchmarks.md`. This file is written by
`benchmarks/report.py --results-md` from those files."""


def _machine_lines(meta):
    """The machine and libraries of a run, from its metadata (what is there)."""
    lines = []
    cpu = meta.get("cpu") or {}
    if cpu:
        caches = ", ".join(f"{k} {cpu[k]}" for k in ("L1d cache", "L2 cache", "L3 cache") if k in cpu)
        lines.append(f"- CPU: {cpu.get('Model name', '?')}, {cpu.get('CPU(s)', '?')} CPUs "
                     f"({cpu.get('Thread(s) per core', '?')} thread per core), SIMD "
                     f"{cpu.get('simd', '?')}" + (f", {caches}" if caches else "")
                     + (f"; hypervisor {cpu['Hypervisor vendor']}" if cpu.get("Hypervisor vendor") else ""))
    versions = {k: v for k, v in (meta.get("versions") or {}).items() if not k.endswith("_path")}
    if versions:
        lines.append("- " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return lines


def _ran_on(doc):
    """"Run on <machine> (lstmcy <commit>). " for a result file that names its machine (and
    commit), else ""."""
    if not doc.get("machine"):
        return ""
    commit = f" (lstmcy {doc['lstmcy']})" if doc.get("lstmcy") else ""
    return f"Run on {doc['machine']}{commit}. "


def scaling_table(doc):
    """Header and rows of a ``benchmarks/scaling.py --json`` file."""
    results = doc["results"]
    counts = [row["n"] for row in results[0]["rows"]] if results else []
    header = ["shape", "dtype"] + [f"{n} threads" for n in counts] + [
        "measured 1 -> 2", "bound at 8, 32", "split at 8", "unit step handoff us"]
    rows = []
    for r in results:
        by_n = {row["n"]: row for row in r["rows"]}
        bounds = [by_n[n]["bound"] if n in by_n else "?" for n in (8, 32)]
        rows.append([r["shape"], r["dtype"]] + [f"{row['speedup']:.2f}x" for row in r["rows"]]
                    + [f"{r['measured_1_to_2']:.2f}x", ", ".join(bounds),
                       by_n.get(8, {}).get("split", "?"), f"{r.get('handoff_us', 0.0):.1f}"])
    return header, rows


def scaling_section(doc):
    """Markdown of a ``benchmarks/scaling.py --json`` file."""
    return "\n".join([
        "## Predicted scaling to N threads (`benchmarks/scaling.py`)", "",
        "The kernels' task graphs, traced on one thread with the schedule of each thread "
        "count, replayed on N workers the way the kernels take tasks: predicted speed-up of "
        "forward + backward over one thread, beside the measured 1 -> 2 speed-up of the same "
        "calls (a check of the model). `span`: the recurrence (the critical path) bounds the "
        "call; `work`: the total work per worker does. `split at 8`: how the recurrence is "
        "split between 8 threads (row groups, or the hidden units of every step). A units "
        "split waits at every step for every part of the step before: each unit step counts "
        "the handoff measured for the shape on two threads (the units split really run, less "
        "its replay) on top of its traced time. The model leaves out shared caches, "
        f"memory bandwidth and frequency changes. {_ran_on(doc)}Load average {doc.get('load', '?')} "
        "at the start.",
        "", md_table(*scaling_table(doc))])


def contention_table(doc):
    """Header and rows of a ``benchmarks/contention.py`` run."""
    rows = [[r["shape"], r["dtype"], _ms(r["two"]), _ms(r["many"]), f"{r['many'] / r['two']:.3f}",
             _ms(r["loaded_one"]), _ms(r["loaded_auto"]), f"{r['loaded_auto'] / r['loaded_one']:.3f}"]
            for r in doc["results"]]
    return ["shape", "dtype", "2 threads ms", f"{_many(doc)} threads ms", "ratio",
            "busy: 1 thread ms", "busy: automatic ms", "ratio"], rows


def _many(doc):
    return doc["results"][-1]["many_threads"] if doc["results"] else None


def contention_section(doc):
    """Markdown of a ``benchmarks/contention.py`` run."""
    return "\n".join([
        "## More threads than cores, and cores another process holds (`benchmarks/contention.py`)", "",
        f"Training pass (forward + backward), medians of {doc['blocks']} alternating blocks of "
        f"{doc['per_block']} passes. Left: 2 threads "
        f"against {_many(doc)} on {doc.get('cpus', '?')} CPUs (target: within about 10 %). Right: with "
        f"a spinning process on every CPU, the automatic thread count against one thread "
        f"(target: at most 10 % slower). {_ran_on(doc)}Load average {doc.get('load', '?')} before "
        "the run.",
        "", md_table(*contention_table(doc))])


def estimators_section(doc):
    """Markdown of ``estimators.json`` (``benchmarks/bench_estimators.py``)."""
    from bench_estimators import TITLE, estimators_markdown

    return estimators_markdown(doc["records"], doc["datasets"], doc["meta"],
                               heading=f"## {TITLE} (`benchmarks/bench_estimators.py`)")


def ragged_section(doc):
    """Markdown of the ``ragged`` section of ``estimators.json`` (``--ragged``)."""
    from bench_estimators import RAGGED_TITLE, ragged_markdown

    return ragged_markdown(doc["records"], doc["meta"],
                           heading=f"## {RAGGED_TITLE} (`benchmarks/bench_estimators.py --ragged`)")


def dp_sgd_section(doc):
    """Markdown of the ``dp_sgd`` section of a headline run's file
    (``benchmarks/bench_dp_sgd.py --json``)."""
    from bench_dp_sgd import TITLE, markdown

    return markdown(doc["results"], doc["meta"]["argv"],
                    heading=f"## {TITLE} (`benchmarks/bench_dp_sgd.py`)",
                    meta=doc["meta"]).rstrip("\n")


def step_section(doc):
    """Markdown of the ``step`` section of a headline run's file
    (``benchmarks/bench_step.py --json``)."""
    from bench_step import TITLE, markdown

    return markdown(doc["results"], doc["meta"],
                    heading=f"## {TITLE} (`benchmarks/bench_step.py`)").rstrip("\n")


def _later_run(doc, title, about):
    """Markdown of a run of ``run.py`` kept as a section of the headline file."""
    argv = " ".join(doc["meta"].get("argv") or ["benchmarks/run.py"])
    return "\n".join([f"## {title}", "", about, "",
                      f"Measured with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python "
                      f"{argv}`, after the headline run.", ""]
                     + _machine_lines(doc["meta"]) + ["", markdown_report(doc).rstrip("\n")])


def small_calls_section(doc):
    """Markdown of the ``small_calls`` section of a headline run's file: a run of
    ``run.py`` on the small shapes (``--section small_calls``), newer than the headline."""
    return _later_run(doc, "Small calls (`benchmarks/run.py`, small shapes)",
                      "The suite's small shapes, measured again on the current code.")


def large_shapes_section(doc):
    """Markdown of the ``large_shapes`` section of a headline run's file (``run.py --shapes
    braun,large-256,deepbench-512,ptb-medium --section large_shapes``, run beside the AVX2
    proxy)."""
    return _later_run(doc, "Large shapes, measured again (`benchmarks/run.py`)",
                      "The large float32 shapes on this machine's own code paths, measured "
                      "within minutes of the AVX2 proxy below.")


def avx2_proxy_section(doc):
    """Markdown of the ``avx2_proxy`` section of a headline run's file (``run.py
    --avx2-proxy --section avx2_proxy``)."""
    return _later_run(
        doc, "Large shapes on the AVX2 code paths (`benchmarks/run.py --avx2-proxy`)",
        "lstmcy's AVX2 kernels, OpenBLAS's Haswell kernels and PyTorch's AVX2 code (ATen, "
        "MKL, oneDNN) on this AVX-512 machine, the GEMM peak measured the same way: the "
        "code an AVX2-only CPU runs, on cores that are not such a CPU's (their caches, and "
        "on Zen 4 the 256-bit units that also run AVX-512). A check of the AVX2 paths' "
        "efficiency, not a measurement of an AVX2 machine.")


#: The sections of RESULTS.md after the headline run: (result file, its section or None
#: for the file's own run, the Markdown of it).
SECTIONS = [("scaling", None, scaling_section), ("scaling", "contention", contention_section),
            ("estimators", None, estimators_section), ("estimators", "ragged", ragged_section),
            ("headline", "small_calls", small_calls_section),
            ("headline", "large_shapes", large_shapes_section),
            ("headline", "avx2_proxy", avx2_proxy_section),
            ("headline", "dp_sgd", dp_sgd_section), ("headline", "step", step_section)]


def results_md(doc, paths, scaling=None, estimators=None):
    """The whole of ``RESULTS.md`` for a headline run ``doc`` (with its ``dp_sgd`` section
    if present) and the ``scaling.json`` and ``estimators.json`` documents (each section
    present is cited); ``paths`` names the files (keys ``headline``, ``scaling``,
    ``estimators``) as cited."""
    files = {"headline": doc, "scaling": scaling, "estimators": estimators}
    meta = doc["meta"]
    argv = " ".join(meta.get("argv") or ["benchmarks/run.py"])
    parts = ["# Benchmark results", "", METHOD, "",
             "## Headline run", "",
             f"`{paths['headline']}`, measured with "
             f"`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python {argv}`.", ""]
    parts += _machine_lines(meta)
    parts += ["", markdown_report(doc)]
    for key, section, markdown in SECTIONS:
        source = files[key] if section is None else (files[key] or {}).get(section)
        if source is not None:
            where = f"`{paths[key]}`" + (f", section `{section}`" if section else "")
            parts += ["", markdown(source), "", f"From {where}."]
    return "\n".join(parts) + "\n"


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Markdown tables (and a chart) from a benchmark JSON file")
    parser.add_argument("json", help="a run's JSON file (run.py's)")
    parser.add_argument("--chart", default=None, help="also draw the PNG chart here")
    parser.add_argument("--text", action="store_true", help="plain-text tables instead of Markdown")
    parser.add_argument("--results-md", default=None, metavar="PATH",
                        help="write the whole RESULTS.md here (the JSON file is the headline run)")
    parser.add_argument("--scaling", default=None,
                        help="scaling.py's JSON file (with contention.py's section), for --results-md")
    parser.add_argument("--estimators", default=None,
                        help="bench_estimators.py's JSON file (with the ragged-data section), "
                             "for --results-md")
    args = parser.parse_args(argv)
    if args.results_md:
        paths = {"headline": args.json, "scaling": args.scaling, "estimators": args.estimators}
        docs = {key: _load(path) for key, path in paths.items() if path}
        text = results_md(docs.pop("headline"), paths, **docs)
        with open(args.results_md, "w") as fh:
            fh.write(text)
        return 0
    doc = _load(args.json)
    print(text_report(doc) if args.text else markdown_report(doc))
    if args.chart and not chart(doc, args.chart):
        print("matplotlib not importable: no chart", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
