"""A joblib worker process that dies during a fit: the fit warns, starts fresh
workers and recomputes that evaluation (same weights as an undisturbed fit);
a second loss in the same fit is a clear error. Nothing is left behind."""

import time
import warnings

import joblib
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.exceptions import WorkerLostError, WorkerLostWarning

psutil = pytest.importorskip("psutil")

X, Y = make_structured_data(n_samples=4)
REMEDIES = r"lower n_jobs \(now 2\), set checkpoints= .* or use dtype=np.float32"


class KillWorkerAt:
    """A callback that kills one loky worker of this process after the given
    (stage, n_iter) iterations, as the operating system's OOM killer would."""

    def __init__(self, *at, folder=None):
        self.at = set(at)
        self.killed = 0
        self.folder = folder
        self.files = []  # (name, inode, modification time) of the batch files at each iteration

    def __call__(self, progress):
        if self.folder is not None:
            self.files.append(sorted(
                (path.name, path.stat().st_ino, path.stat().st_mtime_ns) for path in self.folder.rglob("*") if path.is_file()
            ))
        if (progress.stage, progress.n_iter) in self.at:
            workers = [p for p in psutil.Process().children(recursive=True) if "popen_loky" in " ".join(p.cmdline())]
            workers[0].kill()
            workers[0].wait(timeout=30)
            time.sleep(0.5)  # loky's manager thread notices the death before the next evaluation
            self.killed += 1


def _fit(callback=None, n_jobs=2):
    model = MarginalCRF(n_iter=2, max_iter=6, init="zeros", n_jobs=n_jobs, callback=callback)
    with warnings.catch_warnings(), joblib.parallel_config(backend="loky"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, Y)


def test_a_fit_survives_one_lost_worker_with_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path))
    killer = KillWorkerAt(("fit", 2), folder=tmp_path)
    with pytest.warns(WorkerLostWarning, match="worker process died during fit, most likely killed .* memory") as caught:
        model = _fit(killer)
    assert killer.killed == 1 and len([w for w in caught if w.category is WorkerLostWarning]) == 1
    assert "fresh workers recomputed that evaluation" in str(caught[0].message)
    # the fresh workers mapped the same batch files: packed and written once
    assert len(killer.files) == model.n_iter_ and len(killer.files[0]) == 8  # two batches of four arrays
    assert all(files == killer.files[0] for files in killer.files)
    undisturbed = _fit(n_jobs=1)
    np.testing.assert_array_equal(model.unary_coef_, undisturbed.unary_coef_)
    np.testing.assert_array_equal(model.pairwise_coef_, undisturbed.pairwise_coef_)
    assert model.loss_curve_ == undisturbed.loss_curve_
    assert list(tmp_path.iterdir()) == []  # the batch folder is gone


def test_a_second_lost_worker_stops_the_fit_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path))
    with pytest.warns(WorkerLostWarning), pytest.raises(WorkerLostError, match="for the second time.*" + REMEDIES):
        _fit(KillWorkerAt(("fit", 1), ("fit", 3)))
    assert list(tmp_path.iterdir()) == []
    _fit()  # and the next fit gets fresh workers
