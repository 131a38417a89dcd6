"""Progress lines of a verbose fit in :mod:`lstmcy.estimators`.

One line when training starts (how many samples, the held-out part, batches per epoch),
one line per epoch (loss, validation loss and score, elapsed time, an upper bound on the
time left), a line inside an epoch once ``LSTMCY_PROGRESS_INTERVAL`` seconds (30 by
default) have passed since the last line, and one line when training stops.
"""
import os
import time

__all__ = ["FitProgress"]

#: Seconds without a line after which a long epoch reports how far it got, unless the
#: environment variable ``LSTMCY_PROGRESS_INTERVAL`` gives another number.
DEFAULT_INTERVAL = 30.0


def progress_interval(environ=os.environ):
    """Seconds between the lines inside an epoch: ``LSTMCY_PROGRESS_INTERVAL`` when it is a
    number >= 0, else :data:`DEFAULT_INTERVAL`."""
    try:
        seconds = float(environ.get("LSTMCY_PROGRESS_INTERVAL", DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return seconds if seconds >= 0 else DEFAULT_INTERVAL


def format_seconds(seconds):
    """``12.3 s`` below a minute, else ``m:ss`` (or ``h:mm:ss``)."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{minutes}:{seconds:02d}"


class FitProgress:
    """Prints the progress of one call to ``fit`` or ``partial_fit``.

    Parameters
    ----------
    name : str
        The estimator's class name.
    max_epochs : int
        Epochs this call runs at most (the bound of the time-left estimate).
    first_epoch : int
        Number of the first epoch of this call (warm start and partial_fit continue).
    n_batches : int
        Mini-batches per epoch.
    out : callable, default=print
    interval : float or None, default=None
        Seconds without a line after which a long epoch reports the batch reached (None:
        :func:`progress_interval`).
    """

    def __init__(self, name, max_epochs, first_epoch, n_batches, out=print, interval=None):
        self.name = name
        self.max_epochs = max_epochs
        self.first_epoch = first_epoch
        self.n_batches = n_batches
        self.out = out
        self.interval = progress_interval() if interval is None else interval
        self.start = time.perf_counter()
        self.last_line = self.start
        self.epochs_done = 0

    def _print(self, line):
        self.out(line)
        self.last_line = time.perf_counter()

    def begin(self, n_train, n_validation, batch_size):
        """The first line: the data, the batches and the epochs this call runs (numbered
        as the epoch lines are, when it continues a fitted model)."""
        held_out = (f", {n_validation} held out for early stopping" if n_validation
                    else ", no early stopping")
        last = self.first_epoch + self.max_epochs - 1
        if self.max_epochs == 1:
            epochs = f"1 epoch (epoch {last})" if self.first_epoch > 1 else "1 epoch"
        else:
            epochs = f"at most {self.max_epochs} epochs" + (
                f" (epochs {self.first_epoch} to {last})" if self.first_epoch > 1 else "")
        self._print(f"{self.name}: {n_train} training sequences{held_out}; batch size "
                    f"{batch_size}, {self.n_batches} steps per epoch, {epochs}")

    def batch_done(self, epoch, batch):
        """Report the position inside a long epoch (at most every ``interval`` s)."""
        now = time.perf_counter()
        if now - self.last_line >= self.interval:
            self._print(f"epoch {epoch:>4}: batch {batch}/{self.n_batches}, "
                        f"{format_seconds(now - self.start)} elapsed")

    def epoch_done(self, epoch, loss, validation_loss=None, validation_score=None,
                   best=False):
        self.epochs_done += 1
        elapsed = time.perf_counter() - self.start
        left = (self.max_epochs - self.epochs_done) * elapsed / self.epochs_done
        last = self.first_epoch + self.max_epochs - 1
        line = f"epoch {epoch:>4}/{last}  loss {loss:.4f}"
        if validation_loss is not None:
            line += (f"  validation loss {validation_loss:.4f} score {validation_score:.4f}"
                     f"{' *' if best else '  '}")
        line += f"  {format_seconds(elapsed)} elapsed"
        if self.epochs_done < self.max_epochs:
            line += f", at most {format_seconds(left)} left"
        self._print(line)

    def note(self, message):
        """A line about the fit (a change of the learning rate)."""
        self._print(message)

    def end(self, message):
        self._print(f"{message} ({format_seconds(time.perf_counter() - self.start)} in all)")
