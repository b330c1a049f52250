"""Edge appearance probabilities ``rho`` for TRW (paper Sec. TRW, Entropy Bound).

TRW's log-partition estimate is an upper bound on log Z when ``rho`` lies in
the spanning-tree polytope (``rho_c = Pr(c in T)`` for some distribution over
spanning trees T), or is dominated entrywise by such a point: a smaller
``rho_c`` only lowers the subtracted mutual information, so the entropy bound
still holds. Rules:

``"uniform_spanning_tree"``
    Exact edge probabilities of the uniform spanning tree, in each connected
    component: ``rho_e = R_eff(e)``, the effective resistance between the ends
    of edge e with unit conductances (Kirchhoff). On a 4-connected H x W grid
    (any numbering of its edges, either direction) they come from the
    Laplacian's eigenvectors, products of two cosine transforms, in
    O(H W (H + W)): milliseconds for an image. Other graphs cost a dense
    inverse per component, O(n^3), and components of more than
    ``MAX_UST_DENSE_NODES`` nodes are refused (use ``forest_cover``).
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
import threading
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np
from numba import njit
from scipy import linalg
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from threadpoolctl import threadpool_limits

from ._graph import grid_shape_of, validate_edges

__all__ = ["edge_appearance_probabilities", "RHO_RULES", "MAX_DENSE_NODES", "MAX_UST_DENSE_NODES"]

RHO_RULES = ("auto", "uniform_spanning_tree", "forest_cover")
MAX_DENSE_NODES = 600
# A dense inverse of this many nodes takes about 800 MB and a minute; larger
# non-grid components would look like a hang.
MAX_UST_DENSE_NODES = 10_000

# Every graph's rho is computed once and kept (least recently used first
# out) while the cache holds at most _CACHE_BYTES: a fit asks for each
# image's rho at every evaluation, in turn, so a cache smaller than the
# training set misses every time (64 entries did, for 200 horses of 191
# sizes: 11 ms per miss with "auto", 70 ms with "uniform_spanning_tree" on
# a 300 x 400 grid). 256 MiB holds about 300 such grids. The lock makes the
# look-up and the eviction safe for the threads of a fit.
_CACHE = OrderedDict()
_CACHE_BYTES = 256 * 2**20
_CACHE_ENTRY_BYTES = 256  # the key and the bookkeeping of one entry, roughly
_CACHE_LOCK = threading.Lock()
_cache_nbytes = 0
_BLAS_LOCK = threading.Lock()


@contextmanager
def _one_blas_thread():
    """One BLAS thread, for rounding that does not depend on the thread count.
    threadpool_limits is process-wide: threads that entered and left it at
    once restored each other's limits in the middle of a computation (an
    ulp apart in 6 of 1,440 rho of small grids from 4 threads), so here one
    thread at a time."""
    with _BLAS_LOCK, threadpool_limits(limits=1, user_api="blas"):
        yield


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
            with _one_blas_thread():
                inverse[:-1, :-1] = linalg.inv(laplacian[:-1, :-1], check_finite=False)
        resistance[in_comp] = inverse[a, a] + inverse[b, b] - 2.0 * inverse[a, b]
    # Bridges (every tree edge) have resistance exactly 1; snap rounding noise.
    resistance[np.abs(resistance - 1.0) < 1e-10] = 1.0
    return np.clip(resistance, 1e-12, 1.0), n_comp, component


def _grid_resistances(height, width, edges):
    """Effective resistance of every edge of the 4-connected ``height`` x
    ``width`` grid (nodes row-major; ``edges`` canonical, i < j), exactly.

    The grid's Laplacian is ``L_H (x) I + I (x) L_W`` for the path Laplacians
    ``L_n``, whose eigenvectors are the cosines ``a_p(r) = c_p cos(p pi (r +
    1/2) / n)`` with eigenvalues ``2 - 2 cos(p pi / n)``. For the horizontal
    edge (r, c)-(r, c+1), ``R = sum_{p,q} a_p(r)^2 (b_q(c) - b_q(c+1))^2 /
    (l_p + m_q)``, a product of three matrices, and likewise for vertical
    edges; the (0, 0) term has a zero numerator and is left out.
    """

    def path_spectrum(n):
        index = np.arange(n)
        scale = np.where(index == 0, np.sqrt(1.0 / n), np.sqrt(2.0 / n))
        vectors = scale[None, :] * np.cos(np.pi * np.outer(index + 0.5, index) / n)  # [position, frequency]
        return vectors, 2.0 - 2.0 * np.cos(np.pi * index / n)

    rows, row_values = path_spectrum(height)
    cols, col_values = path_spectrum(width)
    total = row_values[:, None] + col_values[None, :]
    total[0, 0] = 1.0
    inverse = 1.0 / total
    inverse[0, 0] = 0.0
    with _one_blas_thread():  # bitwise the same under any BLAS thread count
        horizontal = (rows**2) @ inverse @ ((cols[:-1] - cols[1:]) ** 2).T  # (H, W-1)
        vertical = ((rows[:-1] - rows[1:]) ** 2) @ inverse @ (cols**2).T  # (H-1, W)
    i, j = edges[:, 0], edges[:, 1]
    r, c = i // width, i % width
    return np.where(j == i + 1, horizontal[r, np.minimum(c, width - 2)], vertical[np.minimum(r, height - 2), c])


def _largest_component(n_nodes, edges):
    adjacency = coo_matrix((np.ones(edges.shape[0]), (edges[:, 0], edges[:, 1])), shape=(n_nodes, n_nodes))
    _, component = connected_components(adjacency, directed=False)
    return np.bincount(component).max()


def _uniform_spanning_tree(n_nodes, edges):
    # small graphs keep the dense path, whose values (to the last bit) fits already made were given
    canonical = np.sort(edges, axis=1)
    shape = grid_shape_of(n_nodes, canonical) if n_nodes > MAX_DENSE_NODES else None
    if shape is not None:
        return np.clip(_grid_resistances(*shape, canonical), 1e-12, 1.0)
    largest = _largest_component(n_nodes, edges)
    if largest > MAX_UST_DENSE_NODES:
        raise ValueError(
            f"rho='uniform_spanning_tree' needs a dense inverse of a {largest}-node component of this graph "
            f"(more than {MAX_UST_DENSE_NODES}; only 4-connected grids have a fast exact path): "
            "use rho='forest_cover' or 'auto'"
        )
    return _effective_resistances(n_nodes, edges)[0]


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
    global _cache_nbytes
    key = (rule, n_nodes, n_edges, *_fingerprint(edges.reshape(-1)))
    with _CACHE_LOCK:
        rho = _CACHE.get(key)
        if rho is not None:
            _CACHE.move_to_end(key)
            return rho
    if rule == "auto":
        rule = "uniform_spanning_tree" if _largest_component(n_nodes, edges) <= MAX_DENSE_NODES else "forest_cover"
    if rule == "uniform_spanning_tree":
        rho = _uniform_spanning_tree(n_nodes, edges)
    else:
        rho = np.full(n_edges, 1.0 / _forest_cover_count(n_nodes, edges))
    rho.flags.writeable = False
    with _CACHE_LOCK:
        if key in _CACHE:  # another thread computed it meanwhile
            return _CACHE[key]
        _CACHE[key] = rho
        _cache_nbytes += rho.nbytes + _CACHE_ENTRY_BYTES
        while _cache_nbytes > _CACHE_BYTES and len(_CACHE) > 1:
            _, old = _CACHE.popitem(last=False)
            _cache_nbytes -= old.nbytes + _CACHE_ENTRY_BYTES
    return rho
