"""``lstmcy demo``: train :class:`~lstmcy.estimators.LSTMClassifier` on scikit-learn's digits.

Each 8x8 digit image is read row by row: a sequence of 8 steps with 8 features. The data
ships with scikit-learn, so nothing is downloaded.
"""
import time

import numpy as np

DEFAULT_PLOT = "lstmcy_demo_loss.png"
_SPARK = " .:-=+*#%@"


def sparkline(values, width=60):
    """A one-line text plot of ``values`` (high values are dense characters)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return ""
    if values.size > width:  # keep the last value, sample the rest evenly
        values = values[np.linspace(0, values.size - 1, width).round().astype(int)]
    low, high = float(values.min()), float(values.max())
    span = high - low or 1.0
    levels = ((values - low) / span * (len(_SPARK) - 1)).round().astype(int)
    return "".join(_SPARK[level] for level in levels)


def save_loss_plot(loss_curve, path):
    """Save the loss curve as a PNG with matplotlib; return False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(np.arange(1, len(loss_curve) + 1), loss_curve, marker="o")
    axes.set_xlabel("epoch")
    axes.set_ylabel("training loss (cross-entropy + L2)")
    axes.set_yscale("log")
    axes.set_title("lstmcy demo: LSTMClassifier on digits")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def run_demo(*, hidden_size=64, max_iter=30, learning_rate=0.01, batch_size=64, seed=0,
             time_budget=50.0, plot=DEFAULT_PLOT, verbose=True, out=print):
    """Train on 75% of digits, report held-out accuracy on the rest.

    Training runs one :meth:`~lstmcy.estimators.LSTMClassifier.partial_fit` epoch at a
    time and stops after ``max_iter`` epochs or once ``time_budget`` seconds are used.

    Parameters
    ----------
    hidden_size, learning_rate, batch_size : int, float, int
        Model and optimiser settings.
    max_iter : int
        Maximum number of epochs.
    seed : int
        Seeds the split, the initialisation and the shuffling.
    time_budget : float or None
        Stop starting new epochs after this many seconds of training.
    plot : str or None
        Where to save the loss curve PNG (when matplotlib is installed); None skips it.
    verbose : bool
        Print one line per epoch.
    out : callable
        Where lines go (``print``).

    Returns
    -------
    dict
        ``accuracy``, ``seconds`` (training), ``epochs``, ``loss_curve``, ``plot`` (path
        written or None), ``n_train``, ``n_test``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from lstmcy.estimators import LSTMClassifier

    digits = load_digits()
    X = digits.images / 16.0  # (n, 8 rows = time steps, 8 columns = features)
    y = digits.target
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=seed, stratify=y)
    out(f"Digits: {len(X_train)} training and {len(X_test)} held-out images, each read row by "
        f"row as {X.shape[1]} steps x {X.shape[2]} features")
    # The pixels are already in [0, 1]. Standardised, the edge columns (almost always
    # blank) would get values of up to 200 where they have ink: too large for the
    # learning rate of 0.01 this demo trains with.
    clf = LSTMClassifier(hidden_size=hidden_size, learning_rate_init=learning_rate,
                         batch_size=batch_size, random_state=seed, verbose=False,
                         standardize=False)
    out(f"Training {clf!r}")
    classes = np.unique(y)
    start = time.perf_counter()
    for epoch in range(1, max_iter + 1):
        epoch_start = time.perf_counter()
        clf.partial_fit(X_train, y_train, classes=classes)
        if verbose:
            now = time.perf_counter()
            out(f"epoch {epoch:3d}/{max_iter}: loss = {clf.loss_curve_[-1]:.4f}, "
                f"{now - epoch_start:.2f} s (total {now - start:.1f} s)")
        if time_budget is not None and time.perf_counter() - start > time_budget:
            out(f"time budget of {time_budget:g} s reached after {epoch} epochs")
            break
    seconds = time.perf_counter() - start
    accuracy = clf.score(X_test, y_test)
    out(f"Held-out accuracy: {accuracy:.2%} on {len(X_test)} images "
        f"({clf.n_iter_} epochs, {seconds:.1f} s of training)")
    out(f"Loss curve: {clf.loss_curve_[0]:.3f} |{sparkline(clf.loss_curve_)}| "
        f"{clf.loss_curve_[-1]:.4f}")
    written = None
    if plot:
        if save_loss_plot(clf.loss_curve_, plot):
            written = plot
            out(f"Loss curve saved to {plot}")
        else:
            out("matplotlib is not installed: no PNG (pip install matplotlib)")
    return {"accuracy": accuracy, "seconds": seconds, "epochs": clf.n_iter_,
            "loss_curve": list(clf.loss_curve_), "plot": written,
            "n_train": len(X_train), "n_test": len(X_test)}
