"""Exceptions and warnings of sklearn_margcrf."""

from sklearn.exceptions import InconsistentVersionWarning as _SklearnInconsistentVersionWarning

__all__ = [
    "BackpropDivergenceError", "BackpropFallbackWarning", "InconsistentVersionWarning", "WorkerLostError",
    "WorkerLostWarning",
]


class BackpropDivergenceError(RuntimeError):
    """Stack-free back-propagation at the converged messages did not converge.

    The reverse sweeps of Eaton and Ghahramani's scheme converge at the rate
    of the forward iteration near an attractive fixed point; when inference
    stopped at a loose threshold away from one, they can grow without bound.
    """


class BackpropFallbackWarning(RuntimeWarning):
    """``gradient_mode="backprop"`` differentiated the stored forward iterations instead.

    Raised as a warning when the stack-free reverse sweeps diverged: the
    gradient was then computed by back TRW / back mean field through exactly
    the iterations inference ran (the exact gradient of the reported loss).
    """


class WorkerLostWarning(RuntimeWarning):
    """A joblib worker process died during ``MarginalCRF.fit``; fresh workers
    recomputed that evaluation, so the fit is unchanged.

    The usual cause is the operating system killing a worker that ran out of
    memory; the message names the remedies.
    """


class WorkerLostError(RuntimeError):
    """A second joblib worker process died in the same ``MarginalCRF.fit``
    (or one died during prediction): the fit stops rather than lose workers
    again. The message names the likely cause and the remedies."""


class InconsistentVersionWarning(_SklearnInconsistentVersionWarning):
    """An estimator is unpickled under another sklearn_margcrf version than
    the one that pickled it.

    A subclass of scikit-learn's own warning, so one filter on
    :class:`sklearn.exceptions.InconsistentVersionWarning` covers both
    packages.

    Parameters
    ----------
    estimator_name : str
    current_version : str
        ``sklearn_margcrf.__version__`` now.
    original_version : str or None
        The version that pickled the estimator (None: not recorded, from
        before versions were recorded).
    """

    def __init__(self, *, estimator_name, current_version, original_version):
        Warning.__init__(self)
        self.estimator_name = estimator_name
        self.current_version = current_version
        self.original_version = original_version

    def __str__(self):
        original = "an unrecorded version" if self.original_version is None else f"version {self.original_version}"
        return (
            f"Trying to unpickle estimator {self.estimator_name} from sklearn_margcrf {original} when using "
            f"version {self.current_version}. This might lead to breaking code or invalid results; refit the "
            "model under this version, or install the version it was made with."
        )
