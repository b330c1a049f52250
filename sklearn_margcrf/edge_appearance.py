"""Edge appearance probabilities ``rho`` for TRW (paper Sec. TRW, Entropy Bound).

TRW's log-partition estimate is an upper bound on log Z when ``rho`` lies in
the spanning-tree polytope (``rho_c = Pr(c in T)`` for some distribution over
spanning trees T), or is dominated entrywise by such a point: a smaller
``rho_c`` only lowers the subtracted mutual information, so the entropy bound
still holds. Rules:

``"uniform_spanning_tree"``
    Exact edge probabilities of the uniform spanning tree, in each connected
    component: ``rho_e = R_eff(e)``, the effective resistance between the ends
    of edge e with unit conductances (Kirchhoff). Costs a dense solve per
    component, O(n^3): for components up to a few thousand nodes.
``"forest_cover"``
    Split the edges greedily into k forests (first fit, union-find) and use
    ``rho_e = 1 / k``. Each forest extends to a spanning tree (of every
    component); the uniform mixture of those k trees contains every edge with
    probability at least 1/k, so ``1/k`` is dominated by a point of the
    spanning-tree polytope. Linear time; k = 2 on 4-connected grids
    (``rho = 0.5``; the paper does not state the values it used), k = 1 on forests
    (``rho = 1``: TRW is exact there).
``"auto"`` (the default)
    ``uniform_spanning_tree`` if every component has at most
    ``MAX_DENSE_NODES`` nodes, else ``forest_cover``. On a tree or forest both
    give exactly 1.
"""

import numbers
from collections import OrderedDict

import numpy as np
from numba import njit
from scipy import linalg
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from threadpoolctl import threadpool_limits

from ._graph import validate_edges

__all__ = ["edge_appearance_probabilities", "RHO_RULES", "MAX_DENSE_NODES"]

RHO_RULES = ("auto", "uniform_spanning_tree", "forest_cover")
MAX_DENSE_NODES = 600

_CACHE = OrderedDict()
_CACHE_SIZE = 64


# The key of the cache: two sums of the edge list's entries, each entry
# mixed with its position by splitmix64's finaliser (with two different
# offsets), so that every entry weighs independently (a loop the compiler
# vectorises). blake2b took 0.5 ms per call on a 100 x 150 grid's edges
# (480 kB), a tenth of the cost outside the kernels of a fit's per-image
# gradient with the default rho. Not cryptographic: two different edge lists
# of the same size collide with probability about 2**-128, unless made to.
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_OFFSET = np.uint64(0x243F6A8885A308D3)


@njit(cache=True, nogil=True, inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _fingerprint(values):
    """Two 64-bit hashes of an int64 array's entries and their positions."""
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    for i in range(values.shape[0]):
        v = np.uint64(values[i])
        p = np.uint64(i) * _GOLDEN
        h1 += _mix(v + p)
        h2 += _mix(_mix(v ^ _OFFSET) + p)
    return h1, h2


@njit(cache=True, nogil=True)
def _find(parent, v):
    root = v
    while parent[root] != root:
        root = parent[root]
    while parent[v] != root:  # path compression
        nxt = parent[v]
        parent[v] = root
        v = nxt
    return root


@njit(cache=True, nogil=True)
def _forest_cover_count(n_nodes, edges):
    """Number of forests used by a first-fit greedy split of the edges."""
    n_edges = edges.shape[0]
    max_forests = 1
    # parents[f, v]: union-find of forest f; grown on demand
    parents = np.empty((4, n_nodes), dtype=np.int64)
    for f in range(4):
        for v in range(n_nodes):
            parents[f, v] = v
    n_forests = 1
    for e in range(n_edges):
        a, b = edges[e, 0], edges[e, 1]
        placed = False
        for f in range(n_forests):
            ra = _find(parents[f], a)
            rb = _find(parents[f], b)
            if ra != rb:
                parents[f, ra] = rb
                placed = True
                break
        if not placed:
            if n_forests == parents.shape[0]:
                grown = np.empty((2 * n_forests, n_nodes), dtype=np.int64)
                for f in range(2 * n_forests):  # a loop: see trw._copy_into
                    for v in range(n_nodes):
                        grown[f, v] = parents[f, v] if f < n_forests else v
                parents = grown
            f = n_forests
            n_forests += 1
            ra = _find(parents[f], a)
            rb = _find(parents[f], b)
            parents[f, ra] = rb
        if n_forests > max_forests:
            max_forests = n_forests
    return max_forests


def _effective_resistances(n_nodes, edges):
    """Effective resistance of every edge (unit conductances), per component."""
    n_edges = edges.shape[0]
    adjacency = coo_matrix((np.ones(n_edges), (edges[:, 0], edges[:, 1])), shape=(n_nodes, n_nodes))
    n_comp, component = connected_components(adjacency, directed=False)
    resistance = np.empty(n_edges)
    edge_component = component[edges[:, 0]]
    for comp in range(n_comp):
        in_comp = np.flatnonzero(edge_component == comp)
        if in_comp.size == 0:
            continue
        nodes = np.flatnonzero(component == comp)
        local = np.full(n_nodes, -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.size)
        a, b = local[edges[in_comp, 0]], local[edges[in_comp, 1]]
        m = nodes.size
        laplacian = np.zeros((m, m))
        np.add.at(laplacian, (a, b), -1.0)
        np.add.at(laplacian, (b, a), -1.0)
        np.add.at(laplacian, (a, a), 1.0)
        np.add.at(laplacian, (b, b), 1.0)
        # Ground the last node: the reduced Laplacian is positive definite.
        inverse = np.zeros((m, m))
        if m > 1:
            # One BLAS thread: LAPACK's rounding depends on the thread count,
            # and rho is cached per graph, so a first call made under other
            # limits (e.g. inside a fit, which runs L-BFGS with one thread)
            # changed every later fit of that graph by an ulp.
            with threadpool_limits(limits=1, user_api="blas"):
                inverse[:-1, :-1] = linalg.inv(laplacian[:-1, :-1], check_finite=False)
        resistance[in_comp] = inverse[a, a] + inverse[b, b] - 2.0 * inverse[a, b]
    # Bridges (every tree edge) have resistance exactly 1; snap rounding noise.
    resistance[np.abs(resistance - 1.0) < 1e-10] = 1.0
    return np.clip(resistance, 1e-12, 1.0), n_comp, component


def _largest_component(n_nodes, edges):
    adjacency = coo_matrix((np.ones(edges.shape[0]), (edges[:, 0], edges[:, 1])), shape=(n_nodes, n_nodes))
    _, component = connected_components(adjacency, directed=False)
    return np.bincount(component).max()


def edge_appearance_probabilities(n_nodes, edges, rule="auto"):
    """Valid TRW edge appearance probabilities for the graph, by ``rule``.

    Parameters
    ----------
    n_nodes : int
    edges : (E, 2) array of int node indices in [0, n_nodes), no self-loops
    rule : {"auto", "uniform_spanning_tree", "forest_cover"}

    Returns
    -------
    rho : (E,) float64 array in (0, 1]
    """
    return kept_probabilities(n_nodes, edges, rule).copy()


def kept_probabilities(n_nodes, edges, rule="auto"):
    """:func:`edge_appearance_probabilities` as kept for the graph: the
    array itself, to be read, never written (a fit's per-image path copies
    it into its scratch memory: a fresh (E,) array per image and evaluation
    took fresh pages under Dask's ``MALLOC_TRIM_THRESHOLD_``)."""
    if rule not in RHO_RULES:
        raise ValueError(f"rho rule must be one of {RHO_RULES}, got {rule!r}")
    if isinstance(n_nodes, (bool, np.bool_)) or not isinstance(n_nodes, numbers.Integral) or n_nodes < 1:
        raise ValueError(f"n_nodes must be a positive integer, got {n_nodes!r}")
    n_nodes = int(n_nodes)
    # the kernels below index without bounds checks: validate first
    edges = validate_edges(edges, n_nodes)
    n_edges = edges.shape[0]
    if n_edges == 0:
        return np.ones(0)
    key = (rule, n_nodes, n_edges, *_fingerprint(edges.reshape(-1)))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if rule == "auto":
        rule = "uniform_spanning_tree" if _largest_component(n_nodes, edges) <= MAX_DENSE_NODES else "forest_cover"
    if rule == "uniform_spanning_tree":
        rho = _effective_resistances(n_nodes, edges)[0]
    else:
        rho = np.full(n_edges, 1.0 / _forest_cover_count(n_nodes, edges))
    rho.flags.writeable = False
    _CACHE[key] = rho
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return rho
