"""On a Dask cluster a lost worker is Dask's business: a fit whose worker is
killed mid-fit (with the batch it held) completes with the weights of an
undisturbed fit, bit for bit, and leaves nothing on the cluster."""

import os
import signal
import time
import warnings

import joblib
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF

distributed = pytest.importorskip(
    "distributed", reason="needs dask.distributed (the dask extra) for a local Dask cluster"
)

X, Y = make_structured_data(n_samples=4)


class KillDaskWorkerAt:
    """A callback that kills (SIGKILL) the process of one Dask worker holding
    data after the given (stage, n_iter) iteration, as an OOM killer would."""

    def __init__(self, client, at):
        self.client, self.at = client, at
        self.killed = []  # the addresses of the workers killed

    def __call__(self, progress):
        if (progress.stage, progress.n_iter) != self.at:
            return
        holders = sorted(address for address, keys in self.client.has_what().items() if keys)
        pid = self.client.run(os.getpid, workers=holders[:1])[holders[0]]
        os.kill(pid, signal.SIGKILL)
        self.killed.append(holders[0])


def _fit(callback=None, n_jobs=2):
    model = MarginalCRF(n_iter=2, max_iter=6, init="zeros", n_jobs=n_jobs, callback=callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, Y)


def test_a_dask_fit_survives_a_killed_worker_with_the_same_weights():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
    )
    with cluster, distributed.Client(cluster) as client:
        killer = KillDaskWorkerAt(client, ("fit", 2))
        with joblib.parallel_config(backend="dask"):
            model = _fit(killer)
        assert len(killer.killed) == 1  # a worker holding a batch died mid-fit
        assert model.n_iter_ > 2  # and the fit went on past it
        # nothing is left on the cluster: the batches packed for the fit are released
        deadline = time.monotonic() + 10  # releases travel asynchronously
        while any(client.has_what().values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(client.has_what().values())
    undisturbed = _fit(n_jobs=1)
    np.testing.assert_array_equal(model.unary_coef_, undisturbed.unary_coef_)
    np.testing.assert_array_equal(model.pairwise_coef_, undisturbed.pairwise_coef_)
    assert model.loss_curve_ == undisturbed.loss_curve_
