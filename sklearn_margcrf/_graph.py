"""Pairwise graphs: validation of (edges, unary, pairwise) and the incidence
structure that every message-passing kernel walks.

Conventions used throughout the package
---------------------------------------
- ``edges`` is an (E, 2) int64 array; edge ``e`` joins ``i = edges[e, 0]`` and
  ``j = edges[e, 1]``.
- ``unary`` is (n, K): ``unary[i, a] = theta(x_i = a)``.
- ``pairwise`` is (E, K, K): ``pairwise[e, a, b] = theta(x_i = a, x_j = b)``.
- Messages are stored as an (E, 2, K) array: ``messages[e, s]`` is the message
  ``m_e(x_v)`` from edge (factor) ``e`` into its endpoint ``v = edges[e, s]``.
- The incidence of node ``v`` is ``incident_edge[ptr[v]:ptr[v+1]]`` with the
  matching ``incident_side`` (``edges[e, side] == v``), edges in increasing
  order.
"""

import numbers

import numpy as np
from numba import njit

from ._workspace import scratch

__all__ = ["Incidence", "grid_edges", "incidence", "validate_model"]


def check_shape(shape, name, minimum=1):
    """``shape`` as a pair of Python ints >= ``minimum`` (numpy integers
    pass, floats and bools do not), else ValueError naming ``name``."""
    try:
        values = tuple(shape)
    except TypeError:
        values = ()
    if len(values) != 2 or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= minimum for v in values
    ):
        raise ValueError(f"{name} must be a pair of integers >= {minimum} (height, width), got {shape!r}")
    return int(values[0]), int(values[1])


def grid_edges(height, width):
    """Edges of the 4-connected ``height`` x ``width`` grid, pixels numbered
    in row-major (C) order.

    Horizontal edges come first (row by row), then vertical ones, each joining
    a pixel to its right / lower neighbour: ``(i, i + 1)`` and ``(i, i + width)``.

    Returns
    -------
    edges : ndarray of shape (H*(W-1) + (H-1)*W, 2), int64
    """
    height, width = check_shape((height, width), "grid shape")
    index = np.arange(height * width, dtype=np.int64).reshape(height, width)
    horizontal = np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], axis=1)
    vertical = np.stack([index[:-1, :].ravel(), index[1:, :].ravel()], axis=1)
    return np.ascontiguousarray(np.concatenate([horizontal, vertical], axis=0))


def grid_shape_of(n, edges):
    """(H, W) if ``edges`` (canonical, no duplicates) are exactly the
    4-connected H x W grid on nodes numbered row-major, H, W >= 2; else None."""
    m = edges.shape[0]
    s = 2 * n - m          # H + W, since m = 2HW - H - W and n = HW
    disc = s * s - 4 * n
    if s <= 0 or disc < 0:
        return None
    root = int(round(np.sqrt(disc)))
    if root * root != disc or (s - root) % 2:
        return None
    small, large = (s - root) // 2, (s + root) // 2
    if small < 2 or small * large != n:
        return None
    keys = np.sort(edges[:, 0] * n + edges[:, 1])
    for height, width in ((small, large), (large, small)):
        index = np.arange(n, dtype=np.int64).reshape(height, width)
        grid = np.concatenate([(index[:, :-1] * n + index[:, 1:]).ravel(),
                               (index[:-1, :] * n + index[1:, :]).ravel()])
        if np.array_equal(np.sort(grid), keys):
            return height, width
    return None


class Incidence:
    """For every node, the edges that touch it (CSR layout).

    Attributes
    ----------
    ptr : (n + 1,) int64
    edge : (2E,) int64, the incident edge indices, node by node
    side : (2E,) int64, which end of that edge the node is (0 or 1)
    """

    __slots__ = ("ptr", "edge", "side")

    def __init__(self, ptr, edge, side):
        self.ptr, self.edge, self.side = ptr, edge, side


def incidence(n_nodes, edges):
    """Build the :class:`Incidence` of a graph with ``n_nodes`` nodes."""
    n_edges = edges.shape[0]
    ptr = scratch(n_nodes + 1, np.int64)
    edge = scratch(2 * n_edges, np.int64)
    side = scratch(2 * n_edges, np.int64)
    _count_sort_ends(n_nodes, np.asarray(edges, np.int64), ptr, edge, side)
    return Incidence(ptr, edge, side)


@njit(cache=True, nogil=True)
def _count_sort_ends(n_nodes, edges, ptr, edge, side):
    """The ends ``(e, s)`` ordered by node, and by ``2e + s`` within a node (a
    stable counting sort: no argsort of 2E positions, no temporaries)."""
    ptr[:] = 0
    for e in range(edges.shape[0]):
        ptr[edges[e, 0] + 1] += 1
        ptr[edges[e, 1] + 1] += 1
    for i in range(n_nodes):
        ptr[i + 1] += ptr[i]
    for e in range(edges.shape[0]):
        for s in range(2):
            node = edges[e, s]
            pos = ptr[node]  # the next free place of the node, moved on below
            edge[pos] = e
            side[pos] = s
            ptr[node] = pos + 1
    for i in range(n_nodes, 0, -1):  # each entry has moved to the next node's start
        ptr[i] = ptr[i - 1]
    ptr[0] = 0


def _as_float_array(value, name, ndim, keep_float32=False):
    """``value`` as a C-contiguous finite float64 array (float32 kept as is
    with ``keep_float32``: features stored in single precision halve the
    memory of large data sets, and a float32 model computes in float32)."""
    dtype = np.float32 if keep_float32 and getattr(value, "dtype", None) == np.float32 else np.float64
    if np.iscomplexobj(value):
        raise TypeError(f"{name} must be an array of real numbers, got complex values")
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from None
    if array.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return np.ascontiguousarray(array)


def _as_labels(labels, name, n_states=None):
    """``labels`` as an int64 array of the same shape, each -1 (hidden /
    unlabelled) or a state in [0, n_states).

    The check of integer labels (loss_and_grad, the metrics' codes, and
    :func:`split_labels` for integer labels): bool arrays and floats holding
    whole numbers are accepted as integers; NaN, infinities, fractions and
    other types are refused.
    """
    labels = np.asarray(labels)
    if labels.dtype == bool:
        labels = labels.astype(np.int64)
    elif not np.issubdtype(labels.dtype, np.integer):
        whole = (
            np.issubdtype(labels.dtype, np.floating)
            and np.all(np.isfinite(labels))
            and np.all(labels == np.round(labels))
        )
        if not whole:
            what = "values that are not whole numbers" if np.issubdtype(labels.dtype, np.floating) else "no integers"
            raise ValueError(f"{name} must hold integer labels (-1 = hidden), got dtype {labels.dtype} with {what}")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and labels.min() < -1:
        raise ValueError(f"{name} has label {labels.min()}: labels must be >= 0, or -1 for a hidden (unlabelled) node")
    if n_states is not None and labels.size and labels.max() >= n_states:
        raise ValueError(
            f"{name} has label {labels.max()} but n_states={n_states}: labels must lie in [0, {n_states - 1}] "
            "(-1 = hidden)"
        )
    return labels


def split_labels(labels, name):
    """The labelled values of a label array of any type, and where they are.

    The one check of user labels (``MarginalCRF``, ``ClassifierFeatures``,
    the metrics). Returns ``(values, labelled)``: ``labelled`` is a boolean
    array of the shape of ``labels``, ``values`` the 1-D array of the
    labelled entries, in order. The kinds of labels:

    - integers (and floats holding whole numbers, read as integers): -1 marks
      an unlabelled node, other negative labels are refused (see
      :func:`_as_labels`); fractions, NaN and infinities are refused;
    - booleans: every node labelled;
    - strings (numpy str arrays): every node labelled;
    - object arrays: ``None`` marks an unlabelled node; the others must be of
      one kind above (an object array of integers also takes -1).
    """
    labels = np.asarray(labels)
    if labels.dtype == object:
        labelled = np.array([v is not None for v in labels.ravel()], dtype=bool).reshape(labels.shape)
        present = labels[labelled].tolist()
        if not present:
            return np.zeros(0, dtype=np.int64), labelled
        kinds = {_label_kind(v) for v in present}
        if len(kinds) > 1 or None in kinds:
            types = sorted({type(v).__name__ for v in present})
            raise ValueError(
                f"{name} must hold labels of one kind (integers, booleans or strings; None = unlabelled), "
                f"got {', '.join(types)}"
            )
        inner = np.asarray(present)
        values, inner_labelled = split_labels(inner, name)
        labelled[labelled] = inner_labelled
        return values, labelled
    if labels.dtype == bool or labels.dtype.kind in "US":
        return labels.ravel(), np.ones(labels.shape, dtype=bool)
    if labels.dtype.kind not in "iuf":
        raise ValueError(
            f"{name} must hold integer, boolean or string labels (None or -1 = unlabelled), got dtype {labels.dtype}"
        )
    codes = _as_labels(labels, name)
    labelled = codes >= 0
    return codes[labelled], labelled


def _label_kind(value):
    """"bool", "number" or "str" for a label value of an object array, None for others."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, str):
        return "str"
    return None


def encode_labels(labels, classes, name):
    """Integer codes (indices into the sorted ``classes``, -1 = unlabelled)
    of a label array of any type (:func:`split_labels`), of its shape; a
    label outside ``classes`` raises ValueError."""
    return _encode(*split_labels(labels, name), classes, name)


def _encode(values, labelled, classes, name):
    """:func:`encode_labels` of the output of :func:`split_labels`."""
    codes = np.full(labelled.shape, -1, dtype=np.int64)
    if values.size:
        found = np.minimum(np.searchsorted(classes, values), len(classes) - 1)
        unknown = classes[found] != values
        if np.any(unknown):
            raise ValueError(
                f"{name} has label {values[unknown].tolist()[0]!r}, which is not among the classes "
                f"{classes.tolist()}: give every class to fit (classes=, or n_states= for integer labels 0..K-1), "
                "so that a subset of the data that lacks a class still knows it"
            )
        codes[labelled] = found
    return codes


def validate_edges(edges, n_nodes):
    """Check an (E, 2) edge array against ``n_nodes``; return it as int64."""
    if edges is None:
        raise ValueError(
            "edges are missing (None): give an (E, 2) array of node index pairs "
            "(an empty (0, 2) array for a graph without edges)"
        )
    edges = np.asarray(edges)
    if edges.size == 0 and (edges.ndim == 1 or edges.shape in ((0, 2), (0, 0))):
        return np.zeros((0, 2), dtype=np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"edges must have shape (E, 2), got {edges.shape}")
    if not (np.issubdtype(edges.dtype, np.integer)):
        if np.issubdtype(edges.dtype, np.floating) and np.all(edges == np.round(edges)):
            pass
        else:
            raise ValueError(f"edges must hold integer node indices, got dtype {edges.dtype}")
    # range check in the input's own dtype: a cast first would wrap uint64 and
    # huge floats around to negative numbers
    low, high = edges.min(), edges.max()
    if low < 0 or high >= n_nodes:
        raise ValueError(
            f"edges refer to node indices in [{low}, {high}] "
            f"but there are only {n_nodes} nodes (valid: 0 .. {n_nodes - 1})"
        )
    edges = np.ascontiguousarray(edges, dtype=np.int64)
    if np.any(edges[:, 0] == edges[:, 1]):
        bad = int(np.flatnonzero(edges[:, 0] == edges[:, 1])[0])
        raise ValueError(f"edges contain a self-loop: edge {bad} joins node {edges[bad, 0]} to itself")
    return edges


def model_dtype(unary, pairwise):
    """The compute dtype of a model: float32 when ``unary`` and ``pairwise``
    (or ``unary`` alone, when ``pairwise`` is None) are both float32 arrays,
    float64 otherwise."""
    arrays = (unary,) if pairwise is None else (unary, pairwise)
    single = all(getattr(a, "dtype", None) == np.float32 for a in arrays)
    return np.dtype(np.float32) if single else np.dtype(np.float64)


def validate_model(edges, unary, pairwise):
    """Validate a pairwise model and return contiguous int64 edges and
    ``unary``, ``pairwise`` of the model's compute dtype (:func:`model_dtype`).

    Raises
    ------
    ValueError
        On wrong shapes, out-of-range or self-loop edges, NaN or inf values,
        fewer than two labels or no nodes.
    """
    single = model_dtype(unary, pairwise) == np.float32
    unary = _as_float_array(unary, "unary", 2, keep_float32=single)
    n_nodes, n_states = unary.shape
    if n_nodes == 0:
        raise ValueError("the graph is empty: unary has no rows (no nodes)")
    if n_states < 2:
        raise ValueError(f"need at least K = 2 labels, unary has {n_states} column(s)")
    edges = validate_edges(edges, n_nodes)
    n_edges = edges.shape[0]
    if pairwise is None or (n_edges == 0 and np.size(pairwise) == 0):
        pairwise = np.zeros((n_edges, n_states, n_states), unary.dtype)
    pairwise = _as_float_array(pairwise, "pairwise", 3, keep_float32=single)
    if pairwise.shape != (n_edges, n_states, n_states):
        raise ValueError(
            f"pairwise must have shape (E, K, K) = ({n_edges}, {n_states}, {n_states}) "
            f"to match edges {edges.shape} and unary {unary.shape}, got {pairwise.shape}"
        )
    return edges, unary, pairwise


def check_n_iter(n_iter, name="n_iter", allow_none=True):
    """``None`` or a non-negative integer."""
    if n_iter is None and allow_none:
        return None
    if isinstance(n_iter, bool) or not isinstance(n_iter, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer{' or None' if allow_none else ''}, got {n_iter!r}")
    if n_iter < 0:
        raise ValueError(f"{name} must be non-negative, got {n_iter}")
    return int(n_iter)


def check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
