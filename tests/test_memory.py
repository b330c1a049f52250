"""Memory refused up front: a fit whose estimated peak memory exceeds the
memory available is refused before it starts, with the estimate, the memory
available and the remedies; normal fits are not refused."""

import re
import time
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf._memory import AVAILABLE_MEMORY_ENV, available_memory

X, Y = make_structured_data(n_samples=2, shape=(60, 60))


def _fit(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, Y)


def _needed(error):
    """The estimate (MiB) stated by a refusal."""
    value, unit = re.search(r"needs an estimated ([\d.e+]+) (\w+)", str(error.value)).groups()
    return float(value) * {"KiB": 2**-10, "MiB": 1, "GiB": 2**10}[unit]


def test_an_impossible_fit_is_refused_in_milliseconds(monkeypatch):
    monkeypatch.delenv(AVAILABLE_MEMORY_ENV, raising=False)
    _fit(MarginalCRF(n_iter=2, max_iter=1, n_jobs=2))  # compiled, and a normal fit is not refused
    start = time.perf_counter()
    with pytest.raises(MemoryError) as error:
        # every snapshot of 10**6 iterations kept: 2 * 7080 * 2 float64 (x 2 for m ** rho) each, 450 GiB per image
        MarginalCRF(n_iter=10**6, checkpoints=10**6, n_jobs=2).fit(X, Y)
    assert time.perf_counter() - start < 0.5
    message = str(error.value)
    assert _needed(error) > 2 * 400 * 2**10
    assert re.search(r"but [\d.]+ GiB is available \(", message)
    assert "2 worker(s) at once" in message and "1000000 snapshots of the messages" in message
    for remedy in ("lower n_jobs (now 2", "set checkpoints=", "dtype=np.float32", AVAILABLE_MEMORY_ENV):
        assert remedy in message


def test_the_memory_available_can_be_set_and_the_remedies_work(monkeypatch):
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, "1e5")
    with pytest.raises(MemoryError, match=rf"but 97.7 KiB is available \({AVAILABLE_MEMORY_ENV}=1e5\)") as error:
        MarginalCRF(n_iter=40).fit(X, Y)
    assert "lower n_jobs" not in str(error.value)  # one worker
    full = _needed(error)
    with pytest.raises(MemoryError) as error:
        MarginalCRF(n_iter=40, checkpoints=3).fit(X, Y)
    assert _needed(error) < full - 1  # fewer snapshots
    # between the two estimates: refused with every snapshot, fitted with three
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, str(int((_needed(error) + 0.5) * 2**20)))
    with pytest.raises(MemoryError):
        MarginalCRF(n_iter=40, max_iter=1).fit(X, Y)
    model = _fit(MarginalCRF(n_iter=40, max_iter=1, checkpoints=3))
    assert np.all(np.isfinite(model.pairwise_coef_))


def test_the_memory_available_is_read_from_the_system(monkeypatch):
    monkeypatch.delenv(AVAILABLE_MEMORY_ENV, raising=False)
    available, source = available_memory()
    assert available > 2**20 and source
    monkeypatch.setenv(AVAILABLE_MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match=f"{AVAILABLE_MEMORY_ENV} must be a number of bytes, got 'lots'"):
        available_memory()
