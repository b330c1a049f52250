"""Exact marginals and log-partition function of a pairwise model.

``exact_inference(edges, unary, pairwise) -> (unary_marginals, pairwise_marginals, log_partition)``

Method
------
1. Duplicate edges (several edges on the same node pair, in either
   orientation) are merged by summing their tables; each original edge gets
   the marginal of its pair, laid out like its own table.
2. The graph is split into connected components. Components that are trees
   (and isolated nodes) are solved by two-pass sum-product on a rooted BFS
   forest in a numba kernel (linear time; a 10^5-node chain takes
   milliseconds). Components with cycles are solved together by a junction
   tree built from a greedy **min-fill** elimination order (ties broken by
   degree, then node index; see Limits for 4-connected grids): eliminating
   ``v`` creates the clique ``{v} + N(v)``, whose parent is the clique of
   the first-eliminated node of ``N(v)`` (the elimination tree, which has
   the running-intersection property). Each unary factor goes to its node's
   clique, each edge to the clique of whichever endpoint is eliminated
   first. The tree is calibrated with an upward and a downward pass of
   sum-product in the log domain; a pairwise marginal is read off the
   clique its edge was assigned to.
3. ``log Z`` is the sum over components.

Limits
------
Trees and forests of any size are accepted (linear time and memory).
A loopy component is refused with a ``ValueError`` that says why when

- the greedy order needs a clique whose table has more than
  ``max_table_size`` (default ``2**22``) entries, i.e. ``K**(w+1) > 2**22``
  with ``w`` the width of the greedy order (for K = 2 that is w <= 21, for
  K = 3 w <= 12, for K = 8 w <= 6); greedy min-fill is not optimal, so a
  graph of slightly smaller treewidth can be refused too;
- the graph is a plain 4-connected H x W grid (detected exactly) with
  ``K**(min(H, W) + 1) > max_table_size``: a grid's treewidth is min(H, W),
  so this refusal is immediate and certain. If min-fill fails on a grid
  that fits, the line-by-line order of width min(H, W) is used instead;
- all clique tables together exceed ``MAX_TOTAL_ENTRIES`` (``2**25``)
  entries (memory / time guard: 256 MB of float64, 512 MB when complex).

Cost of the junction tree: ``O(sum of clique table sizes)`` numpy work plus
Python overhead per clique (a few thousand cliques per second); e.g. a
15 x 15 binary grid takes ~0.3 s, a 6 x 6 grid with K = 8 ~0.5 s. Refusing a
large loopy graph that is not a plain grid costs the greedy ordering up to
the failing clique (seconds for ~10^5 nodes).

Complex step
------------
The computation is complex-analytic in ``(unary, pairwise)``: complex input
is carried through with log-sum-exp shifted by the maximum of the *real*
part only, and no ``abs``, ``real`` on intermediates, comparisons of complex
values or clipping. Hence ``Im(mu(theta + i h v)) / h`` is the directional
derivative of the marginals to within rounding for tiny ``h``;
:func:`exact_hessian_vector` uses this (``h = 1e-30``) to give the exact
Hessian-vector product of ``log Z``. Float input gives float output.
"""

import heapq

import numpy as np
from numba import njit
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ._graph import grid_shape_of, incidence

__all__ = ["exact_inference", "exact_hessian_vector", "MAX_TABLE_SIZE", "MAX_TOTAL_ENTRIES"]

#: Largest junction-tree clique table (number of entries) that is accepted.
MAX_TABLE_SIZE = 2 ** 22
#: Largest total number of entries of all junction-tree clique tables.
MAX_TOTAL_ENTRIES = 2 ** 25


# ---------------------------------------------------------------------------
# Forests: two-pass sum-product in the log domain (numba, float or complex)
# ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _lse1(a):
    """log(sum(exp(a))) of a 1-D array, shifted by max(Re a) (complex-analytic)."""
    m = a[0].real
    for k in range(1, a.shape[0]):
        r = a[k].real
        if r > m:
            m = r
    s = a[0] - a[0]
    for k in range(a.shape[0]):
        s += np.exp(a[k] - m)
    return m + np.log(s)


@njit(cache=True, nogil=True)
def _bfs_forest(n, ptr, inc_edge, inc_side, edges):
    """BFS order of a forest, roots in increasing node order.

    Returns (order, parent_edge, child_side): ``parent_edge[v] = -1`` for a
    root, else the edge to its parent, of which v is end ``child_side[v]``.
    """
    order = np.empty(n, dtype=np.int64)
    parent_edge = np.full(n, -1, dtype=np.int64)
    child_side = np.zeros(n, dtype=np.int64)
    visited = np.zeros(n, dtype=np.bool_)
    tail = 0
    head = 0
    for root in range(n):
        if visited[root]:
            continue
        visited[root] = True
        order[tail] = root
        tail += 1
        while head < tail:
            v = order[head]
            head += 1
            for k in range(ptr[v], ptr[v + 1]):
                e = inc_edge[k]
                s = inc_side[k]
                w = edges[e, 1 - s]
                if not visited[w]:
                    visited[w] = True
                    parent_edge[w] = e
                    child_side[w] = 1 - s
                    order[tail] = w
                    tail += 1
    return order, parent_edge, child_side


@njit(cache=True, nogil=True)
def _forest_kernel(ptr, inc_edge, inc_side, edges, unary, tables, mu, pm):
    """Sum-product on a forest (no duplicate edges). Writes the unary
    marginals into ``mu`` (n, K) and the edge marginals into ``pm`` (E, K, K)
    (layout of ``tables``); returns log Z (sum over the trees)."""
    n, k_states = unary.shape
    order, parent_edge, child_side = _bfs_forest(n, ptr, inc_edge, inc_side, edges)
    below = unary.copy()            # theta_v + messages from the children
    up = np.empty_like(unary)       # up[v, x_p]: message from v to its parent
    full = np.empty_like(unary)     # theta_v + all incoming messages
    tmp = np.empty_like(unary[0])
    tmp2 = np.empty_like(tables[0].ravel()) if tables.shape[0] > 0 else np.empty_like(unary[0])
    log_z = unary[0, 0] - unary[0, 0]

    # Upward pass: children come after their parent in BFS order.
    for idx in range(n - 1, -1, -1):
        v = order[idx]
        e = parent_edge[v]
        if e < 0:
            log_z += _lse1(below[v])
            continue
        cs = child_side[v]
        p = edges[e, 1 - cs]
        for xp in range(k_states):
            for xv in range(k_states):
                t = tables[e, xv, xp] if cs == 0 else tables[e, xp, xv]
                tmp[xv] = t + below[v, xv]
            up[v, xp] = _lse1(tmp)
            below[p, xp] += up[v, xp]

    # Downward pass.
    for idx in range(n):
        v = order[idx]
        e = parent_edge[v]
        if e < 0:
            for x in range(k_states):
                full[v, x] = below[v, x]
            continue
        cs = child_side[v]
        p = edges[e, 1 - cs]
        for xv in range(k_states):
            for xp in range(k_states):
                t = tables[e, xv, xp] if cs == 0 else tables[e, xp, xv]
                tmp[xp] = t + full[p, xp] - up[v, xp]
            full[v, xv] = below[v, xv] + _lse1(tmp)
        # Edge marginal: theta_e + (parent belief without v) + (v's subtree).
        for a in range(k_states):
            for b in range(k_states):
                if cs == 0:   # edges[e] = (v, p): tables[e, x_v, x_p]
                    tmp2[a * k_states + b] = tables[e, a, b] + below[v, a] + full[p, b] - up[v, b]
                else:         # edges[e] = (p, v): tables[e, x_p, x_v]
                    tmp2[a * k_states + b] = tables[e, a, b] + full[p, a] - up[v, a] + below[v, b]
        norm = _lse1(tmp2)
        for a in range(k_states):
            for b in range(k_states):
                pm[e, a, b] = np.exp(tmp2[a * k_states + b] - norm)

    for v in range(n):
        norm = _lse1(full[v])
        for x in range(k_states):
            mu[v, x] = np.exp(full[v, x] - norm)
    return log_z


def _forest(n, edges, unary, tables):
    inc = incidence(n, edges)
    mu = np.empty_like(unary)
    pm = np.empty_like(tables)
    log_z = _forest_kernel(inc.ptr, inc.edge, inc.side, edges, unary, tables, mu, pm)
    return mu, pm, log_z


# ---------------------------------------------------------------------------
# Loopy components: junction tree from a greedy min-fill elimination order
# ---------------------------------------------------------------------------

def _lse(a, axes):
    """log-sum-exp over ``axes`` (tuple), shift from the real part only."""
    if len(axes) == 0:
        return a
    m = np.max(a.real, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(a - m), axis=axes, keepdims=True)) + m
    return np.squeeze(out, axis=axes)


def _align(table, table_vars, target_vars, n_states):
    """View/copy of ``table`` (axes = ``table_vars``) broadcastable against a
    tensor whose axes are ``target_vars`` (``table_vars`` a subset)."""
    where = {v: k for k, v in enumerate(target_vars)}
    perm = sorted(range(len(table_vars)), key=lambda k: where[table_vars[k]])
    if perm != list(range(len(table_vars))):
        table = table.transpose(perm)
    shape = [1] * len(target_vars)
    for v in table_vars:
        shape[where[v]] = n_states
    return table.reshape(shape)


def _too_wide(size, n_states, max_table_size):
    return ValueError(
        f"exact inference refused: the junction tree (greedy min-fill elimination order) "
        f"needs a clique of {size} variables, a table of K^{size} = {n_states}^{size} = "
        f"{n_states ** size} entries, more than the limit max_table_size = {max_table_size} "
        f"(about 2^{np.log2(max_table_size):.0f}); the graph's treewidth is too large for "
        f"exact inference -- use approximate inference (TRW, mean field) instead"
    )


def _elimination_order(adjacency, n_states, max_table_size):
    """Greedy min-fill elimination (ties: smaller degree, then smaller index).

    Returns (order, neighbours) where ``neighbours[k]`` is the set of
    not-yet-eliminated neighbours of ``order[k]`` when it was eliminated.
    Raises ValueError as soon as a clique would exceed ``max_table_size``.

    Fill-in scores are kept exact incrementally: eliminating v changes the
    neighbourhood only of the nodes in N(v) (recomputed), and lowers the
    fill-in of any other node w by the number of new fill edges joining two
    of w's neighbours.
    """
    adj = [set(a) for a in adjacency]
    n = len(adj)

    def fill(v):
        # number of non-adjacent pairs among the neighbours of v
        nb = adj[v]
        d = len(nb)
        if d < 2:
            return 0
        linked = sum(map(len, map(nb.intersection, [adj[a] for a in nb])))
        return (d * (d - 1) - linked) // 2

    fills = [fill(v) for v in range(n)]
    heap = [(fills[v], len(adj[v]), v) for v in range(n)]
    heapq.heapify(heap)
    done = np.zeros(n, dtype=bool)
    order, neighbours = [], []
    while heap:
        f, d, v = heapq.heappop(heap)
        if done[v] or f != fills[v] or d != len(adj[v]):
            continue  # stale entry
        nb = adj[v]
        if n_states ** (len(nb) + 1) > max_table_size:
            raise _too_wide(len(nb) + 1, n_states, max_table_size)
        done[v] = True
        order.append(v)
        neighbours.append(nb)
        adj[v] = set()
        new_edges = []
        for a in nb:
            adj[a].discard(v)
            for b in nb - adj[a]:
                if b > a:
                    new_edges.append((a, b))
        for a, b in new_edges:
            adj[a].add(b)
            adj[b].add(a)
        changed = set()
        for a, b in new_edges:
            for w in adj[a] & adj[b]:
                if w not in nb:
                    fills[w] -= 1
                    changed.add(w)
        changed.update(nb)
        for u in nb:
            fills[u] = fill(u)
        for u in changed:
            heapq.heappush(heap, (fills[u], len(adj[u]), u))
    return order, neighbours


def _eliminate_in_order(adjacency, order, n_states, max_table_size):
    """Neighbour sets met when eliminating the nodes in the given order."""
    adj = [set(a) for a in adjacency]
    neighbours = []
    for v in order:
        nb = adj[v]
        if n_states ** (len(nb) + 1) > max_table_size:
            raise _too_wide(len(nb) + 1, n_states, max_table_size)
        neighbours.append(nb)
        adj[v] = set()
        for a in nb:
            adj[a].discard(v)
            adj[a].update(nb)
            adj[a].discard(a)
    return list(order), neighbours


def _grid_order(height, width):
    """Elimination order of width min(H, W) = the grid's treewidth: along the
    longer side, one line of the shorter side at a time."""
    index = np.arange(height * width, dtype=np.int64).reshape(height, width)
    return (index.T if height <= width else index).ravel().tolist()


def _junction_tree(n, edges, unary, tables, max_table_size):
    """Exact (mu, pairwise marginals, log Z) of a graph without duplicate edges."""
    n_states = unary.shape[1]
    dtype = unary.dtype
    adjacency = [set() for _ in range(n)]
    for i, j in edges.tolist():
        adjacency[i].add(j)
        adjacency[j].add(i)
    shape = grid_shape_of(n, edges)
    if shape is not None:
        # A plain 4-connected H x W grid has treewidth exactly min(H, W) (and
        # eliminating line by line attains it): refuse at once if too wide.
        width = min(shape)
        if n_states ** (width + 1) > max_table_size:
            raise ValueError(
                f"exact inference refused: the graph is a {shape[0]} x {shape[1]} grid of "
                f"treewidth {width}, so every junction tree has a clique table of at least "
                f"K^{width + 1} = {n_states}^{width + 1} = {n_states ** (width + 1)} entries, "
                f"more than the limit max_table_size = {max_table_size}; use approximate "
                f"inference (TRW, mean field) instead")
    try:
        order, neighbours = _elimination_order(adjacency, n_states, max_table_size)
    except ValueError:
        if shape is None:
            raise
        # min-fill is usually cheaper in total but may exceed the treewidth
        # of a grid; the line-by-line order attains it.
        order, neighbours = _eliminate_in_order(adjacency, _grid_order(*shape), n_states,
                                                max_table_size)
    total = sum(n_states ** (len(nb) + 1) for nb in neighbours)
    if total > MAX_TOTAL_ENTRIES:
        raise ValueError(
            f"exact inference refused: the junction tree's clique tables hold {total} entries "
            f"in total, more than MAX_TOTAL_ENTRIES = {MAX_TOTAL_ENTRIES}; use approximate "
            f"inference instead")
    position = np.empty(n, dtype=np.int64)
    position[np.asarray(order, dtype=np.int64)] = np.arange(n)

    # Clique of v: (v, its later neighbours sorted by elimination position);
    # the parent is the first of those.
    scope = [None] * n
    parent = np.full(n, -1, dtype=np.int64)
    for v, nb in zip(order, neighbours):
        rest = tuple(sorted(nb, key=lambda u: position[u]))
        scope[v] = (v,) + rest
        if rest:
            parent[v] = rest[0]

    # Potentials: unary to its own clique, edges to the first-eliminated end.
    psi = [None] * n
    for v in range(n):
        shape = (n_states,) * len(scope[v])
        psi[v] = np.zeros(shape, dtype=dtype) + _align(unary[v], (v,), scope[v], n_states)
    owner = np.where(position[edges[:, 0]] < position[edges[:, 1]], edges[:, 0], edges[:, 1])
    for e in range(edges.shape[0]):
        o = owner[e]
        psi[o] = psi[o] + _align(tables[e], (edges[e, 0], edges[e, 1]), scope[o], n_states)

    # Upward pass (elimination order): message to the parent = sum out v.
    up = [None] * n
    log_z = np.zeros((), dtype=dtype)
    for v in order:
        msg = _lse(psi[v], (0,))
        p = parent[v]
        if p < 0:
            log_z = log_z + msg
        else:
            up[v] = msg
            psi[p] = psi[p] + _align(msg, scope[v][1:], scope[p], n_states)

    # Downward pass (reverse order); beliefs overwrite the potentials, normalised.
    for v in reversed(order):
        p = parent[v]
        if p >= 0:
            sep = scope[v][1:]
            sep_set = set(sep)
            cavity = psi[p] - _align(up[v], sep, scope[p], n_states)
            axes = tuple(k for k, u in enumerate(scope[p]) if u not in sep_set)
            kept = tuple(u for u in scope[p] if u in sep_set)
            down = _lse(cavity, axes)
            psi[v] = psi[v] + _align(down, kept, scope[v], n_states)
        up[v] = None
        psi[v] = psi[v] - _lse(psi[v], tuple(range(psi[v].ndim)))

    mu = np.empty((n, n_states), dtype=dtype)
    for v in range(n):
        mu[v] = np.exp(_lse(psi[v], tuple(range(1, psi[v].ndim))))
    pm = np.empty(tables.shape, dtype=dtype)
    for e in range(edges.shape[0]):
        i, j = edges[e]
        o = owner[e]
        cs = scope[o]
        axes = tuple(k for k, u in enumerate(cs) if u != i and u != j)
        table = _lse(psi[o], axes)
        if cs.index(i) > cs.index(j):
            table = table.T
        pm[e] = np.exp(table)
    return mu, pm, log_z[()]


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------

def _merge_duplicates(n, edges, pairwise):
    """Canonical (min, max) node pairs with summed tables.

    Returns (merged_edges (M, 2), merged_tables (M, K, K), index (E,), flip (E,))
    where original edge e is merged edge ``index[e]``, transposed if ``flip[e]``.
    """
    flip = edges[:, 0] > edges[:, 1]
    lo = np.where(flip, edges[:, 1], edges[:, 0])
    hi = np.where(flip, edges[:, 0], edges[:, 1])
    oriented = np.where(flip[:, None, None], pairwise.transpose(0, 2, 1), pairwise)
    keys, index = np.unique(lo * n + hi, return_inverse=True)
    index = index.reshape(-1)
    merged_edges = np.ascontiguousarray(np.stack([keys // n, keys % n], axis=1), dtype=np.int64)
    merged = np.zeros((keys.shape[0],) + pairwise.shape[1:], dtype=pairwise.dtype)
    if keys.shape[0] == edges.shape[0]:
        merged[index] = oriented
    else:
        np.add.at(merged, index, oriented)
    return merged_edges, merged, index, flip


def exact_inference(edges, unary, pairwise, max_table_size=MAX_TABLE_SIZE):
    """Exact unary and pairwise marginals and log-partition function.

    Parameters
    ----------
    edges : (E, 2) int array
    unary : (n, K) float or complex array
    pairwise : (E, K, K) float or complex array,
        ``pairwise[e, a, b] = theta(x_i = a, x_j = b)`` for ``edges[e] = (i, j)``.
    max_table_size : int
        Largest junction-tree clique table (entries) accepted for loopy graphs.

    Returns
    -------
    unary_marginals : (n, K)
    pairwise_marginals : (E, K, K), laid out like ``pairwise``
    log_partition : scalar
        All float32 when ``unary`` and ``pairwise`` are float32, complex128
        when an input is complex (complex step), float64 otherwise.

    Raises
    ------
    ValueError
        If a loopy component's junction tree is too large (see module doc).
    """
    unary = np.asarray(unary)
    pairwise = np.asarray(pairwise)
    is_complex = np.iscomplexobj(unary) or np.iscomplexobj(pairwise)
    single = unary.dtype == np.float32 and pairwise.dtype == np.float32
    dtype = np.complex128 if is_complex else np.float32 if single else np.float64
    unary = np.ascontiguousarray(unary, dtype=dtype)
    n, n_states = unary.shape
    edges = np.ascontiguousarray(edges, dtype=np.int64).reshape(-1, 2)
    n_edges = edges.shape[0]
    pairwise = np.ascontiguousarray(pairwise, dtype=dtype).reshape(n_edges, n_states, n_states)

    merged_edges, tables, index, flip = _merge_duplicates(n, edges, pairwise)
    n_merged = merged_edges.shape[0]

    mu = np.empty((n, n_states), dtype=dtype)
    pm = np.empty((n_merged, n_states, n_states), dtype=dtype)
    log_z = np.zeros((), dtype=dtype)[()]

    # Which nodes / edges belong to components that contain a cycle?
    if n_merged:
        graph = coo_matrix((np.ones(n_merged), (merged_edges[:, 0], merged_edges[:, 1])),
                           shape=(n, n))
        n_comp, labels = connected_components(graph, directed=False)
        comp_nodes = np.bincount(labels, minlength=n_comp)
        comp_edges = np.bincount(labels[merged_edges[:, 0]], minlength=n_comp)
        loopy_node = (comp_edges >= comp_nodes)[labels]
    else:
        loopy_node = np.zeros(n, dtype=bool)
    loopy_edge = loopy_node[merged_edges[:, 0]]

    for loopy in (False, True):
        node_mask = loopy_node == loopy
        if not node_mask.any():
            continue
        edge_mask = loopy_edge == loopy
        if node_mask.all():
            sub_nodes, sub_edges = None, merged_edges
            sub_unary, sub_tables = unary, tables
        else:
            sub_nodes = np.flatnonzero(node_mask)
            relabel = np.full(n, -1, dtype=np.int64)
            relabel[sub_nodes] = np.arange(sub_nodes.shape[0])
            sub_edges = np.ascontiguousarray(relabel[merged_edges[edge_mask]])
            sub_unary = np.ascontiguousarray(unary[sub_nodes])
            sub_tables = np.ascontiguousarray(tables[edge_mask])
        n_sub = sub_unary.shape[0]
        if loopy:
            sub_mu, sub_pm, sub_z = _junction_tree(n_sub, sub_edges, sub_unary, sub_tables,
                                                   max_table_size)
        else:
            sub_mu, sub_pm, sub_z = _forest(n_sub, sub_edges, sub_unary, sub_tables)
        if sub_nodes is None:
            mu[...] = sub_mu
            pm[...] = sub_pm
        else:
            mu[sub_nodes] = sub_mu
            pm[edge_mask] = sub_pm
        log_z = log_z + sub_z

    pairwise_marginals = pm[index]
    if flip.any():
        pairwise_marginals[flip] = pairwise_marginals[flip].transpose(0, 2, 1)
    return mu, np.ascontiguousarray(pairwise_marginals), log_z


def exact_hessian_vector(edges, unary, pairwise, v_unary, v_pairwise, h=1e-30,
                         max_table_size=MAX_TABLE_SIZE):
    """Directional derivative of the exact marginals, d/dt mu(theta + t v) at t = 0.

    This is the Hessian-vector product of ``log Z`` (the marginals are its
    gradient), computed by complex-step differentiation:
    ``Im(mu(theta + i h v)) / h`` with ``h = 1e-30``, exact to rounding.

    Returns
    -------
    d_unary : (n, K) float64
    d_pairwise : (E, K, K) float64
    """
    unary = np.asarray(unary, dtype=np.float64)
    pairwise = np.asarray(pairwise, dtype=np.float64)
    v_unary = np.asarray(v_unary, dtype=np.float64)
    v_pairwise = np.asarray(v_pairwise, dtype=np.float64).reshape(pairwise.shape)
    mu, pm, _ = exact_inference(edges, unary + 1j * h * v_unary, pairwise + 1j * h * v_pairwise,
                                max_table_size=max_table_size)
    return mu.imag / h, pm.imag / h
