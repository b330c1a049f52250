"""Checkpointed reverse mode for truncated fitting: which iterations to keep.

Back TRW and back mean field reverse the iterations last to first, and
reversing iteration ``t`` needs the messages (marginals) it started from:
snapshot ``t``. With ``checkpoints = s < n`` the forward pass keeps only
``s`` snapshots, and the backward pass recomputes the others from them,
keeping some of the recomputed ones in the slots that the reversal frees.

The schedule is binomial checkpointing (known as "revolve"), computed
exactly by dynamic programming for our costs. All snapshots live in one
buffer: ``s`` slots, plus a *work* slot in which the iterations are
recomputed (so the recomputation needs no other copy of the messages).
Reversing ``l`` iterations whose first snapshot is in a slot, with ``f``
more free slots, recomputes at best

    F(0, l) = l (l - 1) / 2          (each from the first snapshot)
    F(f, l) = min_j  j + F(f - 1, l - j) + F(f, j)

sweeps (advance ``j`` iterations, keep that snapshot, reverse the last
``l - j`` iterations with one slot fewer, then the first ``j`` with the slot
freed again), and the whole pass, where the forward pass itself places the
first checkpoints for free, ``G(s - 1, n)`` with

    G(0, l) = F(0, l),  G(f, l) = min_j  F(f, j) + G(f - 1, l - j).

At ``n = 200`` and ``s = 14`` that is 267 recomputed sweeps in 15 slots,
where recomputing whole segments into a buffer of their own needed 21 slots
for 186 sweeps.
"""

import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

__all__ = ["STACK_MEMORY_BUDGET", "CheckpointPlan", "check_checkpoints", "checkpoint_plan", "incomplete_stack",
           "plan_size"]

#: Bytes that ``checkpoints=None`` lets the snapshots of one truncated
#: forward pass take before it keeps fewer of them (1 GiB).
STACK_MEMORY_BUDGET = 2**30


def check_checkpoints(checkpoints):
    """Validate the public ``checkpoints`` parameter: None or an int >= 1."""
    if checkpoints is None:
        return None
    if isinstance(checkpoints, (bool, np.bool_)) or not isinstance(checkpoints, numbers.Integral) or checkpoints < 1:
        raise ValueError(f"checkpoints must be None or an integer >= 1, got {checkpoints!r}")
    return int(checkpoints)


def plan_size(n_iter, checkpoints, snapshot_bytes, budget=STACK_MEMORY_BUDGET):
    """``(snapshots, buffer slots)`` of :func:`checkpoint_plan`, without its steps.

    None keeps every snapshot while they fit ``budget`` and otherwise as many
    as fit with the work slot (at least one)."""
    if n_iter <= 0:
        return 0, 0
    if checkpoints is None:
        fitting = budget // max(snapshot_bytes, 1)
        s = n_iter if n_iter <= fitting else max(fitting - 1, 1)
    else:
        s = min(int(checkpoints), n_iter)
    return s, s + (s < n_iter)


@lru_cache(maxsize=64)
def _choices(n, s):
    """The dynamic programme of the module docstring: ``(cost, F_choice,
    G_choice)``, where ``X_choice[f, l]`` is the best ``j`` (0: use one free
    slot fewer) for ``l`` iterations with ``f`` free slots. O(s n^2) steps
    (compiled; once per (n, s): under 0.1 s for n = 1000 and s = 30, about 1 s for s = 999)."""
    F_choice = np.zeros((s, n + 1), np.int64)
    G_choice = np.zeros((s, n + 1), np.int64)
    return _fill_choices(n, s, F_choice, G_choice), F_choice, G_choice


@njit(cache=True)
def _fill_choices(n, s, F_choice, G_choice):
    F = np.empty((s, n + 1), np.int64)
    G = np.empty((s, n + 1), np.int64)
    for l in range(n + 1):
        F[0, l] = G[0, l] = l * (l - 1) // 2 if l > 1 else 0
    for f in range(1, s):
        for l in range(n + 1):
            F[f, l], G[f, l] = F[f - 1, l], G[f - 1, l]
            if G[f, l] == 0 and F[f, l] <= l - 1:  # the least possible: each state computed once
                continue
            for j in range(1, l):
                advance = j + F[f - 1, l - j] + F[f, j]
                if advance < F[f, l]:
                    F[f, l], F_choice[f, l] = advance, j
                placed = F[f, j] + G[f - 1, l - j]
                if placed < G[f, l]:
                    G[f, l], G_choice[f, l] = placed, j
    return G[s - 1, n]


@dataclass(frozen=True)
class CheckpointPlan:
    """Where a truncated forward pass of ``n_iter`` iterations keeps its
    snapshots and how the backward pass recomputes the others.

    ``forward_slots[t]``: the slot that keeps the messages iteration ``t``
    starts from, or -1. ``steps``, in order, each one of

    - ``("advance", load, n_sweeps, store)``: copy slot ``load`` into the
      work slot (``load`` -1: the work slot already holds it), run
      ``n_sweeps`` iterations there, and copy the result into slot
      ``store`` (-1: leave it in the work slot only);
    - ``("reverse", slots)``: reverse one iteration per entry, last to
      first, the one that started from snapshot ``slots[k]``.

    A reverse from the work slot follows right after the advance that left
    the snapshot there (``store`` -1).

    ``work_slot`` is ``n_slots - 1`` when checkpointed, else None.
    """

    n_iter: int
    n_snapshots: int
    n_slots: int
    forward_slots: np.ndarray
    steps: tuple
    recomputed: int

    @property
    def checkpointed(self):
        return self.n_snapshots < self.n_iter

    @property
    def work_slot(self):
        return self.n_slots - 1 if self.checkpointed else None

    @property
    def kept_iterations(self):
        """The iterations whose starting messages the forward pass keeps (in
        the slots ``forward_slots[kept_iterations]``)."""
        return np.flatnonzero(self.forward_slots >= 0)


def checkpoint_plan(n_iter, checkpoints, snapshot_bytes, budget=STACK_MEMORY_BUDGET):
    """The :class:`CheckpointPlan` of ``n_iter >= 1`` iterations: ``checkpoints``
    snapshots (at most ``n_iter``), or None for every one while they fit
    ``budget`` bytes and as many as fit otherwise."""
    s, n_slots = plan_size(n_iter, checkpoints, snapshot_bytes, budget)
    return _plan(n_iter, s, n_slots)


@lru_cache(maxsize=64)
def _plan(n, s, n_slots):
    if s >= n:
        return CheckpointPlan(n, s, n_slots, np.arange(n), (("reverse", np.arange(n - 1, -1, -1)),), 0)
    cost, F_choice, G_choice = _choices(n, s)
    cost = int(cost)
    work = n_slots - 1
    forward = np.full(n, -1, np.int64)
    forward[0] = 0
    steps = []
    reversed_slots = []
    held = [None]  # the iteration whose messages the work slot holds

    def advance(slot, first, n_sweeps, store):
        if reversed_slots:
            steps.append(("reverse", np.array(reversed_slots, np.int64)))
            reversed_slots.clear()
        load = -1 if held[0] == first else slot
        steps.append(("advance", load, n_sweeps, store))
        held[0] = first + n_sweeps

    # tasks (top, first, length, slot, free slots): reverse iterations
    # first .. first + length - 1, the first one's snapshot in ``slot``; at
    # the top the forward pass still runs through them and keeps snapshots free
    todo = [(True, 0, n, 0, tuple(range(1, s)))]
    while todo:
        top, first, length, slot, free = todo.pop()
        choice = G_choice if top else F_choice
        f = len(free)
        while f > 0 and choice[f, length] == 0:
            f -= 1
        if length == 1:
            reversed_slots.append(slot)
        elif f == 0:  # each iteration recomputed from the first snapshot, in the work slot
            for t in range(first + length - 1, first, -1):
                advance(slot, first, t - first, -1)
                reversed_slots.append(work)
            reversed_slots.append(slot)
        else:
            j, new = int(choice[f, length]), free[f - 1]
            if top:
                forward[first + j] = new
            else:
                advance(slot, first, j, new)
            todo.append((False, first, j, slot, free[:f]))
            todo.append((top, first + j, length - j, new, free[:f - 1]))
    if reversed_slots:
        steps.append(("reverse", np.array(reversed_slots, np.int64)))
    recomputed = sum(step[2] for step in steps if step[0] == "advance")
    assert recomputed == cost, (recomputed, cost)
    return CheckpointPlan(n, s, n_slots, forward, tuple(steps), recomputed)


def incomplete_stack(n_kept, n_iter, forward):
    """The error of asking a checkpointed state for its per-iteration stack."""
    return ValueError(
        f"the stack is incomplete: the forward pass kept {n_kept} snapshots (checkpoints) of its {n_iter} "
        f"iterations, those before the iterations in kept_iterations; run {forward} with checkpoints=None "
        f"(or >= n_iter) for every snapshot"
    )
