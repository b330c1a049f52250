"""Loss gradients ``dL/dtheta``: the paper's four ways, behind ``loss_and_grad``.

A gradient mode combines an inference method with a loss ``Q(mu, theta)``:

``"truncated"`` (Sec. "Truncated Fitting")
    The loss of the marginals after exactly ``n_iter`` iterations from uniform
    messages is a differentiable function of theta; back TRW / back mean field
    (:mod:`.trw`, :mod:`.mean_field`) give its exact gradient, restoring the
    overwritten messages from a stack.
``"backprop"`` (remark after Algorithm "Back TRW")
    Inference runs to ``tol``; the reverse sweeps are repeated at the converged
    messages, without a stack, until the largest adjoint message is below the
    same ``tol``. If they diverge (inference stopped at a loose threshold away
    from an attractive fixed point), the gradient is taken through exactly the iterations inference ran
    instead, with a :class:`~sklearn_margcrf.exceptions.BackpropFallbackWarning`
    (:func:`loss_and_grad`; the private core returns it as a count).
``"perturbation"`` (Sec. "Perturbation")
    ``dL/dtheta = lim (mu(theta + r dQ/dmu) - mu(theta - r dQ/dmu)) / 2r``,
    with 1-, 2- or 4-sided differences and
    ``r = multiplier * eps**(1/3) * (1 + ||theta||_inf) / ||dQ/dmu||_inf``.
``"implicit"`` (Sec. "Implicit Fitting")
    The KKT system of the local polytope, solved with scipy.sparse
    (:mod:`.implicit`), for TRW and loopy BP. For exact inference, the exact
    Hessian-vector product of log Z (complex-step differentiation of the
    junction tree) — the same implicit derivative, of the exact variational
    principle. Mean field has no linear constraint set: ValueError.

The likelihood family is differentiated through the log-partition estimate:
``A~(theta) = theta . mu + H~(mu)`` has ``dA~/dtheta = mu + J^T (theta + dH~/dmu)``
where ``J^T`` is what the gradient mode applies; at convergence the second
term vanishes and the familiar ``f(x) - mu`` remains, while under truncation it
is the exact gradient of the paper's truncated partition function.
"""

import copy
import numbers
from dataclasses import astuple, dataclass, field

import numpy as np

from ._graph import _as_labels, check_positive, validate_model
from ._warnings import warn_at_caller
from ._workspace import call_workspace, owned
from .edge_appearance import RHO_RULES
from ._checkpoints import check_checkpoints
from .exceptions import BackpropDivergenceError, BackpropFallbackWarning
from .inference import KERNELS
from .inference import METHODS as INFERENCE_METHODS
from .inference import check_iteration_controls, check_method, energy, method_entropy, resolve_rho, run_inference
from .losses import MARGINAL_LOSSES, PAIRWISE_LOSSES, _marginal_loss, piecewise, pseudolikelihood
from .trw import floor_clause, floored_message_entries

__all__ = ["loss_and_grad", "LOSSES", "GRADIENT_MODES", "check_combination"]

LIKELIHOOD_LOSSES = ("surrogate_likelihood",)
INFERENCE_FREE_LOSSES = ("pseudolikelihood", "piecewise")
LOSSES = MARGINAL_LOSSES + LIKELIHOOD_LOSSES + INFERENCE_FREE_LOSSES
#: The losses that are sums of node (and edge) terms, so that each term can be
#: weighed (``node_weight``, the estimator's ``class_weight``).
WEIGHTED_LOSSES = MARGINAL_LOSSES + INFERENCE_FREE_LOSSES
GRADIENT_MODES = ("truncated", "backprop", "perturbation", "implicit")
SIDES = (1, 2, 4)
#: The smallest perturbation multiplier m: the largest step component,
#: r * ||dQ/dmu||_inf = m * eps**(1/3) * (1 + ||theta||_inf), must reach
#: eps * (1 + ||theta||_inf), or theta +- r dQ/dmu may round back to theta
#: and the "gradient" come out exactly zero (eps of float64; a float32 model
#: needs m >= eps32**(2/3), about 2.5e-5).
MIN_MULTIPLIER = np.finfo(np.float64).eps ** (2.0 / 3.0)


def check_multiplier(multiplier, dtype):
    """Refuse a perturbation multiplier whose step rounds away in ``dtype``
    (``eps(dtype) ** (2/3)``; ``MIN_MULTIPLIER`` for float64)."""
    name = np.dtype(dtype).name
    smallest = np.finfo(dtype).eps ** (2.0 / 3.0)
    if multiplier < smallest:
        raise ValueError(
            f"multiplier must be at least eps**(2/3) = {smallest:.3g} in dtype={name}, got {multiplier!r}: a "
            f"smaller perturbation step rounds away in {name} and gives a zero gradient"
        )


def check_combination(loss, inference, gradient_mode):
    """Raise ValueError for an unknown name or a combination that does not apply."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if inference not in INFERENCE_METHODS:
        raise ValueError(f"inference must be one of {INFERENCE_METHODS}, got {inference!r}")
    if gradient_mode not in GRADIENT_MODES:
        raise ValueError(f"gradient_mode must be one of {GRADIENT_MODES}, got {gradient_mode!r}")
    if loss in INFERENCE_FREE_LOSSES:
        return
    if gradient_mode == "implicit" and inference == "mean_field":
        raise ValueError(
            "gradient_mode='implicit' does not apply to inference='mean_field': the mean-field "
            "constraint set is not linear (paper Sec. 'Implicit Fitting'); use 'truncated', "
            "'backprop' or 'perturbation'"
        )
    if inference == "exact" and gradient_mode in ("truncated", "backprop"):
        raise ValueError(
            f"gradient_mode={gradient_mode!r} needs an iterative inference method; exact inference "
            "has no iterations to truncate or back-propagate: use gradient_mode='implicit' (exact "
            "Hessian-vector product) or 'perturbation'"
        )


def _check_labels(labels, n_nodes, n_states):
    labels = np.asarray(labels)
    if labels.shape != (n_nodes,):
        raise ValueError(f"labels must have shape (n,) = ({n_nodes},), got {labels.shape}")
    return _as_labels(labels, "labels", n_states)


class _Problem:
    """A validated model with its inference settings; runs forward and backward passes."""

    def __init__(self, edges, unary, pairwise, inference, gradient_mode, n_iter, tol, max_iter, rho, sides, multiplier,
                 checkpoints=None, diagnostics=None, start=None):
        self.edges, self.unary, self.pairwise = edges, unary, pairwise
        # every forward pass starts here (KERNELS[inference].end of an earlier
        # pass; None: the kernel's usual start), the perturbed ones included,
        # so that their differences stay those of one starting point
        self.start = start
        self.inference, self.mode = inference, gradient_mode
        self.n_iter = n_iter if gradient_mode == "truncated" else None
        self.tol, self.max_iter = tol, max_iter
        self.rho = rho
        self.sides, self.multiplier = sides, multiplier
        self.checkpoints = checkpoints
        self.diagnostics = _Diagnostics() if diagnostics is None else diagnostics

    def forward(self, unary=None, pairwise=None, keep_stack=None, n_iter="default"):
        unary = self.unary if unary is None else unary
        pairwise = self.pairwise if pairwise is None else pairwise
        if keep_stack is None:
            keep_stack = self.mode == "truncated"
        if n_iter == "default":
            n_iter = self.n_iter
        # the losses read marginals only; log_partition_and_grad evaluates the
        # entropy itself, with its gradient
        # a truncated gradient does not read result.converged (the loss is
        # that of n_iter iterations, converged or not)
        state, result = run_inference(
            self.edges, unary, pairwise, self.inference, self.rho, n_iter, self.tol, self.max_iter, keep_stack,
            log_partition=False, checkpoints=self.checkpoints, start=self.start,
            check_converged=self.mode != "truncated",
        )
        self.diagnostics.inference_iterations += result.n_iter
        if self.inference in ("trw", "lbp") and floored_message_entries(state):
            self.diagnostics.floored = 1
        return state, result

    def backward(self, state, result, grad_unary_marginals, grad_pairwise_marginals):
        """Apply the transposed Jacobian d mu / d theta to (dQ/dmu_unary, dQ/dmu_pairwise);
        ``grad_pairwise_marginals`` None means zeros, which the kernels'
        backward passes skip (step 6 of back TRW, which would read the
        pairwise marginals that grid states compute on first access)."""
        if self.mode == "truncated":
            return KERNELS[self.inference].backward(state, grad_unary_marginals, grad_pairwise_marginals, mode="truncated")
        if not result.converged:
            self.diagnostics.not_converged = 1
        if self.mode == "backprop":
            if not state.converged:  # counted above; the kernels' fixed-point mode would warn about it again
                state = copy.copy(state)
                state.converged = True
            return self._backprop(state, grad_unary_marginals, grad_pairwise_marginals)
        if grad_pairwise_marginals is None:  # perturbation and implicit differentiation use an array
            grad_pairwise_marginals = np.zeros_like(self.pairwise)
        if self.mode == "perturbation":
            return self._perturbation(result, grad_unary_marginals, grad_pairwise_marginals)
        # implicit: scipy's sparse solver and the complex step run in float64;
        # the gradient is returned in the model's dtype
        if self.inference == "exact":
            from .exact import exact_hessian_vector

            grads = exact_hessian_vector(self.edges, self.unary, self.pairwise, grad_unary_marginals, grad_pairwise_marginals)
        else:
            from .implicit import implicit_gradient

            grads = implicit_gradient(self.edges, result.unary.astype(np.float64), result.pairwise.astype(np.float64),
                                      self.rho, grad_unary_marginals, grad_pairwise_marginals)
        return tuple(g.astype(self.unary.dtype, copy=False) for g in grads)

    def _backprop(self, state, grad_unary_marginals, grad_pairwise_marginals):
        """Stack-free reverse sweeps at the converged messages (Eaton and Ghahramani).

        They converge at the rate of the forward iteration, so a few times its
        iteration count suffices near an attractive fixed point. They stop at
        the inference threshold ``tol``: a tighter adjoint would not make the
        gradient more accurate than the marginals it differentiates. When
        inference stopped at a loose threshold they can instead diverge; then
        the gradient is computed by back-propagating through exactly the
        iterations inference ran (re-run with a stack), which is the exact
        gradient of the reported loss, and ``diagnostics.fallback`` says so.
        After a warm start (``self.start``), sweeps that fail are redone from
        a cold start, so that the result is never that of a short pass.
        """
        backward = KERNELS[self.inference].backward
        sweeps = 4 * int(state.n_iter) + 100
        try:
            return backward(
                state, grad_unary_marginals, grad_pairwise_marginals, mode="fixed_point",
                tol=self.tol, max_iter=sweeps, on_divergence="raise",
            )
        except BackpropDivergenceError as exc:
            if self.start is not None:
                # A warm start ran few iterations: the cap on the sweeps, and
                # a fallback through the iterations run, would be those of a
                # short pass. Do what a cold start does (a rare extra pass).
                self.start = None
                state, result = self.forward()
                return self.backward(state, result, grad_unary_marginals, grad_pairwise_marginals)
            # the stack of the forward iterations is checkpointed (self.checkpoints,
            # or the memory budget of checkpoints=None), so its memory is bounded
            self.diagnostics.fallback = 1
            stacked_state = self.forward(keep_stack=True, n_iter=int(state.n_iter))[0]
            return backward(stacked_state, grad_unary_marginals, grad_pairwise_marginals, mode="truncated")

    def _perturbation(self, result, grad_unary_marginals, grad_pairwise_marginals):
        """Paper's Algorithm "Calculating dL/dtheta by perturbation" (1-, 2-, 4-sided)."""
        scale = max(np.max(np.abs(grad_unary_marginals), initial=0.0), np.max(np.abs(grad_pairwise_marginals), initial=0.0))
        if scale == 0.0:
            return np.zeros_like(self.unary), np.zeros_like(self.pairwise)
        theta_norm = max(np.max(np.abs(self.unary), initial=0.0), np.max(np.abs(self.pairwise), initial=0.0))
        eps = float(np.finfo(self.unary.dtype).eps)  # the step must survive rounding in the model's precision
        r = self.multiplier * eps ** (1.0 / 3.0) * (1.0 + theta_norm) / scale

        def marginals_at(step):
            res = self.forward(self.unary + step * grad_unary_marginals, self.pairwise + step * grad_pairwise_marginals, keep_stack=False)[1]
            return res.unary, res.pairwise

        if self.sides == 1:
            plus = marginals_at(r)
            return tuple((p - m) / r for p, m in zip(plus, (result.unary, result.pairwise)))
        plus, minus = marginals_at(r), marginals_at(-r)
        if self.sides == 2:
            return tuple((p - m) / (2 * r) for p, m in zip(plus, minus))
        plus2, minus2 = marginals_at(2 * r), marginals_at(-2 * r)
        return tuple((-p2 + 8 * p - 8 * m + m2) / (12 * r) for p2, p, m, m2 in zip(plus2, plus, minus, minus2))

    def log_partition_and_grad(self):
        """The method's log-partition estimate A~(theta) and its gradient."""
        state, result = self.forward()
        if self.inference == "exact":
            # A = log Z exactly, and dA/dtheta = mu.
            return result.log_partition, result.unary.copy(), result.pairwise.copy()
        entropy, (dh_unary, dh_pairwise) = method_entropy(
            self.inference, self.edges, result.unary, result.pairwise, self.rho, gradient=True
        )
        value = energy(self.unary, self.pairwise, result.unary, result.pairwise) + entropy
        back_unary, back_pairwise = self.backward(state, result, self.unary + dh_unary, self.pairwise + dh_pairwise)
        return value, result.unary + back_unary, result.pairwise + back_pairwise


def _clamped(edges, unary, pairwise, labels):
    """Condition the model on the observed labels (paper Sec. "Expectation Maximization").

    Returns the model over hidden nodes, the constant ``theta . f(z)`` of the
    fully observed factors, and a function mapping gradients of the hidden
    model back to (grad_unary, grad_pairwise) of the full one (the constant's
    gradient, the indicator features of the observed labels, included).
    """
    hidden = labels < 0
    hidden_nodes = np.flatnonzero(hidden)
    new_index = np.full(labels.shape[0], -1, dtype=np.int64)
    new_index[hidden_nodes] = np.arange(hidden_nodes.size)
    i, j = edges[:, 0], edges[:, 1]
    hi, hj = hidden[i], hidden[j]
    both_hidden = np.flatnonzero(hi & hj)
    only_i_hidden = np.flatnonzero(hi & ~hj)  # j observed: theta_c(., z_j) joins node i
    only_j_hidden = np.flatnonzero(~hi & hj)
    both_observed = np.flatnonzero(~hi & ~hj)
    observed_nodes = np.flatnonzero(~hidden)

    sub_unary = unary[hidden_nodes].copy()
    np.add.at(sub_unary, new_index[i[only_i_hidden]], pairwise[only_i_hidden, :, labels[j[only_i_hidden]]])
    np.add.at(sub_unary, new_index[j[only_j_hidden]], pairwise[only_j_hidden, labels[i[only_j_hidden]], :])
    sub_edges = np.stack([new_index[i[both_hidden]], new_index[j[both_hidden]]], axis=1).reshape(-1, 2)
    sub_pairwise = pairwise[both_hidden]
    constant = unary[observed_nodes, labels[observed_nodes]].sum(dtype=np.float64) + pairwise[
        both_observed, labels[i[both_observed]], labels[j[both_observed]]
    ].sum(dtype=np.float64)

    def lift(grad_sub_unary, grad_sub_pairwise):
        grad_unary = np.zeros_like(unary)
        grad_pairwise = np.zeros_like(pairwise)
        grad_unary[hidden_nodes] = grad_sub_unary
        grad_unary[observed_nodes, labels[observed_nodes]] += 1.0
        grad_pairwise[both_hidden] = grad_sub_pairwise
        grad_pairwise[only_i_hidden, :, labels[j[only_i_hidden]]] += grad_sub_unary[new_index[i[only_i_hidden]]]
        grad_pairwise[only_j_hidden, labels[i[only_j_hidden]], :] += grad_sub_unary[new_index[j[only_j_hidden]]]
        grad_pairwise[both_observed, labels[i[both_observed]], labels[j[both_observed]]] += 1.0
        return grad_unary, grad_pairwise

    return (np.ascontiguousarray(sub_edges, dtype=np.int64), sub_unary, np.ascontiguousarray(sub_pairwise)), constant, both_hidden, lift


def _surrogate_likelihood(problem, labels):
    """-(A~(theta, z) - A~(theta)): surrogate likelihood, or surrogate EM with hidden labels."""
    log_z, grad_unary, grad_pairwise = problem.log_partition_and_grad()
    (sub_edges, sub_unary, sub_pairwise), constant, kept_edges, lift = _clamped(problem.edges, problem.unary, problem.pairwise, labels)
    if sub_unary.shape[0] == 0:
        clamped_value = constant
        clamped_grad = lift(np.zeros((0, problem.unary.shape[1])), np.zeros((0,) + problem.pairwise.shape[1:]))
    else:
        sub_rho = None if problem.rho is None else np.ascontiguousarray(problem.rho[kept_edges])
        sub_problem = _Problem(
            sub_edges, sub_unary, sub_pairwise, problem.inference, problem.mode, problem.n_iter,
            problem.tol, problem.max_iter, sub_rho, problem.sides, problem.multiplier, problem.checkpoints,
            problem.diagnostics,
        )
        sub_value, sub_grad_unary, sub_grad_pairwise = sub_problem.log_partition_and_grad()
        clamped_value = constant + sub_value
        clamped_grad = lift(sub_grad_unary, sub_grad_pairwise)
    value = log_z - clamped_value
    return value, grad_unary - clamped_grad[0], grad_pairwise - clamped_grad[1]


@dataclass
class _Diagnostics:
    """What one computation could not do as asked, as counts (0 or 1 for one
    image; they add up over images): inference that did not reach ``tol``
    (the non-truncated gradient modes), TRW / LBP messages at their floor,
    and back-propagations that fell back to the stored iterations. Returned
    as data, so that callers warn once for many images, in their own words.
    With them, the work done: the inference iterations run (all forward
    passes, perturbed and re-run ones included)."""

    not_converged: int = 0
    floored: int = 0
    fallback: int = 0
    inference_iterations: int = 0

    def __add__(self, other):
        return _Diagnostics(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def warnings(self, settings, dtype):
        """(category, message) of each kind that occurred, as :func:`loss_and_grad` reports it
        (``dtype``: the model's)."""
        out = []
        if self.not_converged:
            out.append((RuntimeWarning, (
                f"gradient_mode={settings.gradient_mode!r}: {settings.inference} inference did not converge to "
                f"tol={settings.tol:g} in max_iter={settings.max_iter} iterations, so its marginals are not a fixed "
                "point and the gradient, which assumes a fixed point, may be far off; raise max_iter, loosen tol, "
                "or use gradient_mode='truncated'"
            )))
        if self.floored:
            out.append((RuntimeWarning, (
                f"{settings.inference}: message entries are at {floor_clause(dtype)}, so the marginals may be "
                f"inaccurate (even when converged); use smaller parameters (e.g. a larger reg)"
                f"{', float64' if dtype == np.float32 else ''}, mean field or exact inference"
            )))
        if self.fallback:
            out.append((BackpropFallbackWarning, (
                "gradient_mode='backprop': the reverse sweeps at the converged messages diverged; the gradient "
                "was computed through the forward iterations instead (exact for the reported loss)"
            )))
        return out


@dataclass(frozen=True)
class _Settings:
    """The validated keyword arguments of :func:`loss_and_grad` (``n_iter``
    None: inference to ``tol``; ``rho`` as given: a rule name is resolved per
    graph)."""

    loss: str = "univariate_logistic"
    inference: str = "trw"
    gradient_mode: str = "truncated"
    n_iter: int = 20
    tol: float = 1e-6
    max_iter: int = 1000
    rho: object = field(default=None, hash=False)
    alpha: float = 15.0
    sides: int = 2
    multiplier: float = 1.0
    checkpoints: int = None


def check_node_weight_loss(loss, what="node_weight"):
    """ValueError when ``loss`` is not a sum over nodes that ``what`` could weigh."""
    if loss not in WEIGHTED_LOSSES:
        raise ValueError(
            f"{what} does not apply to loss={loss!r}, which is not a sum of terms over nodes; "
            f"it applies to {', '.join(WEIGHTED_LOSSES)}"
        )


#: The gradient modes whose gradient depends on the fixed point that
#: inference reaches and not on where it starts (with "truncated" the start
#: is part of the model): see docs/scaling.rst, "Warm starts".
WARM_START_MODES = ("backprop", "perturbation", "implicit")


def warm_start_applies(settings):
    """Whether the inference of a loss under ``settings`` may start from
    where an earlier evaluation's ended (:func:`_loss_and_grad`'s ``start``):
    a marginal loss, an iterative method and a mode of ``WARM_START_MODES``."""
    return (settings.loss in MARGINAL_LOSSES and settings.inference in KERNELS
            and settings.gradient_mode in WARM_START_MODES)


def _loss_and_grad(edges, unary, pairwise, labels, settings, node_weight=None, start=None):
    """:func:`loss_and_grad` of validated inputs, with its diagnostics
    returned (:class:`_Diagnostics`) instead of warned:
    ``(value, grad_unary, grad_pairwise, diagnostics, end)``. ``node_weight``
    (n,) weighs the terms of the losses of ``WEIGHTED_LOSSES``. Where
    :func:`warm_start_applies`, inference starts from ``start`` (None: its
    usual start) and ``end`` is where it ended (``KERNELS[...].end``, to
    start the next evaluation from); otherwise ``end`` is None."""
    if settings.loss in INFERENCE_FREE_LOSSES:
        value, grad_unary, grad_pairwise = (pseudolikelihood if settings.loss == "pseudolikelihood" else piecewise)(
            edges, unary, pairwise, labels, node_weight
        )
        return value, grad_unary, grad_pairwise, _Diagnostics(), None
    rho = resolve_rho(settings.rho, settings.inference, unary.shape[0], edges)
    warm = warm_start_applies(settings)
    problem = _Problem(
        edges, unary, pairwise, settings.inference, settings.gradient_mode, settings.n_iter, settings.tol,
        settings.max_iter, rho, settings.sides, settings.multiplier, settings.checkpoints,
        start=start if warm else None,
    )
    end = None
    if settings.loss == "surrogate_likelihood":
        if node_weight is not None:
            check_node_weight_loss(settings.loss)
        value, grad_unary, grad_pairwise = _surrogate_likelihood(problem, labels)
    else:
        state, result = problem.forward()
        pairwise_term = settings.loss in PAIRWISE_LOSSES
        # grad_mu2 None (losses of the unary marginals): zeros that the
        # kernels' backward passes skip (_Problem.backward)
        value, grad_mu, grad_mu2 = _marginal_loss(settings.loss, result.unary, result.pairwise if pairwise_term else None,
                                                  edges, labels, alpha=settings.alpha, node_weight=node_weight)
        grad_unary, grad_pairwise = problem.backward(state, result, grad_mu, grad_mu2)
        if warm:
            end = KERNELS[settings.inference].end(state)
    return float(value), grad_unary, grad_pairwise, problem.diagnostics, end


def _marginals(edges, unary, pairwise, settings):
    """Unary marginals of validated inputs with ``settings.n_iter``
    iterations (None: to ``tol``), and their :class:`_Diagnostics`."""
    rho = resolve_rho(settings.rho, settings.inference, unary.shape[0], edges)
    problem = _Problem(edges, unary, pairwise, settings.inference, "truncated", None, settings.tol, settings.max_iter,
                       rho, settings.sides, settings.multiplier)
    _, result = problem.forward(keep_stack=False, n_iter=settings.n_iter)
    problem.diagnostics.not_converged = int(settings.n_iter is None and not result.converged)
    return result.unary, problem.diagnostics


def loss_and_grad(
    edges,
    unary,
    pairwise,
    labels,
    *,
    loss="univariate_logistic",
    inference="trw",
    gradient_mode="truncated",
    n_iter=20,
    tol=1e-6,
    max_iter=1000,
    rho=None,
    alpha=15.0,
    sides=2,
    multiplier=1.0,
    checkpoints=None,
    node_weight=None,
):
    """Loss of one labelled example and its gradient with respect to theta.

    Parameters
    ----------
    edges, unary, pairwise : arrays
        The model, as for :func:`sklearn_margcrf.infer`. Everything is
        computed in float32 when ``unary`` and ``pairwise`` are both float32
        arrays, in float64 otherwise, and the gradients have that dtype
        (implicit differentiation solves its linear system in float64 and
        returns the gradient in the model's dtype).
    labels : array-like of shape (n,)
        Integer labels in ``[0, K)``; -1 marks a hidden (unobserved) node.
    loss : str, default="univariate_logistic"
        ``"univariate_logistic"`` (-sum_i log mu(x_i)), ``"clique_logistic"``
        (-sum_c log mu(x_c)), ``"univariate_quadratic"``,
        ``"smooth_classification"`` (sigmoid of the margin, slope ``alpha``),
        ``"surrogate_likelihood"`` (surrogate EM with hidden labels),
        ``"pseudolikelihood"``, ``"piecewise"``. Marginal losses sum over
        observed nodes (cliques: both ends observed). Pseudolikelihood and
        piecewise need no inference and ignore ``inference`` and
        ``gradient_mode``; their terms touching a hidden node are dropped.
    inference : {"trw", "lbp", "mean_field", "exact"}, default="trw"
    gradient_mode : {"truncated", "backprop", "perturbation", "implicit"}, default="truncated"
        See the module docstring. Combinations that do not apply (implicit
        with mean field; truncated or backprop with exact inference) raise
        ValueError, and so does ``"implicit"`` when parameters so large that
        the marginals saturate (entries of 0) make its linear system singular.
    n_iter : int, default=20
        Iterations of truncated fitting (``gradient_mode="truncated"`` only;
        the other modes run inference to ``tol``).
    tol : float, default=1e-6
        Convergence threshold of inference for the non-truncated modes.
    max_iter : int, default=1000
        Iteration cap of inference for the non-truncated modes.
    rho : float, (E,) array, rule name or None
        TRW edge appearance probabilities, as for :func:`~sklearn_margcrf.infer`.
    alpha : float, default=15.0
        Slope of the smoothed classification loss (the paper uses 5, 15, 50).
    sides : {1, 2, 4}, default=2
        Finite differences of the perturbation mode.
    multiplier : float, default=1.0
        Step multiplier m of the perturbation mode, at least
        ``eps**(2/3)`` of the model's dtype (float64: about 3.7e-11, float32:
        about 2.5e-5; a smaller step rounds away).
    checkpoints : int >= 1 or None, default=None
        Memory of truncated fitting (and of the back-propagation fallback):
        the forward pass keeps only this many snapshots of the messages (in
        a buffer with one more, work slot) and the backward pass recomputes
        the others from them (checkpointed reverse mode, with the optimal
        binomial schedule; the gradient is the same bit for bit). The extra
        cost in recomputed iterations: ``n_iter (n_iter - 1) / 2`` with one
        snapshot, 267 for ``n_iter=200`` with 14, 179 with 21, 1,475 for
        ``n_iter=1000`` with 30. None keeps one snapshot per iteration while
        they fit ``sklearn_margcrf._checkpoints.STACK_MEMORY_BUDGET`` (1 GiB)
        and as many as fit otherwise.
    node_weight : array-like of shape (n,) or None, default=None
        Non-negative weight of each node's term of the loss: the loss is
        ``sum_i node_weight[i] * L_i`` (an edge term of ``clique_logistic``
        or of ``piecewise`` weighs the mean of its two nodes' weights; a
        ``pseudolikelihood`` term its node's). None weighs every term 1.
        For the losses that are sums over nodes (``univariate_logistic``,
        ``clique_logistic``, ``univariate_quadratic``,
        ``smooth_classification``, ``pseudolikelihood``, ``piecewise``);
        ``surrogate_likelihood`` raises ValueError.

    Returns
    -------
    value : float
        The loss to minimise, summed (with ``node_weight``: weighted) over
        nodes / edges.
    grad_unary : ndarray (n, K)
    grad_pairwise : ndarray (E, K, K)

    Notes
    -----
    Each thread keeps the large scratch arrays of its last call (the
    snapshots of the messages, the tables, the adjoints) for its next one,
    which then faults in no fresh pages: at 200x300, K = 2, 20 TRW
    iterations, some 9,000 page faults and 20-30 ms of system time less per
    call. They go once the thread has begun no call for 2 seconds, or at a
    full garbage collection (``gc.collect()``). The arrays returned are the
    caller's own.
    """
    check_combination(loss, inference, gradient_mode)
    edges, unary, pairwise = validate_model(edges, unary, pairwise)
    n_nodes, n_states = unary.shape
    labels = _check_labels(labels, n_nodes, n_states)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    if sides not in SIDES or isinstance(sides, bool):
        raise ValueError(f"sides must be one of {SIDES}, got {sides!r}")
    multiplier = check_positive(multiplier, "multiplier")
    check_multiplier(multiplier, unary.dtype)
    checkpoints = check_checkpoints(checkpoints)
    if node_weight is not None:
        check_node_weight_loss(loss)
        node_weight = np.asarray(node_weight, dtype=np.float64)
        if node_weight.shape != (n_nodes,):
            raise ValueError(f"node_weight must have shape (n,) = ({n_nodes},), got {node_weight.shape}")
        if not np.all(np.isfinite(node_weight)) or np.any(node_weight < 0):
            raise ValueError("node_weight must hold finite non-negative weights")
    n_iter, tol, max_iter = check_iteration_controls(n_iter, tol, max_iter)
    if gradient_mode == "truncated" and n_iter is None and loss not in INFERENCE_FREE_LOSSES:
        raise ValueError("gradient_mode='truncated' needs an integer n_iter (the number of iterations to differentiate)")

    if loss in INFERENCE_FREE_LOSSES:
        # No inference runs, but a bad rho is still an error. A rule name for
        # TRW is only checked by name: resolving it can cost a spanning-tree
        # computation.
        method = check_method(inference)
        if rho is not None and not (method == "trw" and isinstance(rho, str) and rho in RHO_RULES):
            resolve_rho(rho, method, n_nodes, edges)
    settings = _Settings(loss, inference, gradient_mode, n_iter, tol, max_iter, rho, float(alpha), int(sides), multiplier,
                         checkpoints)
    with call_workspace():  # no fresh pages for this thread's next call
        value, grad_unary, grad_pairwise, diagnostics, _ = _loss_and_grad(edges, unary, pairwise, labels, settings,
                                                                           node_weight)
        grad_unary, grad_pairwise = owned(grad_unary), owned(grad_pairwise)
    for category, message in diagnostics.warnings(settings, grad_unary.dtype):
        warn_at_caller(message, category)
    return value, grad_unary, grad_pairwise
