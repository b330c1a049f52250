"""Hypothesis strategies for the property tests: small random pairwise models.

Graphs are small enough for exact inference (at most 9 nodes, treewidth at
most 4), of the kinds a user meets: grids, grids with holes, chains, trees,
disconnected graphs with isolated nodes, graphs without edges, small
complete graphs, and random graphs (each pair of 8 nodes an edge with
probability 0.35).
"""

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from reference import chain_edges, random_tree_edges

from sklearn_margcrf import grid_edges

GRAPH_KINDS = ("grid", "grid_with_holes", "chain", "tree", "disconnected", "no_edges", "complete", "random")
TREE_KINDS = ("chain", "tree")  # forests too: "no_edges"


def _without_nodes(n_nodes, edges, removed):
    """The graph with the nodes of ``removed`` deleted and the others renumbered."""
    keep = np.setdiff1d(np.arange(n_nodes), removed)
    new_index = np.full(n_nodes, -1, dtype=np.int64)
    new_index[keep] = np.arange(keep.size)
    kept = np.all(new_index[edges] >= 0, axis=1)
    return keep.size, np.ascontiguousarray(new_index[edges[kept]]).reshape(-1, 2)


def make_graph(kind, size, rng):
    """(n_nodes, edges) of a graph of ``kind``; ``size`` in 1..4 sets its scale."""
    if kind in ("grid", "grid_with_holes"):
        height, width = 1 + size // 2, 1 + (size + 1) // 2  # up to 3 x 3
        n_nodes, edges = height * width, grid_edges(height, width)
        if kind == "grid_with_holes" and n_nodes > 2:
            holes = rng.choice(n_nodes, size=int(rng.integers(1, n_nodes // 2 + 1)), replace=False)
            n_nodes, edges = _without_nodes(n_nodes, edges, holes)
        return n_nodes, edges
    if kind == "chain":
        return size + 2, chain_edges(size + 2)
    if kind == "tree":
        return size + 3, random_tree_edges(size + 3, rng)
    if kind == "disconnected":
        # two components (a cycle and a chain) and isolated nodes
        cycle = np.array([(v, (v + 1) % 3) for v in range(3)], dtype=np.int64)
        chain = chain_edges(size) + 3
        return 3 + size + 2, np.concatenate([cycle, chain]).reshape(-1, 2)
    if kind == "no_edges":
        return size, np.zeros((0, 2), dtype=np.int64)
    if kind == "random":
        pairs = [(i, j) for i in range(8) for j in range(i + 1, 8) if rng.random() < 0.35]
        return 8, np.array(pairs, dtype=np.int64).reshape(-1, 2)
    n_nodes = min(size + 1, 5)  # complete
    pairs = [(i, j) for i in range(n_nodes) for j in range(i + 1, n_nodes)]
    return n_nodes, np.array(pairs, dtype=np.int64).reshape(-1, 2)


@dataclass
class Model:
    kind: str
    edges: np.ndarray
    unary: np.ndarray
    pairwise: np.ndarray
    labels: np.ndarray  # -1 = hidden
    scale: float

    @property
    def n_nodes(self):
        return self.unary.shape[0]

    def __repr__(self):  # what hypothesis prints for a failing example
        return (
            f"Model(kind={self.kind!r}, n_nodes={self.n_nodes}, edges={self.edges.tolist()}, K={self.unary.shape[1]}, "
            f"scale={self.scale:g}, labels={self.labels.tolist()},\n  unary={self.unary.tolist()},\n  "
            f"pairwise={self.pairwise.tolist()})"
        )


@st.composite
def models(draw, kinds=GRAPH_KINDS, n_states=st.integers(2, 5), log10_scale=st.floats(-2.0, 3.0), max_size=4,
           pairwise_ratios=(1.0, 0.1, 10.0)):
    """A random model: a graph of one of ``kinds``, K states, unary parameters
    uniform in ``[-scale, scale]``, pairwise ones in that range times one of
    ``pairwise_ratios``, and labels, some of them hidden."""
    kind = draw(st.sampled_from(kinds))
    size = draw(st.integers(1, max_size))
    k = draw(n_states)
    scale = 10.0 ** draw(log10_scale)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_nodes, edges = make_graph(kind, size, rng)
    # the pairwise part at the same scale, or stronger or weaker than the unary one
    pairwise_scale = scale * draw(st.sampled_from(pairwise_ratios))
    unary = rng.uniform(-scale, scale, size=(n_nodes, k))
    pairwise = rng.uniform(-pairwise_scale, pairwise_scale, size=(edges.shape[0], k, k))
    labels = rng.integers(0, k, size=n_nodes)
    hidden = draw(st.sampled_from(("none", "some", "all")))
    if hidden == "some":
        labels[rng.random(n_nodes) < 0.4] = -1
    elif hidden == "all":
        labels[:] = -1
    return Model(kind, edges, unary, pairwise, labels, scale)
