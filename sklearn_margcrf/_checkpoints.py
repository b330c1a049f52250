"""Checkpointed reverse mode for truncated fitting: which iterations to keep.

Back TRW and back mean field need the messages (marginals) at the start of
every iteration, one snapshot per iteration. With ``checkpoints = s < n``
the forward pass keeps only ``s`` of the ``n`` snapshots, at the starts of
``s`` segments of consecutive iterations; the backward pass treats the
segments last to first, recomputing each segment's missing snapshots from its
first one before reversing it.

All snapshots live in one buffer of ``B`` slots: snapshot ``k`` in slot ``k``.
When segment ``k`` is reversed, the snapshots after it are no longer needed,
so its recomputed snapshots go to slots ``k + 1, ..., k + len_k - 1`` and the
segment's stack is the contiguous view ``buffer[k : k + len_k]``. Segment
``k`` may then hold ``B - k`` iterations: later segments are shorter, and

    B(s) = max(s, ceil(n / s + (s - 1) / 2))

slots suffice (smallest near ``s = sqrt(2 n)``: about ``sqrt(2 n)`` slots
instead of ``n``). The recomputation costs ``n - s`` forward iterations, so
for a fixed memory the largest ``s`` that fits is the fastest.
"""

import numbers

import numpy as np

__all__ = ["STACK_MEMORY_BUDGET", "check_checkpoints", "incomplete_stack", "plan_size", "segment_plan"]

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


def buffer_slots(n_iter, n_snapshots):
    """``B(s)``: the buffer slots that ``s = n_snapshots`` segments of ``n_iter`` iterations need."""
    s = n_snapshots
    return max(s, -(-(2 * n_iter + s * (s - 1)) // (2 * s)))


def _auto_snapshots(n_iter, snapshot_bytes, budget):
    """The most snapshots (fewest recomputed iterations) whose buffer fits ``budget``;
    the least memory possible when none does."""
    max_slots = budget // max(snapshot_bytes, 1)
    if n_iter <= max_slots:
        return n_iter
    fitting = [s for s in range(1, n_iter + 1) if buffer_slots(n_iter, s) <= max_slots]
    if fitting:
        return max(fitting)
    return min(range(1, n_iter + 1), key=lambda s: (buffer_slots(n_iter, s), -s))


def plan_size(n_iter, checkpoints, snapshot_bytes, budget=STACK_MEMORY_BUDGET):
    """``(snapshots, buffer slots)`` of :func:`segment_plan`, without its segments."""
    if checkpoints is None:
        s = _auto_snapshots(n_iter, snapshot_bytes, budget)
    else:
        s = min(int(checkpoints), n_iter)
    return s, buffer_slots(n_iter, s)


def segment_plan(n_iter, checkpoints, snapshot_bytes, budget=STACK_MEMORY_BUDGET):
    """Plan the snapshots of a truncated forward pass of ``n_iter >= 1`` iterations.

    ``checkpoints``: the number of snapshots to keep (at most ``n_iter`` are
    used), or None to keep all ``n_iter`` while they fit ``budget`` bytes and
    as many as fit otherwise.

    Returns ``(n_slots, starts)``: the buffer's number of slots and the first
    iteration of each segment (``starts[0] = 0``, increasing; segment ``k``
    ends where segment ``k + 1`` starts, the last one at ``n_iter``).
    """
    s, n_slots = plan_size(n_iter, checkpoints, snapshot_bytes, budget)
    starts = np.empty(s, dtype=np.int64)
    begin = 0
    for k in range(s):
        starts[k] = begin
        # as long as slot room allows, leaving one iteration per later segment
        begin += min(n_slots - k, n_iter - begin - (s - k - 1))
    return n_slots, starts


def incomplete_stack(n_kept, n_iter, forward):
    """The error of asking a checkpointed state for its per-iteration stack."""
    return ValueError(
        f"the stack is incomplete: the forward pass kept {n_kept} snapshots (checkpoints) of its {n_iter} "
        f"iterations, those before the iterations in segment_starts; run {forward} with checkpoints=None "
        f"(or >= n_iter) for every snapshot"
    )
