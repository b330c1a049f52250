"""Reuse of the large scratch arrays of per-image computations, per thread.

A fit computes the loss and gradient of every image at every L-BFGS
iteration, and each computation allocates and frees the same large scratch
arrays: the snapshot stack, the potential tables, the message planes and the
adjoints. glibc serves such allocations with fresh pages (``mmap``, and heap
trimming gives pages back at each ``free``), so every computation faults its
whole working set in again, and the faults of threads of one process contend
on its memory map. Measured (2026-12-02): 8,500-9,200 page faults and 15-24
ms of system time per 200x300 gradient (K = 2, 20 TRW iterations), none with
this module; on 16 half-resolution horses (``benchmarks/bench_fit.py``,
median speed-up of two workers over one within pairs of fits), Dask's
threads 1.77x instead of 1.42x and threads 1.87x instead of 1.80x.

Dask's worker processes fault far more: their nannies set
``MALLOC_TRIM_THRESHOLD_=65536``, and setting it turns glibc's dynamic mmap
threshold off, so every allocation above 128 KiB gets fresh pages, even
those that glibc would otherwise serve again from its heap. So the per-image
path of a fit takes its large arrays from here too (the potentials, copies of
read-only edges and rho, the graph's incidence) and leaves the grid check
and the zero pairwise gradient of the unary losses unallocated. Measured
(2026-12-03, 232 x 315 image, 100 / 42 float32 features, K = 2, float32, one
image's loss and weight gradient): under that setting 7,453 page faults and
14-18 ms of system time per image before, 1,075 and 2-4 ms after (the rest
is the losses' numpy temporaries); without it 2,954 and 5-7 ms before, none after.

Inside ``with workspace():`` (the per-batch functions of a fit, and
:func:`call_workspace`: each call of the public ``loss_and_grad`` and
``infer``), the kernels' modules take these arrays from :func:`scratch`,
which reuses the buffers of the thread's previous workspace; outside a
workspace it is ``np.empty``. Every array of a computation in a workspace
may be scratch: the per-batch functions copy out what they keep (marginals,
the messages of warm starts) before the workspace ends, the public
functions pass what they return through :func:`owned`, and nothing else
leaves it but new arrays (the weight gradients). Each thread keeps at most
1.25 times the scratch of its largest computation (with the buffers'
headroom) until :func:`release`, which the parallel map calls at its own
end, or, after :func:`keep_until_idle`, which it calls at the end of each
task in a worker process (``sklearn_margcrf._parallel._call_images``) and a
public call at its end, until no workspace has begun for a while or a full
garbage collection finds none open: the images of a task share buffers, and
so do successive maps in the process that fits (one batch, or threads), in
the workers, and successive calls of a thread.
"""

import gc
import math
import numbers
import threading
import time
import weakref
from contextlib import contextmanager

import numpy as np

__all__ = ["call_workspace", "keep_until_idle", "owned", "release", "scratch", "scratch_copy", "scratch_full",
           "workspace"]

_local = threading.local()

# New buffers are this much larger than asked, so that the next image, if
# slightly larger, still fits them.
_HEADROOM = 1.125


# The pool keeps at most this many times the most scratch memory one
# computation has asked for (with the headroom of its buffers), its largest
# buffers first: with images of several sizes it converges to buffers that
# the largest one fits. Counted in bytes asked for, not in the sizes of the
# buffers handed out: a small array given a large free buffer makes a later
# large one take a new buffer, and counting buffers then let the bound grow
# with each such mismatch (measured, 2026-12-03: full-resolution horses, 8
# per batch, a process worker's pool went from 189 MB after its first map
# to 873 MB after its second, past loky's 300 MB memory-leak margin, so
# that loky replaced the worker at every second map).
_POOL_FACTOR = 1.25


class _Pool:
    def __init__(self):
        self.free = []  # byte buffers not in use
        self.used = []  # those handed out in the current workspace
        self.depth = 0
        self.asked = 0  # bytes asked for in the current workspace
        self.most = 0  # the most bytes one workspace has asked for
        # keep_until_idle's timer runs in a thread of its own: it drops the
        # buffers once its deadline has passed, unless a workspace has begun
        # since the last keep (then that workspace's owner keeps or releases them)
        self.lock = threading.Lock()
        self.generation = 0
        self.kept_generation = -1
        self.deadline = 0.0
        self.timer = None
        self.timer_due = 0.0

    def recycle(self):
        self.most = max(self.most, self.asked)
        self.asked = 0
        kept, total = [], 0
        for buffer in sorted(self.used + self.free, key=lambda b: -b.nbytes):
            if total + buffer.nbytes <= _POOL_FACTOR * (_HEADROOM * self.most + 64):
                kept.append(buffer)
                total += buffer.nbytes
        self.free, self.used = kept, []


def _pool():
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = _Pool()
    return pool


@contextmanager
def workspace():
    """Reuse scratch buffers across the computations of this thread; nested
    workspaces share the outermost one."""
    pool = _pool()
    with pool.lock:
        pool.depth += 1
        pool.generation += 1
    try:
        yield
    finally:
        with pool.lock:
            pool.depth -= 1
            if pool.depth == 0:
                pool.recycle()


def scratch(shape, dtype):
    """An uninitialised array, like ``np.empty``: inside a workspace, a view
    of a free buffer of the thread's pool (the smallest that is large enough)."""
    pool = getattr(_local, "pool", None)
    if pool is None or pool.depth == 0:
        return np.empty(shape, dtype)
    dtype = np.dtype(dtype)
    # math.prod of Python ints: np.ndim and np.prod took half of a call's
    # 7.6 us, held the GIL, and a fit's image asks for some 40 arrays
    shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    best = -1
    for k, buffer in enumerate(pool.free):
        if buffer.nbytes >= nbytes and (best < 0 or buffer.nbytes < pool.free[best].nbytes):
            best = k
    buffer = pool.free.pop(best) if best >= 0 else np.empty(int(nbytes * _HEADROOM) + 64, np.uint8)
    pool.used.append(buffer)
    pool.asked += nbytes
    return buffer[:nbytes].view(dtype).reshape(shape)


def release():
    """Drop this thread's pooled buffers now (not while one of its workspaces is open)."""
    pool = getattr(_local, "pool", None)
    if pool is not None:
        _drop(pool)


def _drop(pool, wait=True):
    """Drop ``pool``'s buffers unless a workspace is open in it; without
    ``wait``, only if its lock is free now."""
    if not pool.lock.acquire(blocking=wait):
        return
    try:
        if pool.depth == 0:
            pool.free, pool.most, pool.asked = [], 0, 0
    finally:
        pool.lock.release()


# keep_until_idle's wait: the tasks of a fit's successive maps follow each
# other within milliseconds (the L-BFGS step between them), and a cluster's
# worker outlives the fit
_IDLE_SECONDS = 2.0

# the pools that keep_until_idle keeps: a full garbage collection drops those
# with no workspace open (see _collected)
_kept_pools = weakref.WeakSet()
_kept_pools_lock = threading.Lock()


def keep_until_idle(idle=_IDLE_SECONDS):
    """Keep this thread's pooled buffers for its next workspace, and drop
    them if none begins within ``idle`` seconds, or at a full garbage
    collection (``gc.collect()``) while none is open: kept buffers are
    memory that nothing uses between tasks, and a worker's owner that
    collects garbage before judging its size, as loky does before replacing
    a worker process whose size has grown by 300 MB since its first task,
    sees it freed (loky's worker loop, joblib/externals/loky/process_executor.py)."""
    pool = getattr(_local, "pool", None)
    if pool is None:
        return
    with pool.lock:
        pool.kept_generation = pool.generation
        pool.deadline = time.monotonic() + idle
        # one timer per idle period, not one per keep: every call of the
        # public functions keeps, and starting a timer's thread costs some
        # 175 us (a tenth of a 5 x 5 gradient); a timer that fires before
        # the deadline sets itself again. A process forked from one with a
        # timer running inherits the timer's object but not its thread.
        if pool.timer is None or not pool.timer.is_alive() or pool.deadline < pool.timer_due:
            if pool.timer is not None:
                pool.timer.cancel()
            _arm(pool, idle)
    with _kept_pools_lock:
        _kept_pools.add(pool)
        if _collected not in gc.callbacks:
            gc.callbacks.append(_collected)


def _arm(pool, wait):
    """Start ``pool``'s timer (its lock held)."""
    pool.timer = threading.Timer(wait, _expire, (pool,))
    pool.timer.daemon = True  # a process may end before it fires
    pool.timer_due = time.monotonic() + wait
    pool.timer.start()


def _expire(pool):
    """keep_until_idle's timer: drop the buffers if the last keep's deadline
    has passed and no workspace has begun since that keep."""
    with pool.lock:
        if pool.timer is not threading.current_thread():
            return  # cancelled for a sooner one while it waited for the lock
        pool.timer = None
        if pool.depth or pool.generation != pool.kept_generation:
            return
        wait = pool.deadline - time.monotonic()
        if wait > 0:  # kept again since this timer was set
            _arm(pool, wait)
        else:
            pool.free, pool.most, pool.asked = [], 0, 0


def _collected(phase, info):
    """gc's callback: at the start of a full collection, drop the kept pools
    whose thread has no workspace open. Never waits for a pool's lock: the
    collection may run in a thread that holds one (then that pool stays)."""
    if phase != "start" or info.get("generation") != 2 or not _kept_pools_lock.acquire(blocking=False):
        return
    try:
        pools = list(_kept_pools)
    finally:
        _kept_pools_lock.release()
    for pool in pools:
        _drop(pool, wait=False)


@contextmanager
def call_workspace():
    """The workspace of a call of a public function (``loss_and_grad``,
    ``infer``): its scratch arrays reuse the buffers of the thread's earlier
    calls, which it keeps afterwards until no call has begun for
    ``_IDLE_SECONDS`` (:func:`keep_until_idle`). What the call returns must
    pass :func:`owned` inside it. Measured (2026-12-06, 200x300, K = 2, 20
    TRW iterations, float64): 9,200 page faults and 24 ms of system time per
    gradient without, 670 and none with, a median of 0.282 s against 0.260 s."""
    pool = _pool()
    try:
        with workspace():
            yield
    finally:
        if pool.depth == 0:
            keep_until_idle()


def owned(array):
    """``array``, or a copy of it where it lies in a buffer of the current
    workspace (which the next computation overwrites)."""
    pool = getattr(_local, "pool", None)
    if pool is None or pool.depth == 0 or not isinstance(array, np.ndarray):
        return array
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return array.copy() if any(root is buffer for buffer in pool.used) else array


def scratch_full(shape, value, dtype):
    """:func:`scratch` filled with ``value``."""
    out = scratch(shape, dtype)
    out.fill(value)
    return out


def scratch_copy(array, dtype=None):
    """A copy of ``array`` (converted to ``dtype``) in :func:`scratch` memory."""
    out = scratch(np.shape(array), array.dtype if dtype is None else dtype)
    out[...] = array
    return out
