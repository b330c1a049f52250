"""MarginalCRF: the scikit-learn estimator (Domke 2013, Sec. "Experiments").

A thin layer: validation of structured X and y, the objective
(:mod:`._objective`: theta = F u, G v, the per-image loss of
:mod:`.gradients`, the chain rule, the ridge penalty) minimised with L-BFGS
(scipy), re-initialised when the line search meets a bad search direction,
as the paper does, and a parallel map over images (:mod:`._parallel`: the
images are packed into batches and handed to joblib once per fit; only the
weights travel at each L-BFGS iteration, and per-image results are summed in
image order, so the weights do not depend on ``n_jobs`` or on the backend).
What the per-image computations could not do as asked (inference that did
not converge, messages at their floor, back-propagation fallbacks) comes back
as counts, reported in one warning per kind per fit.
"""

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
import scipy.optimize
from sklearn.base import BaseEstimator, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import Bunch, ClassifierTags
from sklearn.utils._param_validation import Interval, Options, StrOptions
from sklearn.utils.validation import check_is_fitted, check_random_state
from threadpoolctl import threadpool_limits

from . import __version__
from ._graph import _as_float_array, _encode, split_labels, validate_edges
from ._objective import CRFObjective, Preconditioner
from ._memory import check_fit_memory
from ._parallel import ImageBatches, LostWorker, cluster_client, plan_groups
from ._warnings import warn_at_caller
from .edge_appearance import RHO_RULES
from .exceptions import BackpropFallbackWarning, InconsistentVersionWarning, WorkerLostError, WorkerLostWarning
from .gradients import (
    GRADIENT_MODES,
    check_node_weight_loss,
    INFERENCE_FREE_LOSSES,
    INFERENCE_METHODS,
    LOSSES,
    MIN_MULTIPLIER,
    check_multiplier,
    _Diagnostics,
    _Settings,
    check_combination,
    MARGINAL_LOSSES,
    WARM_START_MODES,
    warm_start_applies,
)
from .inference import MIN_RHO
from .sample import as_sample, labels_to_grid, marginals_to_image

__all__ = ["MarginalCRF"]

INFERENCE_CHOICES = INFERENCE_METHODS + ("independent",)

#: The stopping rule's defaults (``n_iter_no_change``, ``objective_tol``),
#: chosen from measured curves of test error against L-BFGS iterations
#: (docs/results/fit_curves/, "When a fit stops" in the user guide).
N_ITER_NO_CHANGE = 10
OBJECTIVE_TOL = 3e-3


def objective_stalled(objectives, n_iter_no_change, objective_tol):
    """The stopping rule on the objective values so far (the start, then one
    per L-BFGS iteration): the last fell by less than ``objective_tol`` times
    its size below the value ``n_iter_no_change`` iterations before; never
    with ``objective_tol=0``. (examples/fit_curves.py replays it on curves.)"""
    n = n_iter_no_change
    if objective_tol == 0 or len(objectives) <= n:
        return False
    return objectives[-1 - n] - objectives[-1] < objective_tol * abs(objectives[-1])


# ---------------------------------------------------------------------------
# Input validation (structured X: a list of samples)
# ---------------------------------------------------------------------------


class _Sample:
    """A validated sample: float64 (or float32) features, int64 edges, and the
    original sample (for its grid / image shape)."""

    __slots__ = ("node_features", "edges", "edge_features", "sample")

    def __init__(self, node_features, edges, edge_features, sample):
        self.node_features = node_features
        self.edges = edges
        self.edge_features = edge_features
        self.sample = sample

    @property
    def n_nodes(self):
        return self.node_features.shape[0]

    @property
    def n_edges(self):
        return self.edges.shape[0]


def _compute_dtype(dtype):
    """``MarginalCRF.dtype`` as a numpy dtype: float32 or float64."""
    try:
        name = np.dtype(dtype).name if dtype is not None else None  # np.dtype(None) would be float64
    except TypeError:
        name = None
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64 (or their names), got {dtype!r}")
    return np.dtype(name)


def _check_X(X, n_node_features=None, n_edge_features=None):
    """Validate a list of samples; return a list of :class:`_Sample`.

    With ``n_node_features`` / ``n_edge_features`` given (predict), the feature
    dimensions must match them; otherwise they must agree across samples.
    Inputs are never modified (float64 or float32 contiguous inputs are not
    even copied: float32 features stay float32; the products with the weights
    read them as they are and compute in float64, :mod:`._linear`).
    """
    if isinstance(X, np.ndarray) and X.dtype != object:
        raise TypeError(
            "X must be a list of samples (node_features, edges, edge_features) or CRFSample "
            f"objects, got a numeric ndarray of shape {X.shape}"
        )
    if isinstance(X, (str, bytes)) or not hasattr(X, "__len__") or not hasattr(X, "__getitem__"):
        raise TypeError(f"X must be a list of samples, got {type(X).__name__}")
    if len(X) == 0:
        raise ValueError("X is empty: need at least one sample")
    samples = []
    for k in range(len(X)):
        sample = as_sample(X[k])
        nf, edges, ef = sample
        nf = _as_float_array(nf, f"X[{k}] node_features", 2, keep_float32=True)
        n_nodes = nf.shape[0]
        if n_nodes == 0:
            raise ValueError(f"X[{k}] has no nodes (node_features of shape {nf.shape})")
        try:
            edges = validate_edges(edges, n_nodes)
        except ValueError as exc:
            raise ValueError(f"X[{k}]: {exc}") from None
        n_edges = edges.shape[0]
        if ef is None or (n_edges == 0 and np.size(ef) == 0):
            width = n_edge_features if n_edge_features is not None else (
                np.shape(ef)[1] if ef is not None and np.ndim(ef) == 2 else 0
            )
            ef = np.zeros((0, width))
        else:
            ef = _as_float_array(ef, f"X[{k}] edge_features", 2, keep_float32=True)
        if ef.shape[0] != n_edges:
            raise ValueError(
                f"X[{k}] has {n_edges} edges but edge_features has {ef.shape[0]} rows "
                "(one row of features per edge expected)"
            )
        samples.append(_Sample(nf, edges, ef, sample))

    if n_node_features is None:
        n_node_features = samples[0].node_features.shape[1]
        n_edge_features = next((s.edge_features.shape[1] for s in samples if s.n_edges), samples[0].edge_features.shape[1])
        where = "X[0]"
    else:
        where = "fit"
    for k, s in enumerate(samples):
        if s.node_features.shape[1] != n_node_features:
            raise ValueError(
                f"X[{k}] has {s.node_features.shape[1]} node features but {where} had "
                f"{n_node_features}: every sample must have the same node features"
            )
        if s.n_edges and s.edge_features.shape[1] != n_edge_features:
            raise ValueError(
                f"X[{k}] has {s.edge_features.shape[1]} edge features but {where} had "
                f"{n_edge_features}: every sample must have the same edge features"
            )
        if not s.n_edges and s.edge_features.shape[1] != n_edge_features:
            s.edge_features = np.zeros((0, n_edge_features))
    return samples, n_node_features, n_edge_features


def _label_values(y, samples):
    """Validate the list of label arrays against the samples; return, per
    sample, the labelled values (1-D, any type) and the flat mask of the
    labelled nodes (:func:`._graph.split_labels`)."""
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"y must be a list of label arrays (one per sample), got {type(y).__name__}")
    if len(y) != len(samples):
        raise ValueError(
            f"X and y have different lengths: X has {len(samples)} samples but y has {len(y)} label arrays"
        )
    out = []
    for k, (s, lab) in enumerate(zip(samples, y)):
        try:
            flat = labels_to_grid(np.asarray(lab), s.sample)
        except ValueError as exc:
            raise ValueError(f"y[{k}]: label count does not match the node count: {exc}") from None
        out.append(split_labels(flat, f"y[{k}]"))
    return out


def _kind(values):
    """"integer", "bool" or "str": the kind of a non-empty array of labelled values."""
    return {"b": "bool", "U": "str", "S": "str"}.get(values.dtype.kind, "integer")


def _fit_classes(values, classes=None, n_states=None):
    """The sorted classes of a fit: ``classes`` when given, ``arange(n_states)``
    for integer labels with ``n_states``, else the labelled values seen."""
    kinds = {_kind(v) for v in values if v.size}
    if len(kinds) > 1:
        raise ValueError(f"y mixes labels of several kinds ({', '.join(sorted(kinds))}): use labels of one type")
    seen = np.unique(np.concatenate([v for v in values if v.size])) if kinds else np.zeros(0, dtype=np.int64)
    if classes is not None:
        found = np.unique(np.asarray(classes))
        if found.ndim != 1 or found.size != np.size(classes) or found.size < 2:
            raise ValueError(f"classes must list at least two distinct labels, got {classes!r}")
        if n_states is not None and n_states != found.size:
            raise ValueError(f"n_states={n_states} but classes has {found.size} labels: give one of them")
    elif n_states is not None and kinds <= {"integer"}:
        found = np.arange(n_states)
    else:
        found = seen
        if n_states is not None and found.size != n_states:
            raise ValueError(
                f"n_states={n_states} but y holds {found.size} classes {found.tolist()}: with labels other than "
                "the integers 0..n_states-1, give the classes themselves (classes=)"
            )
        if found.size == 0:
            raise ValueError("y has no labelled node (every label is -1 or None): nothing to learn from")
        if found.size < 2:
            raise ValueError(
                f"y holds {found.size} class{'es' if found.size != 1 else ''} {found.tolist()}, a CRF needs at least "
                "two: give classes= (or n_states= for integer labels 0..K-1) when a subset of the data lacks one"
            )
    return found


def _check_y(y, samples, classes=None, n_states=None):
    """Validate labels of any type; return a list of flat int64 codes (one
    array per sample: indices into the classes, -1 = unlabelled) and the
    sorted classes (:func:`_fit_classes`)."""
    values = _label_values(y, samples)
    if classes is None and n_states is not None:
        for k, (v, _) in enumerate(values):
            if v.size and _kind(v) == "integer" and v.max() >= n_states:
                raise ValueError(
                    f"y[{k}] has label {v.max()} but n_states={n_states}: integer labels must lie in "
                    f"[0, {n_states - 1}] (-1 = unlabelled); for other labels give classes="
                )
    classes = _fit_classes([v for v, _ in values], classes, n_states)
    return [_encode(v, labelled, classes, f"y[{k}]") for k, (v, labelled) in enumerate(values)], classes


def _check_stage_init(stage_init, stages, given, random_state):
    """(stage index, iterations already run) of a resumed schedule, checked
    against the fit's ``stages``; (0, 0) for None."""
    if stage_init is None:
        return 0, 0
    try:
        index, done = stage_init
    except (TypeError, ValueError):
        raise ValueError(f"stage_init must be a pair (stage index, iterations run), got {stage_init!r}") from None
    for name, value in (("stage index", index), ("iterations run", done)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Integral, np.integer)) or value < 0:
            raise ValueError(f"stage_init: the {name} must be an integer >= 0, got {value!r}")
    if given is None:
        raise ValueError("stage_init resumes from saved weights: give unary_coef_init and pairwise_coef_init too")
    if index >= len(stages):
        raise ValueError(f"stage_init: stage {index} does not exist, this fit has {len(stages)} stage(s)")
    if done > stages[index][1]:
        raise ValueError(f"stage_init: stage {index} runs at most {stages[index][1]} L-BFGS iterations, not {done}")
    if len(stages) > 1 and not isinstance(random_state, (Integral, np.integer)):
        raise ValueError(
            "stage_init needs random_state to be the integer the fit was started with: the incremental "
            f"stages' random subsets are rebuilt from it (got random_state={random_state!r})"
        )
    return int(index), int(done)


def _check_coef_init(unary_coef_init, pairwise_coef_init, shape_f, shape_g):
    """Float64 copies (F, G) of the starting weights given to ``fit`` (zeros for
    the one not given), or None when neither is given."""
    if unary_coef_init is None and pairwise_coef_init is None:
        return None
    checked = []
    for name, value, shape, meaning in (
        ("unary_coef_init", unary_coef_init, shape_f, "(n_states, n_node_features)"),
        ("pairwise_coef_init", pairwise_coef_init, shape_g, "(n_states, n_states, n_edge_features)"),
    ):
        if value is None:
            checked.append(np.zeros(shape))
            continue
        try:
            value = np.array(value, dtype=np.float64)  # a copy: fit never writes into its arguments
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an array of numbers of shape {shape}, got {type(value).__name__}") from None
        if value.shape != shape:
            raise ValueError(
                f"{name} has shape {value.shape} but this fit needs {meaning} = {shape} "
                "(the number of states comes from y or n_states, the features from X)"
            )
        if not np.all(np.isfinite(value)):
            raise ValueError(f"{name} contains NaN or infinite values")
        checked.append(value)
    return tuple(checked)


# ---------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------


@dataclass
class _FitProgress:
    """What a fit accumulates over its L-BFGS iterations: when it started,
    the seconds in the per-image losses, their diagnostics and how many
    per-image computations they cover, whether the callback stopped it, and
    how many worker processes died."""

    start: float
    kernel_time: float = 0.0
    diagnostics: _Diagnostics = field(default_factory=_Diagnostics)
    n_images: int = 0
    stopped: bool = False
    lost_workers: int = 0
    not_converged: list = field(default_factory=list)  # what L-BFGS could not do, per stage
    # the callback's place in the schedule: the stage's index (None in the
    # initialising fits) and the iterations it ran before a resume
    stage_index: object = None
    iterations_before: int = 0


class _StopFit(Exception):
    """Raised out of L-BFGS when the user's ``callback`` asks to stop, with
    the weights of that iteration."""

    def __init__(self, weights):
        super().__init__("stopped by the callback")
        self.weights = weights


class _Stalled(_StopFit):
    """Raised out of L-BFGS when the objective stopped improving
    (``n_iter_no_change`` / ``objective_tol``): this stage has converged."""


class _Converged(_StopFit):
    """Raised out of L-BFGS when the largest entry of the gradient in the
    weights fell to ``lbfgs_tol`` (checked here, not by scipy, whose ``gtol``
    would see the gradient in the preconditioned coordinates)."""


class MarginalCRF(BaseEstimator):
    """Conditional random field learned with a marginal-based loss under
    approximate inference (Domke, "Learning Graphical Model Parameters with
    Approximate Marginal Inference", TPAMI 2013).

    Each sample is a pairwise graph with features on its nodes and edges; the
    parameters are linear in the features (``theta_i = F u_i``,
    ``theta_ij = G v_ij``), and ``F``, ``G`` minimise the mean loss per
    labelled node plus ``reg * (||F||^2 + ||G||^2)`` with L-BFGS.

    Parameters
    ----------
    loss : {"univariate_logistic", "clique_logistic", "univariate_quadratic", \
            "smooth_classification", "surrogate_likelihood", "pseudolikelihood", \
            "piecewise"}, default="univariate_logistic"
        Training loss (paper, Sec. "Loss Functions"). ``"surrogate_likelihood"``
        is surrogate EM when some labels are hidden. ``"pseudolikelihood"`` and
        ``"piecewise"`` need no inference in training (``inference`` then
        only serves prediction and ``gradient_mode`` is ignored).
    inference : {"trw", "lbp", "mean_field", "exact", "independent"}, default="trw"
        Marginal inference used in training and prediction. ``"independent"``
        is the paper's independent model: logistic regression on the unary
        features, no pairwise weights (``pairwise_coef_`` stays zero).
    gradient_mode : {"truncated", "backprop", "perturbation", "implicit"}, default="truncated"
        How ``dL/dtheta`` is computed (Sec. "Truncated Fitting", "Perturbation",
        "Implicit Fitting"; ``"backprop"`` is back TRW / back mean field run to
        convergence). Not every combination applies: ``"implicit"`` with
        ``"mean_field"``, and ``"truncated"`` / ``"backprop"`` with
        ``"exact"`` raise ValueError in ``fit``.
    n_iter : int, default=20
        Inference iterations of truncated fitting; prediction then also runs
        exactly ``n_iter`` iterations (the model was fit for them). Not used
        by the losses fit without inference (pseudolikelihood, piecewise),
        whose models predict with inference run to ``tol``.
    tol : float, default=1e-4
        Convergence threshold of inference for the other gradient modes and
        for prediction after them and after the losses fit without inference
        (the paper's threshold of 1e-4).
    rho : float, {"auto", "uniform_spanning_tree", "forest_cover"} or None, default=None
        TRW edge appearance probabilities (None: the inference default). Used
        by ``inference="trw"`` only and ignored by the other methods, so that
        a grid search over ``inference`` can share it.
    alpha : float, default=15.0
        Slope of the smoothed classification loss (the paper uses 5, 15, 50).
    reg : float, default=1e-3
        Ridge penalty on all weights, relative to the mean loss per labelled
        node (the paper's ``lambda``; with ``class_weight``, the weighted
        mean).
    max_iter : int, default=200
        Maximum number of L-BFGS iterations of the fit (over all restarts; the
        initialising fits get as many again).
    n_states : int or None, default=None
        Number of labels K. With integer labels, ``n_states=K`` makes the
        classes ``0 .. K-1`` whether or not each occurs in ``y`` (give it in
        cross-validation, where a fold may lack a label); with other labels
        it must equal the number of classes in ``y``. None: the classes are
        the labels found in ``y`` (see ``classes``).
    classes : array-like or None, default=None
        The labels of the model, of any type (integers, strings, booleans),
        whether or not each occurs in ``y``: the way to fit on subsets of the
        data that lack a class when the labels are not ``0 .. K-1``.
        ``classes_`` holds them sorted. None: the labels found in ``y``
        (``arange(n_states)`` with integer labels and ``n_states``); a
        subset with a single class then raises ValueError.
    class_weight : dict, "balanced" or None, default=None
        Weights of the labelled nodes by their label: each node's term of
        the loss (and of the initialising independent fit) is multiplied by
        its class's weight, and the objective is the weighted mean over the
        labelled nodes. A dict maps classes to weights (missing classes
        weigh 1); ``"balanced"`` weighs class ``c`` by ``n_labelled / (K *
        n_c)`` over the labelled nodes of the fit, as in
        :class:`~sklearn.linear_model.LogisticRegression`. Edge terms
        (``clique_logistic``, the edge pieces of ``piecewise``) weigh the mean
        of their two nodes' weights; a ``pseudolikelihood`` term weighs its
        node's. ``surrogate_likelihood`` is not a sum over nodes and raises
        ValueError (the initialising surrogate fit of
        ``smooth_classification`` runs unweighted).
    init : {"independent", "zeros"}, default="independent"
        Starting weights. ``"independent"`` first fits the independent model
        (univariate logistic loss) and starts from its ``F`` with ``G = 0``;
        for ``loss="smooth_classification"`` a surrogate-likelihood fit from
        there is the start (as in the paper).
    n_jobs : int or None, default=None
        Number of joblib workers for the per-image losses and gradients (and
        for prediction). Images are batched per worker. The active joblib
        backend is honoured, e.g. ``with joblib.parallel_config(backend="dask")``.
        A fit whose workers would need more memory than is available is
        refused before it starts (MemoryError, with the estimate); a worker
        process lost during a fit is replaced once and its evaluation
        recomputed (:class:`~sklearn_margcrf.exceptions.WorkerLostWarning`);
        on Dask, Dask recomputes what a lost worker held.
    verbose : int, default=0
        ``> 0``: print the objective, gradient norm and elapsed time at every
        L-BFGS iteration; ``> 2`` also joblib's progress messages.
    warm_start : bool, default=False
        Start from the weights of the previous fit (when their shapes match)
        instead of ``init``.
    random_state : int, RandomState instance or None, default=None
        Draws the image subsets of the ``incremental`` schedule; nothing else
        in the fit is random.
    sides : {1, 2, 4}, default=2
        Finite differences of the perturbation gradient mode.
    multiplier : float, default=1.0
        Step multiplier of the perturbation gradient mode, at least
        ``eps**(2/3)`` (about 3.7e-11; a smaller step rounds away).
    inference_max_iter : int, default=1000
        Iteration cap of inference run to ``tol``.
    lbfgs_tol : float, default=1e-6
        L-BFGS stops when the largest entry of the objective's gradient with
        respect to ``F`` and ``G`` is at most this (as scipy's ``gtol``; with
        ``precondition``, still in ``F`` and ``G``), or when an iteration
        lowers the objective by less than about 2e-9 of its value (scipy's
        ``ftol``).
    max_restarts : int, default=5
        How many times L-BFGS is restarted after an abnormal line search (a
        bad search direction, common with approximate gradients).
    n_iter_no_change : int, default=10
        Window of the stopping rule: L-BFGS stops (converged, no warning)
        once the objective fell by less than ``objective_tol`` times its
        value over the last ``n_iter_no_change`` iterations. Applies to every
        stage of the fit (the initialising fits included); ``max_iter``
        stays the hard cap.
    objective_tol : float, default=3e-3
        Relative improvement of the objective over ``n_iter_no_change``
        iterations below which the fit stops; 0 turns the rule off (L-BFGS
        then runs to ``lbfgs_tol`` or ``max_iter``). The defaults were chosen
        from measured curves of test error against iterations on the horses
        and denoising data (see "When a fit stops" in the user guide).
    precondition : bool, default=True
        Run L-BFGS in coordinates where the features are whitened: ``F = A
        S_u``, ``G = B S_v`` with ``S = (M / 4 + 2 reg I)^(-1/2)`` and ``M``
        the second moments of the node (edge) features per labelled node,
        computed once per fit (one pass over the features). The objective,
        its minimum and ``lbfgs_tol`` are unchanged; L-BFGS takes another,
        shorter path where the features are correlated or differently
        scaled, as image features are: on the 200 horse training images at
        full resolution (TRW, 20 iterations) the test error reached .0995
        after 45 iterations, against .1055 after 90 without, and the
        objective after 37 iterations was below that of 90 without (see
        "When a fit stops" in the user guide). False: L-BFGS on ``F`` and
        ``G`` directly, as in the paper.
    incremental : int or None, default=None
        The paper's incremental procedure for large data sets: fit a random
        subset of ``incremental`` images with ``max_iter`` iterations, then
        repeatedly double the number of images and halve the number of
        iterations, each stage starting from the previous weights, until all
        images are used. None fits all images at once.
    callback : callable or None, default=None
        Called after every L-BFGS iteration of ``fit`` (the initialising fits
        included) as ``callback(progress)``, where ``progress`` is a
        :class:`~sklearn.utils.Bunch` with ``stage`` (``"independent"``,
        ``"surrogate_likelihood"`` for the initialising fits, ``"fit"`` or
        ``"fit[k images]"``), ``stage_index`` (the stage's place in the
        schedule, 0 for the first; None in the initialising fits),
        ``n_iter`` (iterations of this stage so far, those before a resume
        with ``stage_init`` included),
        ``objective``, ``unary_coef`` and ``pairwise_coef`` (copies of the
        current weights), ``n_restarts``, ``elapsed`` (seconds since the
        start of ``fit``) and ``params`` (the estimator's parameters). If it
        returns a true value, the fit stops after that iteration and the
        model keeps its weights (remaining stages are skipped, no
        ConvergenceWarning): use it to stop on a time budget or record a
        learning curve; :class:`~sklearn_margcrf.callbacks.Checkpoint` saves
        the weights of a long fit so that it can be resumed. Exceptions it
        raises propagate out of ``fit``.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Precision of inference and of its gradients in ``fit`` and of the
        marginals of ``predict_proba`` (which are returned in it),
        whatever the features' storage dtype. float32 halves the memory of
        the message passing and is faster, most of all with many labels; it
        represents the potentials exactly up to differences of about
        ``85 * rho`` (float64: ``690 * rho``), far beyond the potentials that
        regularised fits on scaled features produce, unless a fit diverges
        (truncated surrogate EM at 5 iterations on the Stanford backgrounds
        took pairwise potentials to +-30, beyond float32's range at rho
        0.5: the fit warns of messages at the floor, and its float32
        gradients are then far off). The weights, the
        products with the features, the totals of the objective (losses,
        log-partition estimates and entropies, summed over their float32
        terms) and L-BFGS stay in float64: a float32 total of an image's
        terms would jitter by about 1e-7 of itself, more than the decrease
        that L-BFGS's line searches look for near the end of a fit.
    checkpoints : int >= 1 or None, default=None
        Memory of truncated fitting: keep this many snapshots of the
        messages per image (and one work slot) and recompute the others in
        the backward pass (the gradient is unchanged; binomial
        checkpointing, e.g. 267 recomputed iterations for ``n_iter=200`` and
        14 snapshots). None keeps every iteration while one image's
        snapshots fit 1 GiB. See :func:`~sklearn_margcrf.loss_and_grad`.
    inference_warm_start : "auto" or bool, default="auto"
        Start each image's inference in an L-BFGS evaluation from where it
        ended at the previous evaluation of the same fit stage (the first
        evaluation of each stage starts cold), instead of from uniform
        messages (mean field: from ``softmax(theta_i)``). It changes the work,
        not the objective: with ``gradient_mode`` "backprop", "perturbation"
        and "implicit", inference runs to ``tol`` and the gradient is taken
        at the fixed point reached, which either start reaches to within
        ``tol``; the fit needs fewer inference iterations
        (``n_inference_iter_``), and its gradients differ from a cold fit's
        by the inference tolerance (L-BFGS may then take another path).
        ``"auto"``: on for "backprop" and "implicit" with a marginal loss
        under ``trw``, ``lbp`` or ``mean_field``; off for "perturbation",
        whose gradient measured 1.7-2.6 times less accurate from a warm start
        (its perturbed passes start warm too and stop at ``tol``:
        docs/scaling.rst, "Warm starts"). True: on in those three modes, and
        ValueError where it does not apply (with ``"truncated"`` the start is
        part of the model); False: off. The
        fit keeps each image's last messages (``2 E K`` values per image;
        mean field ``n K``) twice, in the folder of the batches (see
        docs/scaling.rst). Prediction always starts cold.

    Attributes
    ----------
    unary_coef_ : ndarray of shape (n_states, n_node_features)
        ``F``.
    pairwise_coef_ : ndarray of shape (n_states, n_states, n_edge_features)
        ``G``; ``G[a, b, f]`` weighs feature ``f`` of edge (i, j) for
        ``x_i = a, x_j = b``.
    n_states_ : int
        ``len(classes_)``.
    classes_ : ndarray of shape (n_states,)
        The labels, sorted (``classes``, ``arange(n_states)`` with integer
        labels, or those found in ``y``): ``predict`` answers in them and the
        last axis of ``predict_proba`` follows them.
    n_node_features_, n_edge_features_ : int
    n_iter_ : int
        L-BFGS iterations of the final fit (over its restarts and
        ``incremental`` stages; not counting the initialising fits).
    n_restarts_ : int
        L-BFGS restarts of the final fit.
    loss_curve_ : list of float
        Objective after each L-BFGS iteration of the final fit (stages of
        ``incremental`` one after the other, each on its own subset).
    time_curve_ : list of float
        Seconds since the start of ``fit`` at each entry of ``loss_curve_``
        (initialising fits included in the clock), for objective-vs-time plots.
    fit_time_ : float
        Wall-clock seconds of ``fit`` (including the initialising fits).
    kernel_time_ : float
        Seconds spent inside ``loss_and_grad``, summed over workers.
    n_inference_iter_ : int
        Inference iterations run by ``fit`` (initialising fits included),
        summed over images and evaluations, the perturbed and re-run
        inferences of the gradient modes included: the work that
        ``inference_warm_start`` saves.

    Notes
    -----
    ``X`` is a list of samples: ``(node_features (n, Fu), edges (E, 2),
    edge_features (E, Fe))`` triples or :class:`~sklearn_margcrf.CRFSample`
    objects (which may carry a grid and an image shape). ``y`` is a list of
    label arrays, one label per node ((n,), the sample's grid shape, or its
    image shape), encoded like scikit-learn's classifiers do (``classes_``):

    - integers (a 0/255 mask gives the two classes 0 and 255): -1 marks an
      unlabelled node, other negative labels are refused;
    - floats must hold whole numbers and are read as integers (a mask stored
      as float); fractions, NaN and infinities raise ValueError;
    - booleans and strings: every node is labelled, or use an object array
      in which ``None`` marks the unlabelled nodes (``None`` also works in
      object arrays of integers).
    """

    _parameter_constraints: dict = {
        "loss": [StrOptions(set(LOSSES))],
        "inference": [StrOptions(set(INFERENCE_CHOICES))],
        "gradient_mode": [StrOptions(set(GRADIENT_MODES))],
        "n_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "rho": [None, Interval(Real, MIN_RHO, None, closed="left"), StrOptions(set(RHO_RULES))],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "reg": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "n_states": [None, Interval(Integral, 2, None, closed="left")],
        "classes": [None, "array-like"],
        "class_weight": [None, dict, StrOptions({"balanced"})],
        "init": [StrOptions({"independent", "zeros"})],
        "n_jobs": [None, Interval(Integral, None, -1, closed="right"), Interval(Integral, 1, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "random_state": ["random_state"],
        "sides": [Options(Integral, {1, 2, 4})],
        "multiplier": [Interval(Real, MIN_MULTIPLIER, None, closed="left")],
        "inference_max_iter": [Interval(Integral, 1, None, closed="left")],
        "lbfgs_tol": [Interval(Real, 0, None, closed="left")],
        "max_restarts": [Interval(Integral, 0, None, closed="left")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "objective_tol": [Interval(Real, 0, None, closed="left")],
        "precondition": ["boolean"],
        "incremental": [None, Interval(Integral, 1, None, closed="left")],
        "callback": [None, callable],
        "dtype": "no_validation",  # checked by _compute_dtype, which names the choices
        "checkpoints": [None, Interval(Integral, 1, None, closed="left")],
        "inference_warm_start": ["boolean", StrOptions({"auto"})],
    }

    def __init__(
        self,
        *,
        loss="univariate_logistic",
        inference="trw",
        gradient_mode="truncated",
        n_iter=20,
        tol=1e-4,
        rho=None,
        alpha=15.0,
        reg=1e-3,
        max_iter=200,
        n_states=None,
        classes=None,
        class_weight=None,
        init="independent",
        n_jobs=None,
        verbose=0,
        warm_start=False,
        random_state=None,
        sides=2,
        multiplier=1.0,
        inference_max_iter=1000,
        lbfgs_tol=1e-6,
        max_restarts=5,
        n_iter_no_change=N_ITER_NO_CHANGE,
        objective_tol=OBJECTIVE_TOL,
        precondition=True,
        incremental=None,
        callback=None,
        dtype=np.float64,
        checkpoints=None,
        inference_warm_start="auto",
    ):
        self.loss = loss
        self.inference = inference
        self.gradient_mode = gradient_mode
        self.n_iter = n_iter
        self.tol = tol
        self.rho = rho
        self.alpha = alpha
        self.reg = reg
        self.max_iter = max_iter
        self.n_states = n_states
        self.classes = classes
        self.class_weight = class_weight
        self.init = init
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.warm_start = warm_start
        self.random_state = random_state
        self.sides = sides
        self.multiplier = multiplier
        self.inference_max_iter = inference_max_iter
        self.lbfgs_tol = lbfgs_tol
        self.max_restarts = max_restarts
        self.n_iter_no_change = n_iter_no_change
        self.objective_tol = objective_tol
        self.precondition = precondition
        self.incremental = incremental
        self.callback = callback
        self.dtype = dtype
        self.checkpoints = checkpoints
        self.inference_warm_start = inference_warm_start

    # -- scikit-learn plumbing ------------------------------------------------

    def __getstate__(self):
        # a pickle records the package version, as scikit-learn's estimators
        # record scikit-learn's (sklearn.base.BaseEstimator.__getstate__)
        return dict(super().__getstate__(), _sklearn_margcrf_version=__version__)

    def __setstate__(self, state):
        state = dict(state)
        version = state.pop("_sklearn_margcrf_version", None)
        if version != __version__:
            warnings.warn(
                InconsistentVersionWarning(
                    estimator_name=type(self).__name__, current_version=__version__, original_version=version
                ),
                stacklevel=2,
            )
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags(multi_class=True, multi_label=False)
        tags.target_tags.required = True
        tags.target_tags.single_output = False  # one label per node: structured output
        tags.target_tags.multi_output = True
        tags.input_tags.two_d_array = False
        tags.input_tags.allow_nan = False
        tags.non_deterministic = False
        return tags

    # -- configuration ----------------------------------------------------------

    def _check_combination(self, loss, inference):
        """ValueError for a combination that does not apply, before any work."""
        if inference == "independent":
            check_combination(loss, "trw", "truncated")
            if loss == "clique_logistic":
                raise ValueError(
                    "loss='clique_logistic' does not apply to inference='independent': the independent "
                    "model has no edges, so there are no clique terms to fit"
                )
            return
        try:
            check_combination(loss, inference, self.gradient_mode)
        except ValueError as exc:
            raise ValueError(
                f"unsupported combination loss={loss!r}, inference={inference!r}, "
                f"gradient_mode={self.gradient_mode!r}: {exc}"
            ) from None

    def _objective(self, loss, inference, shape_f, shape_g, prediction=False, class_weight=None):
        """The :class:`CRFObjective` of ``loss`` under ``inference`` (with the
        weights of the classes, a tuple, or None); for prediction, inference
        runs ``n_iter`` iterations after truncated fitting and to ``tol``
        otherwise. Training inference starts warm where
        ``inference_warm_start`` asks for it and it applies."""
        truncated = self.gradient_mode == "truncated" and self.loss not in INFERENCE_FREE_LOSSES and inference != "exact"
        n_iter = None if prediction and not truncated else int(self.n_iter)
        settings = _Settings(
            loss=loss, inference=inference, gradient_mode=self.gradient_mode, n_iter=n_iter, tol=float(self.tol),
            max_iter=int(self.inference_max_iter), rho=self.rho if inference == "trw" else None,
            alpha=float(self.alpha), sides=int(self.sides), multiplier=float(self.multiplier),
            checkpoints=self.checkpoints,
        )
        # "auto" leaves the perturbation gradient cold: warm, it measured less accurate (docs/scaling.rst)
        wanted = self.inference_warm_start is True or (
            self.inference_warm_start == "auto" and self.gradient_mode != "perturbation")
        warm = not prediction and wanted and warm_start_applies(settings)
        return CRFObjective(settings, shape_f, shape_g, _compute_dtype(self.dtype), class_weight, warm)

    def _check_warm_start(self):
        """ValueError when ``inference_warm_start=True`` cannot start the fit's inference warm."""
        if self.inference_warm_start is not True:
            return
        if self.loss in INFERENCE_FREE_LOSSES or self.inference in ("independent", "exact"):
            what = (f"loss={self.loss!r} needs no inference in training" if self.loss in INFERENCE_FREE_LOSSES
                    else f"inference={self.inference!r} is not iterative")
        elif self.gradient_mode not in WARM_START_MODES:
            what = (f"with gradient_mode={self.gradient_mode!r} the model is the marginals after n_iter iterations "
                    "from the usual start, so where inference starts is part of the model")
        elif self.loss not in MARGINAL_LOSSES:
            what = f"loss={self.loss!r} runs two inferences per image (full and clamped), which start cold"
        else:
            return
        raise ValueError(
            f"inference_warm_start=True does not apply: {what}. Warm starts apply to the marginal losses under "
            f"trw, lbp or mean_field with gradient_mode in {WARM_START_MODES}; use inference_warm_start='auto' "
            "(on where they apply) or False"
        )

    def _class_weights(self, classes, labels):
        """``class_weight`` as a tuple of weights by label code, or None."""
        if self.class_weight is None:
            return None
        check_node_weight_loss(self.loss, "class_weight")
        if isinstance(self.class_weight, str):  # "balanced", over the labelled nodes
            counts = np.bincount(np.concatenate([lab[lab >= 0] for lab in labels]), minlength=len(classes))
            weights = counts.sum() / (len(classes) * np.maximum(counts, 1))
        else:
            weights = np.ones(len(classes))
            for label, weight in self.class_weight.items():
                index = np.flatnonzero(classes == label) if np.asarray(label).dtype.kind == classes.dtype.kind else []
                if len(index) != 1:
                    raise ValueError(f"class_weight has class {label!r}, which is not among the classes {classes.tolist()}")
                if isinstance(weight, bool) or not isinstance(weight, Real) or not np.isfinite(weight) or weight < 0:
                    raise ValueError(f"class_weight[{label!r}] must be a finite number >= 0, got {weight!r}")
                weights[index[0]] = weight
            if not np.any(weights[np.unique(np.concatenate([lab[lab >= 0] for lab in labels]))] > 0):
                raise ValueError(f"class_weight={self.class_weight!r} weighs every labelled node 0: nothing to learn from")
        return tuple(float(w) for w in weights)

    def _stages(self, n_samples):
        """(image indices, L-BFGS iterations) of each stage of the fit.

        Without ``incremental``: all images, ``max_iter``. With it, the paper's
        incremental procedure (Stanford backgrounds experiment): a random
        subset of ``incremental`` images first, then the number of images is
        doubled and the number of iterations halved until all images are used.
        """
        if self.incremental is None or self.incremental >= n_samples:
            return [(list(range(n_samples)), int(self.max_iter))]
        order = check_random_state(self.random_state).permutation(n_samples)
        stages = []
        size, iterations = int(self.incremental), int(self.max_iter)
        while True:
            size = min(size, n_samples)
            stages.append((sorted(order[:size].tolist()), max(iterations, 1 if self.max_iter else 0)))
            if size == n_samples:
                return stages
            size *= 2
            iterations //= 2

    def _log(self, message):
        if self.verbose > 0:
            print(f"[MarginalCRF] {message}", flush=True)

    # -- fitting ------------------------------------------------------------------

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, *, unary_coef_init=None, pairwise_coef_init=None, stage_init=None):
        """Fit ``F`` and ``G`` by L-BFGS on the mean loss per labelled node.

        Parameters
        ----------
        X : list of samples
            ``(node_features, edges, edge_features)`` triples or ``CRFSample``.
        y : list of label arrays
            One label per node ((n,), grid or image shape), of any type (see
            Notes); -1 (integer labels) or None (object arrays) = unlabelled.
        unary_coef_init : ndarray of shape (n_states, n_node_features), default=None
            Starting ``F`` (scikit-learn's ``coef_init`` convention). When it
            or ``pairwise_coef_init`` is given, L-BFGS starts from them (the
            one not given is zero), without the initialising fits of
            ``init`` and whatever ``warm_start`` says: use it to resume a fit
            from saved weights (:class:`~sklearn_margcrf.callbacks.Checkpoint`).
            In a :class:`~sklearn.pipeline.Pipeline`, pass it as
            ``pipeline.fit(X, y, marginalcrf__unary_coef_init=F)``.
        pairwise_coef_init : ndarray of shape (n_states, n_states, n_edge_features), default=None
            Starting ``G``, likewise (not used by ``inference="independent"``,
            whose ``G`` stays zero).
        stage_init : (int, int) or None, default=None
            Where to resume the schedule of stages (one stage, or those of
            ``incremental``): ``(k, n)`` starts in stage ``k`` (0-based) after
            ``n`` of its L-BFGS iterations, from the weights given above
            (required), skips the stages before it, gives stage ``k`` its
            remaining iterations and runs the later ones as usual; the
            callback counts the iterations of stage ``k`` from ``n``. The
            stages' random subsets are rebuilt from ``random_state``, which
            must then be the integer the fit started with. The
            ``stage_index`` and ``n_iter`` of a callback report give it
            (:meth:`~sklearn_margcrf.callbacks.Checkpoint.fit_params` does).
            None: from the first stage.

        Returns
        -------
        self
        """
        progress = _FitProgress(start=time.perf_counter())
        self._check_combination(self.loss, self.inference)
        self._check_warm_start()
        if self.gradient_mode == "perturbation":
            check_multiplier(self.multiplier, _compute_dtype(self.dtype))
        check_random_state(self.random_state)
        samples, n_node_features, n_edge_features = _check_X(X)
        labels, classes = _check_y(y, samples, self.classes, self.n_states)
        n_states = len(classes)
        n_labelled = int(sum(np.count_nonzero(lab >= 0) for lab in labels))
        if n_labelled == 0:
            raise ValueError("y has no labelled node (every label is -1 or None): nothing to learn from")

        shape_f = (n_states, n_node_features)
        shape_g = (n_states, n_states, n_edge_features)
        given = _check_coef_init(unary_coef_init, pairwise_coef_init, shape_f, shape_g)
        warm = given is None and (
            self.warm_start
            and hasattr(self, "unary_coef_")
            and self.unary_coef_.shape == shape_f
            and self.pairwise_coef_.shape == shape_g
        )
        if given is None and self.warm_start and hasattr(self, "unary_coef_") and not warm:
            warn_at_caller(
                "warm_start=True but the previous weights have shapes "
                f"{self.unary_coef_.shape}, {self.pairwise_coef_.shape} instead of {shape_f}, {shape_g}: "
                f"starting from init={self.init!r}",
                UserWarning,
            )
        if given is not None:
            unary_coef, pairwise_coef = given
        elif warm:
            unary_coef, pairwise_coef = self.unary_coef_.copy(), self.pairwise_coef_.copy()
        else:
            unary_coef, pairwise_coef = np.zeros(shape_f), np.zeros(shape_g)
        if self.inference == "independent":
            pairwise_coef = np.zeros(shape_g)

        class_weight = self._class_weights(classes, labels)
        objective = self._objective(self.loss, self.inference, shape_f, shape_g, class_weight=class_weight)
        independent = self._objective("univariate_logistic", "independent", shape_f, shape_g, class_weight=class_weight)
        if cluster_client() is None:  # a cluster's workers have memory of their own
            check_fit_memory(samples, labels, plan_groups(samples, self.n_jobs), objective, self.checkpoints, self.n_jobs)
        initialise = not warm and given is None  # the initialising fits of init="independent"
        start_independent = initialise and self.init == "independent" and objective != independent
        start_surrogate = (
            initialise
            and self.init == "independent"
            and self.loss == "smooth_classification"
            and self.inference != "independent"
        )

        info = {"n_iter": 0, "n_restarts": 0, "loss_curve": [], "time_curve": []}
        stages = self._stages(len(samples))
        first_stage, iterations_run = _check_stage_init(stage_init, stages, given, self.random_state)
        moments = {}  # (image indices, class weights) -> the features' second moments, once per fit

        def preconditioner(objective, indices, batches):
            if not self.precondition:
                return None
            key = (tuple(indices), objective.class_weight)
            if key not in moments:
                moments[key] = self._retrying(progress, lambda: objective.feature_moments(batches))
            return Preconditioner.of(objective, *moments[key], float(self.reg))

        with contextlib.ExitStack() as fit_scope:
            every_image = []  # the batches of all images, packed at most once per fit

            def batches_of(indices, scope):
                if len(indices) < len(samples):
                    return scope.enter_context(ImageBatches(
                        [samples[k] for k in indices], [labels[k] for k in indices], self.n_jobs, self.verbose
                    ))
                if not every_image:
                    every_image.append(fit_scope.enter_context(ImageBatches(samples, labels, self.n_jobs, self.verbose)))
                return every_image[0]

            if start_independent:
                self._log("init: fitting the independent model (univariate logistic)")
                every = range(len(samples))
                batches = batches_of(every, fit_scope)
                (unary_coef, _), _ = self._fit_weights(
                    independent, batches, unary_coef, pairwise_coef, independent.total_weight(labels),
                    "independent", progress, int(self.max_iter), preconditioner(independent, every, batches),
                )
            for stage, (indices, stage_max_iter) in enumerate(stages):
                if progress.stopped:  # by the callback
                    break
                if stage < first_stage:  # resumed after it
                    continue
                progress.iterations_before = iterations_run if stage == first_stage else 0
                stage_max_iter -= progress.iterations_before
                if stage_max_iter == 0 and stage_init is not None:
                    continue
                stage_labelled = int(sum(np.count_nonzero(labels[k] >= 0) for k in indices))
                stage_weight = objective.total_weight([labels[k] for k in indices])
                if stage_weight == 0:
                    continue
                name = "fit" if len(indices) == len(samples) else f"fit[{len(indices)} images]"
                with contextlib.ExitStack() as stage_scope:
                    batches = batches_of(indices, stage_scope)
                    progress.stage_index = None  # until the initialising fit is done
                    if start_surrogate:
                        self._log("init: fitting surrogate likelihood")
                        surrogate = self._objective("surrogate_likelihood", self.inference, shape_f, shape_g)  # unweighted
                        (unary_coef, pairwise_coef), _ = self._fit_weights(
                            surrogate, batches, unary_coef, pairwise_coef, stage_labelled, "surrogate_likelihood",
                            progress, stage_max_iter, preconditioner(surrogate, indices, batches),
                        )
                        start_surrogate = False
                        if progress.stopped:
                            break
                    progress.stage_index = stage
                    (unary_coef, pairwise_coef), stage_info = self._fit_weights(
                        objective, batches, unary_coef, pairwise_coef, stage_weight, name, progress,
                        stage_max_iter, preconditioner(objective, indices, batches), warn=stage == len(stages) - 1,
                    )
                for key in info:
                    info[key] += stage_info[key]

        self.unary_coef_ = unary_coef
        self.pairwise_coef_ = pairwise_coef
        self.n_states_ = n_states
        self.classes_ = classes
        self.n_node_features_ = n_node_features
        self.n_edge_features_ = n_edge_features
        self.n_iter_ = info["n_iter"]
        self.n_restarts_ = info["n_restarts"]
        self.loss_curve_ = info["loss_curve"]
        self.time_curve_ = info["time_curve"]
        self.kernel_time_ = progress.kernel_time
        self.n_inference_iter_ = progress.diagnostics.inference_iterations
        self._warn_diagnostics(progress.diagnostics, progress.n_images, "per-image gradient computations", "fit")
        self._warn_not_converged(progress.not_converged)
        self.fit_time_ = time.perf_counter() - progress.start
        return self

    def _fit_weights(self, objective, batches, unary_coef, pairwise_coef, n_labelled, stage, progress, max_iter,
                     preconditioner=None, warn=True):
        """Minimise ``objective`` over the images of ``batches`` from (F, G),
        in the coordinates of ``preconditioner`` (a :class:`Preconditioner`)
        unless None."""
        reg = float(self.reg)

        def loss_gradient(w):
            value, grad, diagnostics, seconds = self._retrying(
                progress, lambda: objective.loss_gradient(w, batches, n_labelled, reg, starts))
            progress.kernel_time += seconds
            progress.diagnostics += diagnostics
            progress.n_images += batches.n_images
            return value, grad

        w0 = objective.pack(unary_coef, pairwise_coef)
        with objective.warm_starts(batches) as starts:  # each stage starts cold
            w, info = self._minimize(loss_gradient, w0, objective.unpack, stage, progress, max_iter, warn,
                                     preconditioner)
        return objective.unpack(w), info

    def _retrying(self, progress, compute):
        """``compute()`` over the workers, recomputed once with fresh workers
        if a worker process died (:meth:`_lost_worker`)."""
        while True:
            try:
                return compute()
            except LostWorker as lost:
                progress.lost_workers += 1
                self._lost_worker(lost, "fit", retry=progress.lost_workers == 1)

    def _lost_worker(self, lost, where, retry):
        """Warn that a worker died during ``where`` (fresh workers then recompute)
        or, without ``retry``, raise :class:`WorkerLostError`; both name the remedies."""
        when = f"{where} for the second time" if where == "fit" and not retry else where
        cause = (
            f"a joblib worker process died during {when}, most likely killed by the operating system for lack of "
            "memory (each worker holds its batch of images and the inference stack of its largest image)"
        )
        remedies = (
            f"to use less memory per worker, lower n_jobs (now {self.n_jobs!r}), set checkpoints= (fewer "
            "snapshots of truncated fitting, e.g. checkpoints=5) or use dtype=np.float32"
        )
        if not retry:
            said = str(lost).splitlines()[0] if str(lost) else ""
            raise WorkerLostError(f"{cause}; {remedies}. joblib said: {said}") from lost
        warn_at_caller(f"{cause}; fresh workers recomputed that evaluation, so the fit is unchanged. If it happens "
                       f"again the fit stops: {remedies}", WorkerLostWarning)

    @staticmethod
    def _warn_not_converged(stages):
        """One ConvergenceWarning for the stages of a fit (initialising fits
        included) where L-BFGS stopped before ``lbfgs_tol``, saying what to do."""
        if not stages:
            return
        advice = []
        if any("max_iter=" in s for s in stages):
            advice.append("raise max_iter (or loosen lbfgs_tol) to fit further")
        if any("line search" in s for s in stages):
            advice.append(
                "a failed line search means the gradient is inexact at these weights (approximate inference, "
                "too few n_iter, a loose tol) or the objective is flat to rounding; the model is usable, and raising "
                "max_restarts, n_iter or inference_max_iter, tightening tol, or raising reg may let it go further"
            )
        warn_at_caller(
            f"L-BFGS stopped before lbfgs_tol in {len(stages)} stage{'s' if len(stages) > 1 else ''} of the fit "
            f"({'; '.join(stages)}); the model keeps the weights reached. To go on: {'; '.join(advice) or 'see n_iter_'}",
            ConvergenceWarning,
        )

    def _warn_diagnostics(self, diagnostics, n_images, computations, where):
        """One warning per kind of :class:`_Diagnostics`, with how often it occurred."""
        among = f"in {{}} of {n_images} {computations}"
        if diagnostics.not_converged and where == "prediction":
            warn_at_caller(
                f"inference did not reach tol={self.tol:g} within inference_max_iter={self.inference_max_iter} "
                f"iterations on {diagnostics.not_converged} of {n_images} samples; their marginals are not converged",
                ConvergenceWarning,
            )
        elif diagnostics.not_converged:
            warn_at_caller(
                f"during {where}: {self.inference} inference did not converge to tol={self.tol:g} within "
                f"inference_max_iter={self.inference_max_iter} iterations "
                f"{among.format(diagnostics.not_converged)}, so its marginals there are not a fixed point and "
                f"the gradient, which assumes a fixed point, may be far off; raise inference_max_iter, loosen tol, "
                f"or use gradient_mode='truncated'",
                RuntimeWarning,
            )
        if diagnostics.floored:
            from .trw import floor_clause

            dtype = np.dtype(self.dtype)
            warn_at_caller(
                f"during {where}: {self.inference} message entries were at {floor_clause(dtype)} "
                f"{among.format(diagnostics.floored)}, so the marginals there may be inaccurate; use a larger reg, "
                f"{'dtype=numpy.float64, ' if dtype == np.float32 else ''}mean field or exact inference",
                RuntimeWarning,
            )
        if diagnostics.fallback:
            warn_at_caller(
                f"during {where}: the reverse sweeps of gradient_mode='backprop' diverged "
                f"{among.format(diagnostics.fallback)}; the gradient was computed through the forward iterations "
                f"instead (exact for the reported loss)",
                BackpropFallbackWarning,
            )

    def _minimize(self, objective, w0, unpack, stage, progress, max_iter, warn=True, preconditioner=None):
        """L-BFGS-B with restarts after an abnormal line search, in the
        coordinates of ``preconditioner`` (None: the weights themselves);
        ``objective(w)`` gives the value and gradient at the weight vector
        ``w``, ``unpack(w)`` its (F, G) for the user's ``callback``, which
        may stop the fit (``progress.stopped``)."""
        if preconditioner is None:
            weights_at = coordinates_of = gradient_in = lambda v: v
        else:
            weights_at = preconditioner.weights
            coordinates_of = preconditioner.coordinates
            gradient_in = preconditioner.gradient
        last = {"z": None, "f": np.nan, "g": None}  # g: the gradient in the weights
        start = []  # the objective at w0, where the stopping rule's window opens
        curve = []
        times = []
        n_restarts = 0

        def converged(g):
            return float(np.max(np.abs(g), initial=0.0)) <= self.lbfgs_tol

        def fun(z):
            w = weights_at(z)
            f, g = objective(w)
            last.update(z=z.copy(), f=f, g=g)
            if not start:
                start.append(f)
                if converged(g):  # as scipy's gtol: checked at the start, then at each iterate
                    raise _Converged(w0)  # the start itself, not its round trip through z
            return f, gradient_in(g)

        def callback(intermediate_result):
            f = float(intermediate_result.fun)
            w = weights_at(intermediate_result.x)
            curve.append(f)
            times.append(time.perf_counter() - progress.start)
            # L-BFGS-B evaluates the accepted iterate last
            g = last["g"] if last["z"] is not None and np.array_equal(last["z"], intermediate_result.x) else None
            if self.verbose > 0:
                gnorm = float(np.linalg.norm(g)) if g is not None else float("nan")
                self._log(f"{stage} iter {len(curve):4d}  objective {f:.8g}  |grad| {gnorm:.3e}  time {times[-1]:.2f}s")
            if self.callback is not None:
                unary_coef, pairwise_coef = unpack(w)
                in_schedule = progress.stage_index is not None
                report = Bunch(
                    stage=stage, stage_index=progress.stage_index,
                    n_iter=len(curve) + (progress.iterations_before if in_schedule else 0), objective=f,
                    unary_coef=unary_coef, pairwise_coef=pairwise_coef,
                    n_restarts=n_restarts, elapsed=times[-1], params=self.get_params(deep=False),
                )
                if self.callback(report):
                    raise _StopFit(w)
            if g is not None and converged(g):
                raise _Converged(w)
            if self._stalled(start + curve):
                raise _Stalled(w)

        # One BLAS thread: L-BFGS-B's small products (and the preconditioner's)
        # gain nothing from threads, and with several their rounding (1e-14)
        # depended on the process's history (e.g. an earlier threading-backend
        # fit), so the weights would not be reproducible bit for bit.
        with threadpool_limits(limits=1, user_api="blas"):
            w0 = np.asarray(w0, dtype=np.float64)
            z0 = z = coordinates_of(w0)
            w = None  # set when L-BFGS is stopped here
            n_iter = 0
            result = None
            while n_iter < max_iter:
                f_start = last["f"] if last["z"] is not None and np.array_equal(last["z"], z) else None
                try:
                    result = scipy.optimize.minimize(
                        fun, z, jac=True, method="L-BFGS-B", callback=callback,
                        # gtol 0: lbfgs_tol is checked here, on the gradient in the weights
                        options={"maxiter": max_iter - n_iter, "gtol": 0.0},
                    )
                except _StopFit as stop:  # lbfgs_tol, the stopping rule or the user's callback
                    if isinstance(stop, _Converged):
                        self._log(f"{stage}: the largest gradient entry reached lbfgs_tol={self.lbfgs_tol:g} "
                                  f"after {len(curve)} iterations")
                    elif isinstance(stop, _Stalled):
                        self._log(
                            f"{stage}: the objective fell by less than objective_tol={self.objective_tol:g} "
                            f"(relative) over the last n_iter_no_change={self.n_iter_no_change} iterations; "
                            f"stopped after {len(curve)}"
                        )
                    else:
                        self._log(f"{stage}: stopped by the callback after {len(curve)} iterations")
                        progress.stopped = True
                    w, n_iter, result = stop.weights, len(curve), None
                    break
                n_iter += int(result.nit)
                improved = f_start is None or (np.isfinite(result.fun) and result.fun < f_start)
                if np.all(np.isfinite(result.x)):
                    z = result.x
                if (result.status == 2 and n_iter < max_iter and n_restarts < self.max_restarts and improved
                        and result.nit > 0):
                    n_restarts += 1
                    self._log(f"{stage}: L-BFGS stopped ({result.message}); restart {n_restarts}")
                    continue
                break
            if w is None:
                w = w0 if z is z0 else weights_at(z)
        if warn and result is not None and result.status != 0:
            if n_iter >= max_iter:
                progress.not_converged.append(f"{stage}: reached max_iter={max_iter} iterations")
            elif result.status == 2:  # scipy's "ABNORMAL": the line search found no decrease
                progress.not_converged.append(
                    f"{stage}: after {n_iter} iterations and {n_restarts} restarts (max_restarts="
                    f"{self.max_restarts}), the line search found no lower objective along the search direction "
                    f"(scipy: {str(result.message).rstrip(': ') or 'ABNORMAL'})"
                )
            else:
                progress.not_converged.append(f"{stage}: stopped after {n_iter} iterations ({result.message})")
        if not np.all(np.isfinite(w)):
            raise FloatingPointError(f"the {stage} weights became non-finite; try a larger reg or fewer n_iter")
        return w, {"n_iter": n_iter, "n_restarts": n_restarts, "loss_curve": curve, "time_curve": times}

    def _stalled(self, objectives):
        """Whether the stopping rule ends a stage whose objective went through
        ``objectives`` (the start, then one value per L-BFGS iteration): it
        fell by less than ``objective_tol * |f|`` over the last
        ``n_iter_no_change`` iterations."""
        return objective_stalled(objectives, self.n_iter_no_change, self.objective_tol)

    # -- prediction -----------------------------------------------------------------

    def _node_marginals(self, X):
        """Validated samples and their (n, K) unary marginals."""
        check_is_fitted(self)
        samples, _, _ = _check_X(X, self.n_node_features_, self.n_edge_features_)
        objective = self._objective(
            self.loss, self.inference, self.unary_coef_.shape, self.pairwise_coef_.shape, prediction=True
        )
        with ImageBatches(samples, None, self.n_jobs, self.verbose) as batches:
            try:
                marginals, diagnostics = objective.marginals(self.unary_coef_, self.pairwise_coef_, batches)
            except LostWorker as lost:
                self._lost_worker(lost, "prediction", retry=False)
        self._warn_diagnostics(diagnostics, len(samples), "samples", "prediction")
        return samples, marginals

    def predict_proba(self, X):
        """Marginals of every sample: (n, K), (H, W, K) on a grid, or upsampled to
        the image size when the sample carries one. The last axis follows
        ``classes_``.

        Returns
        -------
        list of ndarray
        """
        samples, marginals = self._node_marginals(X)
        return [marginals_to_image(mu, s.sample) for s, mu in zip(samples, marginals)]

    def predict(self, X):
        """Maximum posterior marginal labels, shaped like each sample.

        Returns
        -------
        list of ndarray
            Labels among ``classes_`` (of their dtype), of shape (n,), (H, W)
            or the image shape.
        """
        return [self.classes_[np.argmax(p, axis=-1)] for p in self.predict_proba(X)]

    def score(self, X, y):
        """Accuracy (1 - Hamming error) over the labelled nodes of all
        samples, counted at the nodes of the CRF grid.

        With features computed at ``scale < 1`` the grid is coarser than the
        image: labels given at image size are reduced to the grid (nearest
        neighbour), as in ``fit``, while ``predict`` answers at the image
        size. To score at the image size, use
        ``sklearn_margcrf.metrics.get_scorer("node_accuracy", resolution="image")``.

        Parameters
        ----------
        X : list of samples
        y : list of label arrays
            Labels among ``classes_`` (None, or -1 for integer labels, =
            unlabelled); a label outside ``classes_`` raises ValueError.

        Returns
        -------
        float
        """
        from .metrics import hamming_error_from_marginals

        samples, marginals = self._node_marginals(X)
        labels, _ = _check_y(y, samples, self.classes_)
        return 1.0 - hamming_error_from_marginals(labels, marginals)
