"""Callbacks for :class:`~sklearn_margcrf.MarginalCRF` (its ``callback`` parameter).

:class:`Checkpoint` saves the weights and the progress of a long fit every
few L-BFGS iterations, so that a fit killed at any point resumes from its last
save with one line::

    checkpoint = Checkpoint("fit.npz", every=50)
    model = MarginalCRF(callback=checkpoint)
    model.fit(X, y, **checkpoint.fit_params())   # the same line starts and resumes

``fit_params()`` is empty while nothing is saved (a fresh fit) and gives the
saved weights as ``unary_coef_init`` / ``pairwise_coef_init`` afterwards.
"""

import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from . import __version__

__all__ = ["Checkpoint", "SavedFit"]


@dataclass(frozen=True)
class SavedFit:
    """What a :class:`~sklearn_margcrf.callbacks.Checkpoint` wrote: the
    weights after ``n_iter`` L-BFGS iterations of ``stage`` (see
    ``MarginalCRF(callback=...)``), the objective there, the seconds since
    the start of that ``fit``, the estimator's parameters (JSON values;
    others as their ``repr``), the package version and ``stage_index``, the
    stage's place in the fit's schedule (None in an initialising fit, and
    in saves of versions before it was recorded)."""

    unary_coef: np.ndarray
    pairwise_coef: np.ndarray
    stage: str
    n_iter: int
    objective: float
    elapsed: float
    params: dict
    version: str
    stage_index: object = None

    def fit_params(self, step=None):
        """The keyword arguments of ``MarginalCRF.fit`` that resume from this
        save: the weights, and ``stage_init=(stage_index, n_iter)`` when it
        was made in a stage of the fit's schedule, so that the resumed fit
        runs the rest of that stage and the later ones (its ``max_iter``,
        ``incremental`` and ``random_state`` must be the saved fit's). A
        save made in an initialising fit gives the weights only: the fit
        starts from them without the initialising fits. ``step`` names the
        estimator's step in a Pipeline (the keys are then
        ``"<step>__unary_coef_init"``, ...)."""
        prefix = "" if step is None else f"{step}__"
        params = {
            f"{prefix}unary_coef_init": self.unary_coef.copy(),
            f"{prefix}pairwise_coef_init": self.pairwise_coef.copy(),
        }
        if self.stage_index is not None:
            params[f"{prefix}stage_init"] = (int(self.stage_index), int(self.n_iter))
        return params


def _json_value(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class Checkpoint:
    """Save the weights and progress of a fit to ``path`` every ``every`` L-BFGS
    iterations (``MarginalCRF(callback=Checkpoint(path))``).

    Each save replaces ``path`` atomically: the file is written in full to a
    temporary file in the same folder, flushed to disk and renamed over
    ``path``, so that a fit killed at any moment leaves the previous save or
    the new one, never a partial file. Saves happen in every stage of the fit
    (the initialising fits of ``init="independent"`` included). A fit
    resumed from a save (:meth:`fit_params`) starts L-BFGS from those
    weights without the initialising fits and without L-BFGS's curvature
    memory, in the stage of the schedule where the save was made, with that
    stage's remaining iterations, then runs the later stages (those of
    ``incremental``): the fit's budget is the same as without the
    interruption. One file holds one fit: concurrent fits (``GridSearchCV``
    clones, say) need files of their own.

    Parameters
    ----------
    path : str or path-like
        The ``.npz`` file written (read back with :meth:`load`).
    every : int, default=50
        L-BFGS iterations between saves.

    Examples
    --------
    >>> checkpoint = Checkpoint("fit.npz", every=50)            # doctest: +SKIP
    >>> model = MarginalCRF(callback=checkpoint)                # doctest: +SKIP
    >>> model.fit(X, y, **checkpoint.fit_params())              # doctest: +SKIP
    """

    def __init__(self, path, every=50):
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.path = os.fspath(path)
        self.every = int(every)

    def __repr__(self):
        return f"Checkpoint({self.path!r}, every={self.every})"

    def __call__(self, progress):
        """Save on every ``every``-th iteration of a stage; never stops the fit."""
        if progress.n_iter % self.every == 0:
            self.save(progress)
        return False

    def save(self, progress):
        """Write ``progress`` (a ``MarginalCRF`` callback report) to ``path`` atomically."""
        meta = {
            "stage": progress.stage,
            "stage_index": progress.get("stage_index"),
            "n_iter": int(progress.n_iter),
            "objective": float(progress.objective),
            "elapsed": float(progress.elapsed),
            "params": {key: _json_value(value) for key, value in progress.get("params", {}).items()},
            "version": __version__,
        }
        folder = os.path.dirname(os.path.abspath(self.path))
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".checkpoint-", suffix=".npz.tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                np.savez(
                    file, unary_coef=np.asarray(progress.unary_coef, dtype=np.float64),
                    pairwise_coef=np.asarray(progress.pairwise_coef, dtype=np.float64),
                    progress=np.array(json.dumps(meta)),
                )
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        _sync_folder(folder)

    @staticmethod
    def load(path):
        """The :class:`SavedFit` at ``path`` (FileNotFoundError when there is none)."""
        with np.load(os.fspath(path), allow_pickle=False) as data:
            meta = json.loads(str(data["progress"]))
            return SavedFit(unary_coef=data["unary_coef"], pairwise_coef=data["pairwise_coef"], **meta)

    def fit_params(self, step=None):
        """``MarginalCRF.fit`` keyword arguments that resume from the last save,
        or ``{}`` when nothing is saved yet (see :meth:`SavedFit.fit_params`)."""
        if not os.path.exists(self.path):
            return {}
        return self.load(self.path).fit_params(step)


def _sync_folder(folder):
    """Make the rename durable (POSIX); nothing to do where folders cannot be opened."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
