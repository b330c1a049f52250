"""Scores of structured predictions, over the labelled nodes of all samples.

The marginals are the product of marginal-based learning, so models can be
selected on their calibration as well as on their accuracy.

Plain functions take lists (one entry per sample) of label arrays and of
marginals; unlabelled nodes (-1 in integer labels, None in object arrays) are
ignored. Labels and marginals of one sample may have any matching spatial
shape: (n,) and (n, K), or (H, W) and (H, W, K). Labels may be of any type
(as for :class:`~sklearn_margcrf.MarginalCRF`); the marginals' last axis
follows ``classes`` (the estimator's ``classes_``), or, without ``classes``,
the labels are the integers ``0 .. K-1``. The scorers encode ``y`` with the
fitted estimator's ``classes_`` and hand the functions integer codes.

Scorers are callables ``scorer(estimator, X, y)`` (greater is better), usable
as ``scoring=`` in :class:`~sklearn.model_selection.GridSearchCV`, alone or in
a dict for multi-metric search::

    GridSearchCV(pipe, grid, scoring=get_scorer("neg_marginal_log_loss"))
    GridSearchCV(pipe, grid, refit="node_accuracy",
                 scoring={name: get_scorer(name) for name in ("node_accuracy", "neg_marginal_log_loss")})

============================  ===================================  ==================================
name (``SCORERS`` key)        object                               function
============================  ===================================  ==================================
``node_accuracy``             ``node_accuracy_scorer``             :func:`node_accuracy`
``neg_hamming_error``         ``neg_hamming_error_scorer``         ``-`` :func:`hamming_error`
``neg_marginal_log_loss``     ``neg_marginal_log_loss_scorer``     ``-`` :func:`marginal_log_loss`
``neg_marginal_brier_score``  ``neg_marginal_brier_score_scorer``  ``-`` :func:`marginal_brier_score`
============================  ===================================  ==================================

(``neg_log_loss_scorer`` and ``neg_brier_score_scorer`` are older names of
the same objects.)

Why scikit-learn's scorer names do not work
-------------------------------------------
``GridSearchCV(scoring="accuracy")`` or ``scoring="neg_log_loss"`` looks the
name up in scikit-learn's own registry, whose scorers compare ``y`` with the
predictions as single flat arrays, one label per row of ``X``. Here ``y`` is a
list of label arrays, one per image, of different sizes and with -1 for
unlabelled nodes, and ``predict_proba`` returns one (H, W, K) array per image:
scikit-learn cannot tell what kind of target that is ("unknown is not
supported") or cannot stack it, and would count unlabelled nodes if it could.
Pass the scorer objects of this module instead (:func:`get_scorer` finds them
by name).

Where they score: the CRF grid or the image
-------------------------------------------
With features at ``scale < 1`` the CRF grid is coarser than the image, and
``MarginalCRF.predict_proba`` upsamples its marginals to the image size. The
scorers offer both (``resolution``):

- ``"grid"`` (the default, the ``SCORERS``): on a
  :class:`~sklearn_margcrf.MarginalCRF`, or a :class:`~sklearn.pipeline.Pipeline`
  ending in one, they score the nodes of each sample, like
  ``MarginalCRF.score``: labels given at image size are reduced to the grid
  (nearest neighbour). This is what the model was fitted on, and it is cheap.
- ``"image"`` (``get_scorer(name, resolution="image")``): they score what
  ``predict_proba`` / ``predict`` answer, at the image size, against labels at
  the image size; the paper's error rates on the backgrounds data are of this
  kind.

With ``scale=1`` both agree. On estimators that are not a CRF both score
what ``predict_proba`` returns.
"""

import numpy as np
from sklearn.pipeline import Pipeline

from ._graph import _as_labels, encode_labels, split_labels
from .sample import labels_to_grid

__all__ = [
    "SCORERS",
    "get_scorer",
    "hamming_error",
    "make_structured_scorer",
    "marginal_brier_score",
    "marginal_log_loss",
    "neg_brier_score_scorer",
    "neg_hamming_error_scorer",
    "neg_log_loss_scorer",
    "neg_marginal_brier_score_scorer",
    "neg_marginal_log_loss_scorer",
    "node_accuracy",
    "node_accuracy_scorer",
]


def _check_lists(y_true, y_other, name):
    if len(y_true) != len(y_other):
        raise ValueError(f"y_true has {len(y_true)} samples but {name} has {len(y_other)}")
    if len(y_true) == 0:
        raise ValueError("no samples to score")


def _flat_labels(labels, size, k, name, n_states=None, classes=None):
    """Integer codes (-1 = unlabelled) of ``y_true[k]``: its labels
    themselves (integers in [0, n_states)), or their indices in ``classes``."""
    labels = np.asarray(labels)
    if labels.size != size:
        raise ValueError(
            f"y_true[{k}] has {labels.size} labels (shape {labels.shape}) but {name}[{k}] has {size} entries"
        )
    if classes is not None:
        return encode_labels(labels, np.asarray(classes), f"y_true[{k}]").reshape(-1)
    return _as_labels(labels, f"y_true[{k}]", n_states).reshape(-1)


def _labelled(y_true, marginals, classes=None):
    """Stack the labelled nodes: (labels (N,), marginals (N, K))."""
    _check_lists(y_true, marginals, "marginals")
    labels_out, marg_out = [], []
    n_states = None
    for k, (labels, mu) in enumerate(zip(y_true, marginals)):
        mu = np.asarray(mu, dtype=np.float64)
        if mu.ndim < 2:
            raise ValueError(f"marginals[{k}] must have a trailing axis of K states, got shape {mu.shape}")
        if n_states is None:
            n_states = mu.shape[-1]
        elif mu.shape[-1] != n_states:
            raise ValueError(f"marginals[{k}] has {mu.shape[-1]} states but marginals[0] has {n_states}")
        mu = mu.reshape(-1, n_states)
        if classes is not None and len(classes) != n_states:
            raise ValueError(f"classes has {len(classes)} labels but marginals[{k}] has {n_states} states")
        flat = _flat_labels(labels, mu.shape[0], k, "marginals", n_states, classes)  # n_states: the marginals' K
        observed = flat >= 0
        labels_out.append(flat[observed])
        marg_out.append(mu[observed])
    labels_out = np.concatenate(labels_out)
    if labels_out.size == 0:
        raise ValueError("y_true has no labelled node (every label is -1): nothing to score")
    return labels_out, np.concatenate(marg_out)


def hamming_error(y_true, y_pred):
    """Fraction of labelled nodes whose predicted label is wrong.

    Parameters
    ----------
    y_true, y_pred : list of label arrays
        One array per sample, of matching sizes, labels of any type;
        unlabelled nodes of ``y_true`` (-1, or None in object arrays) are
        ignored.
    """
    _check_lists(y_true, y_pred, "y_pred")
    errors = 0
    total = 0
    for k, (labels, pred) in enumerate(zip(y_true, y_pred)):
        pred = np.asarray(pred).reshape(-1)
        labels = np.asarray(labels)
        if labels.size != pred.size:
            raise ValueError(f"y_true[{k}] has {labels.size} labels (shape {labels.shape}) but y_pred[{k}] has {pred.size}")
        values, observed = split_labels(labels.reshape(-1), f"y_true[{k}]")
        errors += int(np.count_nonzero(pred[observed] != values))
        total += values.size
    if total == 0:
        raise ValueError("y_true has no labelled node (every label is -1): nothing to score")
    return errors / total


def node_accuracy(y_true, y_pred):
    """1 - :func:`hamming_error`: fraction of labelled nodes predicted right."""
    return 1.0 - hamming_error(y_true, y_pred)


def hamming_error_from_marginals(y_true, marginals):
    """Hamming error of the maximum posterior marginal labels (``y_true``: integer codes)."""
    labels, mu = _labelled(y_true, marginals)
    return float(np.count_nonzero(np.argmax(mu, axis=1) != labels)) / labels.size


def marginal_log_loss(y_true, marginals, eps=1e-15, *, classes=None):
    """Mean of ``-log mu_i(y_i)`` over the labelled nodes (marginals clipped
    below at ``eps``).

    ``classes``: the labels that the marginals' last axis follows (an
    estimator's ``classes_``); None: the labels are the integers ``0 .. K-1``.
    """
    labels, mu = _labelled(y_true, marginals, classes)
    p = np.clip(mu[np.arange(labels.size), labels], eps, 1.0)
    return float(-np.mean(np.log(p)))


def marginal_brier_score(y_true, marginals, *, classes=None):
    """Mean over the labelled nodes of ``sum_k (mu_i(k) - [y_i = k])^2``
    (multiclass Brier score; in [0, 2]); ``classes`` as for
    :func:`marginal_log_loss`."""
    labels, mu = _labelled(y_true, marginals, classes)
    diff = mu.copy()
    diff[np.arange(labels.size), labels] -= 1.0
    return float(np.mean(np.sum(diff * diff, axis=1)))


RESOLUTIONS = ("grid", "image")


def _node_level(estimator, X, y):
    """(labels, marginals) per sample, at the nodes when the estimator can
    tell them (a MarginalCRF, or a Pipeline ending in one, whose earlier steps
    transform X as ``Pipeline.score`` does), else as ``predict_proba``
    returns them."""
    final, transforms = estimator, []  # the last step of (nested) pipelines, and the steps before it
    while isinstance(final, Pipeline):
        if len(final) > 1:
            transforms.append(final[:-1])
        final = final[-1]
    if not hasattr(final, "_node_marginals"):
        return list(y), estimator.predict_proba(X)
    for steps in transforms:
        X = steps.transform(X)
    samples, marginals = final._node_marginals(X)
    if len(y) != len(samples):
        raise ValueError(f"X has {len(samples)} samples but y has {len(y)} label arrays")
    labels = [labels_to_grid(lab, s.sample) for s, lab in zip(samples, y)]
    return labels, marginals


class _StructuredScorer:
    """``scorer(estimator, X, y)``: ``sign * score_func(y, marginals or labels)``."""

    def __init__(self, score_func, sign, response, name, resolution):
        self._score_func = score_func
        self._sign = sign
        self._response = response
        self.name = name
        self.resolution = resolution

    def __call__(self, estimator, X, y, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(f"the {self.name} scorer does not support sample_weight")
        if self.resolution == "grid":
            labels, marginals = _node_level(estimator, X, y)
        else:
            labels, marginals = list(y), estimator.predict_proba(X)
        classes = getattr(estimator, "classes_", None)
        if classes is not None:  # the score functions see codes: column indices of the marginals
            labels = [encode_labels(lab, np.asarray(classes), f"y[{k}]") for k, lab in enumerate(labels)]
        if self._response == "predict":
            prediction = [np.argmax(np.asarray(mu), axis=-1) for mu in marginals]
            return self._sign * self._score_func(labels, prediction)
        return self._sign * self._score_func(labels, marginals)

    def __repr__(self):
        return f"<structured scorer {self.name!r} on {self._response}, at the {self.resolution} resolution>"


def make_structured_scorer(
    score_func, *, response_method="predict", greater_is_better=True, name=None, resolution="grid"
):
    """A scorer ``scorer(estimator, X, y)`` from ``score_func(y_true, response)``.

    Parameters
    ----------
    score_func : callable
        ``score_func(y_true, response)`` on lists over samples. When the
        estimator has ``classes_``, ``y_true`` holds integer codes (indices
        into ``classes_``, -1 = unlabelled) and the ``"predict"`` response
        the codes of the predicted labels, so that labels of any type score
        alike.
    response_method : {"predict", "predict_proba"}, default="predict"
        ``"predict"`` passes the maximum posterior marginal labels,
        ``"predict_proba"`` the marginals.
    greater_is_better : bool, default=True
        False negates the score (the scorer's ``name`` should then start with
        ``neg_``).
    name : str, default=None
        The scorer's ``name``; None: ``score_func``'s name.
    resolution : {"grid", "image"}, default="grid"
        Score the CRF's nodes (labels reduced to its grid) or the image-size
        answers of ``predict_proba`` (see the module docstring).
    """
    if response_method not in ("predict", "predict_proba"):
        raise ValueError(f"response_method must be 'predict' or 'predict_proba', got {response_method!r}")
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    return _StructuredScorer(
        score_func, 1 if greater_is_better else -1, response_method, name or score_func.__name__, resolution
    )


node_accuracy_scorer = make_structured_scorer(node_accuracy, name="node_accuracy")
neg_hamming_error_scorer = make_structured_scorer(hamming_error, greater_is_better=False, name="neg_hamming_error")
neg_marginal_log_loss_scorer = make_structured_scorer(
    marginal_log_loss, response_method="predict_proba", greater_is_better=False, name="neg_marginal_log_loss"
)
neg_marginal_brier_score_scorer = make_structured_scorer(
    marginal_brier_score, response_method="predict_proba", greater_is_better=False, name="neg_marginal_brier_score"
)
# older names of the same objects
neg_log_loss_scorer = neg_marginal_log_loss_scorer
neg_brier_score_scorer = neg_marginal_brier_score_scorer

#: The structured scorers by name; each key is its scorer's ``name``, and
#: ``<key>_scorer`` is the object's name in this module.
SCORERS = {
    scorer.name: scorer
    for scorer in (node_accuracy_scorer, neg_hamming_error_scorer, neg_marginal_log_loss_scorer,
                   neg_marginal_brier_score_scorer)
}

#: scikit-learn's flat-array scorer names and their structured counterparts.
_SKLEARN_NAMES = {
    "accuracy": "node_accuracy",
    "neg_log_loss": "neg_marginal_log_loss",
    "neg_brier_score": "neg_marginal_brier_score",
}


def get_scorer(name, *, resolution="grid"):
    """The structured scorer called ``name`` (a key of ``SCORERS``).

    Parameters
    ----------
    name : str
        ``"node_accuracy"``, ``"neg_hamming_error"``,
        ``"neg_marginal_log_loss"`` or ``"neg_marginal_brier_score"``.
    resolution : {"grid", "image"}, default="grid"
        ``"grid"`` returns the scorer of ``SCORERS``, which scores the CRF's
        nodes like ``MarginalCRF.score``; ``"image"`` one that scores
        ``predict_proba``'s answers at the image size (see the module
        docstring).

    Returns
    -------
    scorer : callable ``scorer(estimator, X, y)``
        For ``scoring=`` in ``GridSearchCV``, ``cross_validate``, ...

    Raises
    ------
    ValueError
        For an unknown name, listing the known ones (and naming the
        structured counterpart of scikit-learn's "accuracy", "neg_log_loss",
        "neg_brier_score").
    """
    if name not in SCORERS:
        hint = ""
        if name in _SKLEARN_NAMES:
            hint = (
                f" ({name!r} is scikit-learn's scorer for flat label arrays; on structured labels, one array "
                f"per image, use {_SKLEARN_NAMES[name]!r})"
            )
        raise ValueError(f"unknown structured scorer {name!r}{hint}; choose one of {sorted(SCORERS)}")
    scorer = SCORERS[name]
    if resolution == "grid":
        return scorer
    return make_structured_scorer(
        scorer._score_func, response_method=scorer._response, greater_is_better=scorer._sign > 0,
        name=scorer.name, resolution=resolution,
    )
