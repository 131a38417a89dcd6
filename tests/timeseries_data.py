"""UCR/UEA datasets packaged with sktime or aeon, for the tests of the estimators' defaults
and of the sktime and aeon adapters (nothing is downloaded)."""
import warnings

import numpy as np
import pytest

PACKAGED = ("BasicMotions", "JapaneseVowels", "GunPoint", "ArrowHead", "ItalyPowerDemand")

_AEON_LOADERS = {"BasicMotions": "load_basic_motions", "JapaneseVowels": "load_japanese_vowels",
                 "GunPoint": "load_gunpoint", "ArrowHead": "load_arrow_head",
                 "ItalyPowerDemand": "load_italy_power_demand"}


def packaged(name, split):
    """``(X, y)`` of a packaged dataset, channels first: a 3-D ``(n, channels, timepoints)``
    array, or a list of ``(channels, timepoints_i)`` arrays for unequal lengths. Skips the
    test when neither sktime nor aeon is installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from sktime.datasets import load_UCR_UEA_dataset
        except ImportError:
            pass
        else:
            try:
                X, y = load_UCR_UEA_dataset(name, split=split, return_type="numpy3D")
            except ValueError:  # unequal lengths
                frame, y = load_UCR_UEA_dataset(name, split=split, return_type="nested_univ")
                X = [np.stack([np.asarray(frame.iloc[i, c], dtype=float)
                               for c in range(frame.shape[1])]) for i in range(len(frame))]
            return X, np.asarray(y)
        try:
            import aeon.datasets
        except ImportError:
            pytest.skip("the UCR/UEA datasets come with sktime or aeon, and neither is "
                        "installed (pip install sktime, or aeon)")
        X, y = getattr(aeon.datasets, _AEON_LOADERS[name])(split=split)
        return X, np.asarray(y)


def standardized_per_channel(X_train, X_test):
    """Both sets standardised with each channel's mean and standard deviation over the
    training set's time points, as a user would before fitting."""
    values = np.concatenate(list(X_train), axis=-1)  # (channels, all training time points)
    mean = values.mean(axis=1, keepdims=True)
    std = values.std(axis=1, keepdims=True)
    return [[(x - mean) / std for x in X] if isinstance(X, list) else (X - mean) / std
            for X in (X_train, X_test)]
