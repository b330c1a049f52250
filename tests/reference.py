"""Slow, obviously-correct references for the tests: brute-force enumeration."""

import itertools

import numpy as np


def all_states(n_nodes, n_states):
    """(K**n, n) array of every joint labelling."""
    return np.array(list(itertools.product(range(n_states), repeat=n_nodes)), dtype=np.int64)


def joint_scores(edges, unary, pairwise):
    """theta . f(x) for every joint state x, and the states themselves."""
    n_nodes, n_states = unary.shape
    states = all_states(n_nodes, n_states)
    scores = unary[np.arange(n_nodes), states].sum(axis=1)
    for e, (i, j) in enumerate(np.asarray(edges)):
        scores = scores + pairwise[e, states[:, i], states[:, j]]
    return scores, states


def brute_force(edges, unary, pairwise):
    """Exact (unary marginals (n,K), pairwise marginals (E,K,K), log Z) by enumeration."""
    unary = np.asarray(unary, dtype=float)
    pairwise = np.asarray(pairwise, dtype=float)
    n_nodes, n_states = unary.shape
    scores, states = joint_scores(edges, unary, pairwise)
    top = scores.max()
    weights = np.exp(scores - top)
    log_z = top + np.log(weights.sum())
    p = weights / weights.sum()
    mu = np.zeros((n_nodes, n_states))
    for i in range(n_nodes):
        np.add.at(mu[i], states[:, i], p)
    mu2 = np.zeros((len(edges), n_states, n_states))
    for e, (i, j) in enumerate(np.asarray(edges)):
        np.add.at(mu2[e], (states[:, i], states[:, j]), p)
    return mu, mu2, log_z


def random_model(edges, n_nodes, n_states, rng, scale=1.0):
    unary = rng.uniform(-scale, scale, size=(n_nodes, n_states))
    pairwise = rng.uniform(-scale, scale, size=(len(edges), n_states, n_states))
    return unary, pairwise


def random_tree_edges(n_nodes, rng):
    """A random spanning tree on n_nodes (random parent for each node)."""
    return np.array([(int(rng.integers(0, v)), v) for v in range(1, n_nodes)], dtype=np.int64).reshape(-1, 2)


def chain_edges(n_nodes):
    return np.array([(v, v + 1) for v in range(n_nodes - 1)], dtype=np.int64).reshape(-1, 2)


def numeric_gradient(f, x, eps=1e-6):
    """Central finite differences of a scalar function f at array x."""
    x = np.array(x, dtype=float)
    grad = np.zeros_like(x)
    flat = x.reshape(-1)
    g = grad.reshape(-1)
    for k in range(flat.size):
        old = flat[k]
        flat[k] = old + eps
        up = f(x)
        flat[k] = old - eps
        down = f(x)
        flat[k] = old
        g[k] = (up - down) / (2 * eps)
    return grad
