"""The objective of :class:`~sklearn_margcrf.MarginalCRF`: one object owns
the linear parametrisation, the per-image loss and the ridge penalty (in the
spirit of scikit-learn's ``LinearModelLoss``).

Parametrisation (paper, Sec. "Setup" of the experiments): the unary and
pairwise parameters of an image are linear in its features,

    theta_i  = F u_i       F : (K, Fu)
    theta_ij = G v_ij      G : (K, K, Fe)

and the chain rule gives ``dL/dF = sum_i dL/dtheta_i u_i^T`` and
``dL/dG = sum_ij dL/dtheta_ij v_ij^T`` (:mod:`._linear`). The objective is the
loss per labelled node plus a ridge penalty,

    R(F, G) = (sum over images of L) / (number of labelled nodes) + reg * (||F||^2 + ||G||^2).

With class weights, each labelled node's terms of L weigh its class's weight
(the per-image node weights of :func:`~sklearn_margcrf.loss_and_grad`) and
the sum is divided by the total weight of the labelled nodes instead: a
weighted mean, so that weights that are all equal change nothing.

The independent model is the same model with every image's edges dropped:
zero iterations of TRW give ``softmax(theta_i)``, and ``G`` is not a weight.

L-BFGS can run in other coordinates (:class:`Preconditioner`): ``F = A S_u``,
``G = B S_v`` with ``S = (c M + 2 reg I)^(-1/2)``, where ``M`` is the second
moment of the node (edge) features per labelled node and ``c`` the logistic
loss's curvature at ``mu = 1/2``. ``c M + 2 reg I`` is then the Hessian of the
objective in ``F`` (in ``G``) up to the factor over labels, and in ``(A, B)``
it is close to the identity: the objective and its minimum are unchanged,
but real image features, whose second moments span many orders of magnitude
(the horses' 100 node features: eigenvalues from 1e-17 to 9), no longer
slow L-BFGS down.
"""

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np
from threadpoolctl import threadpool_limits

from ._linear import feature_scores, second_moment, weight_gradient
from .gradients import _Diagnostics, _loss_and_grad, _marginals, _Settings, warm_start_applies
from ._workspace import scratch, scratch_copy, workspace
from .inference import KERNELS

__all__ = ["CRFObjective", "Preconditioner"]

#: Curvature of the loss per unit of potential that :class:`Preconditioner`
#: assumes: the logistic loss's at ``mu = 1/2`` (1/4). Measured on horses
#: (quarter scale, 200 images): 0.1, 0.25 and 1 gave the same objective
#: within 0.2% after 20 iterations; only the balance with the ridge term
#: depends on it.
CURVATURE = 0.25


@dataclass(frozen=True)
class CRFObjective:
    """Loss, gradient and marginals of the linear CRF over images.

    Parameters
    ----------
    settings : gradients._Settings
        The per-image loss and how its gradient (or, for prediction, the
        marginals) are computed. ``inference="independent"`` is the
        independent model: every image's edges are dropped, zero iterations
        of TRW give ``softmax(theta_i)``, and the weight vector holds ``F``
        only (``settings`` then holds those inference settings).
    shape_f, shape_g : tuple
        Shapes of ``F`` (K, Fu) and ``G`` (K, K, Fe).
    dtype : numpy.dtype, default=float64
        Precision of the potentials and of inference; the feature products
        and the weight gradients accumulate in float64 whatever it is.
    class_weight : tuple of float or None, default=None
        Weight of each class (by label code); None weighs every node 1.
    warm_start : bool, default=False
        Start each image's inference in :meth:`loss_gradient` from where it
        ended at the previous evaluation (``starts`` of :meth:`warm_starts`);
        only where ``gradients.warm_start_applies(settings)`` (ValueError
        otherwise).
    """

    settings: _Settings
    shape_f: tuple
    shape_g: tuple
    dtype: np.dtype = np.dtype(np.float64)
    class_weight: tuple = None
    warm_start: bool = False
    independent: bool = field(init=False)

    def __post_init__(self):
        independent = self.settings.inference == "independent"
        object.__setattr__(self, "independent", independent)
        if independent:
            settings = replace(self.settings, inference="trw", gradient_mode="truncated", n_iter=0, rho=None)
            object.__setattr__(self, "settings", settings)
        if self.warm_start and not warm_start_applies(self.settings):
            raise ValueError(f"warm starts do not apply to {self.settings}")

    # -- weights ---------------------------------------------------------------

    def pack(self, unary_coef, pairwise_coef):
        """The weight vector of (F, G) (F only for the independent model)."""
        if self.independent:
            return unary_coef.ravel().copy()
        return np.concatenate([unary_coef.ravel(), pairwise_coef.ravel()])

    def unpack(self, w):
        """Copies (F, G) of a weight vector; ``G`` is zero for the independent model."""
        size_f = int(np.prod(self.shape_f))
        F = w[:size_f].reshape(self.shape_f).copy()
        G = np.zeros(self.shape_g) if self.independent else w[size_f:].reshape(self.shape_g).copy()
        return F, G

    # -- one image ---------------------------------------------------------------

    def theta(self, unary_coef, pairwise_coef, node_features, edges, edge_features):
        """(edges, theta_i = F u_i (n, K), theta_ij = G v_ij (E, K, K)) of an image."""
        n_states = self.shape_f[0]
        # scores straight into scratch arrays of the compute dtype: no float64
        # temporaries to convert, and no fresh pages per image (see _workspace)
        unary = feature_scores(node_features, unary_coef, scratch((len(node_features), n_states), self.dtype))
        if self.independent:
            return np.zeros((0, 2), dtype=np.int64), unary, np.zeros((0, n_states, n_states), self.dtype)
        pairwise = feature_scores(edge_features, pairwise_coef.reshape(n_states * n_states, -1),
                                  scratch((len(edge_features), n_states * n_states), self.dtype))
        # The features were checked finite in fit / predict; what can still
        # overflow is the product with the weights, and the user never passed a
        # "unary", so say which it is.
        if not (np.isfinite(unary.sum()) and np.isfinite(pairwise.sum())):
            raise FloatingPointError(
                "the potentials theta_i = F u_i or theta_ij = G v_ij of an image overflowed (non-finite values): "
                "the features are too large for the weights; rescale the features (e.g. StandardScaler) or raise reg"
            )
        if not edges.flags.writeable:
            # Memory-mapped batch: the kernels accept read-only arrays, but numba
            # compiles them as a separate signature; a copy of the (small) edge
            # list keeps one compiled version per kernel.
            edges = scratch_copy(edges)
        return edges, unary, pairwise.reshape(-1, n_states, n_states)

    def node_weight(self, labels):
        """The weight of each node of an image (its class's; 0 when
        unlabelled), or None without class weights."""
        if self.class_weight is None:
            return None
        return np.where(labels >= 0, np.asarray(self.class_weight)[np.maximum(labels, 0)], 0.0)

    def total_weight(self, labels):
        """The denominator of the objective over images with these labels:
        the total weight of their labelled nodes (their number without class
        weights)."""
        if self.class_weight is None:
            return int(sum(np.count_nonzero(lab >= 0) for lab in labels))
        return float(sum(self.node_weight(lab).sum() for lab in labels))

    def image_loss_gradient(self, unary_coef, pairwise_coef, node_features, edges, edge_features, labels,
                            start=None):
        """(loss, dL/dF, dL/dG, diagnostics, seconds in the loss, end) of one
        image, its inference started from ``start`` (None: cold) and ended at
        ``end`` (None without warm starts)."""
        edges, unary, pairwise = self.theta(unary_coef, pairwise_coef, node_features, edges, edge_features)
        clock = time.perf_counter()
        value, grad_unary, grad_pairwise, diagnostics, end = _loss_and_grad(
            edges, unary, pairwise, labels, self.settings, self.node_weight(labels), start
        )
        seconds = time.perf_counter() - clock
        grad_f = weight_gradient(grad_unary, node_features)
        if self.independent:
            grad_g = np.zeros(self.shape_g)
        else:
            n_pairs = self.shape_g[0] * self.shape_g[1]
            grad_g = weight_gradient(grad_pairwise.reshape(-1, n_pairs), edge_features).reshape(self.shape_g)
        return value, grad_f, grad_g, diagnostics, seconds, end

    def image_marginals(self, unary_coef, pairwise_coef, node_features, edges, edge_features):
        """Unary marginals (n, K) of one image and their diagnostics."""
        edges, unary, pairwise = self.theta(unary_coef, pairwise_coef, node_features, edges, edge_features)
        return _marginals(edges, unary, pairwise, self.settings)

    # -- all images ----------------------------------------------------------------

    def warm_starts(self, batches):
        """A context manager giving the ``starts`` of :meth:`loss_gradient`
        over ``batches`` for one minimisation: a :class:`._parallel.WarmStarts`
        with ``warm_start`` (removed on exit), else None."""
        if not self.warm_start:
            return nullcontext(None)
        end_size = KERNELS[self.settings.inference].end_size
        n_states = self.shape_f[0]
        return batches.warm_starts([end_size(n, e, n_states) for n, e in batches.graph_sizes], self.dtype)

    def loss_gradient(self, w, batches, n_labelled, reg, starts=None):
        """The objective R and its gradient at the weight vector ``w`` over the
        images of ``batches`` (:class:`._parallel.ImageBatches`), summed in image
        order (so independent of n_jobs and the backend); with the summed
        diagnostics and seconds spent in the per-image losses. With ``starts``
        (:meth:`warm_starts`), each image's inference starts where it ended
        at the previous call."""
        F, G = self.unpack(w)
        value, grad_f, grad_g = 0.0, np.zeros(self.shape_f), np.zeros(self.shape_g)
        diagnostics, seconds = _Diagnostics(), 0.0
        for v, gf, gg, d, s in batches.map(_batch_loss_gradient, self, F, G, starts=starts):
            value += v
            grad_f += gf
            grad_g += gg
            diagnostics += d
            seconds += s
        grad = self.pack(grad_f, grad_g)
        return value / n_labelled + reg * float(w @ w), grad / n_labelled + 2.0 * reg * w, diagnostics, seconds

    def feature_moments(self, batches):
        """The second moments of the node features over the labelled nodes
        (weighted by class, as the loss) and of the edge features over all
        edges, both per unit of the objective's denominator, summed in image
        order: ``(M_u (Fu, Fu), M_v (Fe, Fe))``."""
        node, edge, total = 0.0, 0.0, 0.0
        for node_moment, edge_moment, weight in batches.map(_batch_moments, self):
            node, edge, total = node + node_moment, edge + edge_moment, total + weight
        if not (np.isfinite(node.sum()) and np.isfinite(edge.sum())):
            raise FloatingPointError(
                "the second moments of the features overflowed (non-finite values): the features are too large; "
                "rescale the features (e.g. StandardScaler)"
            )
        return node / total, edge / total

    def marginals(self, unary_coef, pairwise_coef, batches):
        """Unary marginals of every image of ``batches``, in image order, and their summed diagnostics."""
        results = batches.map(_batch_marginals, self, unary_coef, pairwise_coef)
        return [mu for mu, _ in results], sum((d for _, d in results), _Diagnostics())


def _batch_loss_gradient(batch, objective, unary_coef, pairwise_coef, starts=None):
    """Per-image results of :meth:`CRFObjective.image_loss_gradient` (worker
    side), each image started from and its end kept in ``starts``
    (:class:`._parallel.ImageStarts`) when given."""
    results = []
    for b, image in enumerate(batch.images()):
        with workspace():  # each image reuses the scratch arrays of the one before
            *result, end = objective.image_loss_gradient(
                unary_coef, pairwise_coef, *image, start=None if starts is None else starts.start(b)
            )
            if starts is not None:
                starts.keep(b, end)
        results.append(result)
    return results


def _batch_moments(batch, objective):
    """Per-image (node moment, edge moment, total node weight) (worker side)."""
    results = []
    for node_features, _, edge_features, labels in batch.images():
        weight = objective.node_weight(labels)
        weight = (labels >= 0).astype(np.float64) if weight is None else weight
        # the edge moments even for the independent model, whose G is not a
        # weight: the fit that it starts shares its moments
        edge_moment = second_moment(edge_features, np.ones(len(edge_features)))
        results.append((second_moment(node_features, weight), edge_moment, float(weight.sum())))
    return results


def _batch_marginals(batch, objective, unary_coef, pairwise_coef):
    """Per-image results of :meth:`CRFObjective.image_marginals` (worker side)."""
    results = []
    for image in batch.images():
        with workspace():
            mu, diagnostics = objective.image_marginals(unary_coef, pairwise_coef, *image[:3])
            results.append((np.array(mu), diagnostics))  # out of the workspace's memory
    return results


def _inverse_square_root(matrix):
    """``(matrix^(-1/2), matrix^(1/2))`` of a symmetric positive semi-definite
    matrix, its eigenvalues floored at 1e-12 of the largest (a feature that
    is zero everywhere with ``reg = 0``); the identity for a zero matrix."""
    values, vectors = np.linalg.eigh(matrix)
    top = values.max(initial=0.0)
    if top <= 0:
        eye = np.eye(len(matrix))
        return eye, eye
    roots = np.sqrt(np.maximum(values, 1e-12 * top))
    return (vectors / roots) @ vectors.T, (vectors * roots) @ vectors.T


@dataclass(frozen=True)
class Preconditioner:
    """The coordinates ``z = (A, B)`` of L-BFGS, where ``F = A S_u`` and
    ``G = B S_v`` (module docstring). ``S`` is symmetric, so the gradient in
    ``z`` is ``dR/dF S_u``, ``dR/dG S_v``: the same map as from ``z`` to the
    weights."""

    objective: CRFObjective
    node_root: np.ndarray  # S_u
    edge_root: np.ndarray  # S_v
    node_root_inverse: np.ndarray
    edge_root_inverse: np.ndarray

    @classmethod
    def of(cls, objective, node_moment, edge_moment, reg):
        """From the features' second moments (:meth:`CRFObjective.feature_moments`) and the ridge ``reg``."""
        # one LAPACK thread: the same rounding whatever ran in this process
        # before, so that the weights do not depend on n_jobs or the backend
        with threadpool_limits(limits=1, user_api="blas"):
            node_root, node_root_inverse = _inverse_square_root(
                CURVATURE * node_moment + 2 * reg * np.eye(len(node_moment)))
            edge_root, edge_root_inverse = _inverse_square_root(
                CURVATURE * edge_moment + 2 * reg * np.eye(len(edge_moment)))
        return cls(objective, node_root, edge_root, node_root_inverse, edge_root_inverse)

    def _apply(self, vector, node_matrix, edge_matrix):
        F, G = self.objective.unpack(vector)
        n_pairs = G.shape[0] * G.shape[1]
        return self.objective.pack(F @ node_matrix, (G.reshape(n_pairs, G.shape[2]) @ edge_matrix).reshape(G.shape))

    def weights(self, z):
        """The weight vector of (F, G) at coordinates ``z``."""
        return self._apply(z, self.node_root, self.edge_root)

    def coordinates(self, w):
        """The coordinates of the weight vector ``w``."""
        return self._apply(w, self.node_root_inverse, self.edge_root_inverse)

    def gradient(self, grad):
        """The gradient in ``z`` of a function whose gradient in the weights is ``grad``."""
        return self._apply(grad, self.node_root, self.edge_root)
