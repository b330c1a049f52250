"""One parallel map over fixed batches of images, on joblib's own facilities.

A fit evaluates the same images at every L-BFGS iteration; only the weights
change. So the images are packed once into one :class:`Batch` per worker
(balanced by size, :func:`balanced_groups`) and handed over once:

* one batch (``n_jobs=1``): the map runs in this process, without joblib;
* otherwise each batch is written once, image by image, into files of a
  folder of joblib's temporary-folder manager (/dev/shm when it is large
  enough, else the temporary folder, or ``JOBLIB_TEMP_FOLDER``), one file per
  array, and memory-mapped read-only (``np.memmap``). joblib pickles
  memory-mapped arrays by reference (file name and offset), so at each
  iteration process workers map the same pages and nothing is hashed or
  copied; threads read them directly. Written image by image (:func:`_written`)
  rather than packed in memory and dumped (``joblib.dump``), which held a
  second copy of the images in memory (9 GB for the 200 full-resolution
  horses in float32); arrays that are memory maps of a file already go by
  reference as they are, uncopied. The
  files are registered with joblib's resource tracker, which removes them
  even when this process is killed, and the folder is removed when the map
  is closed. As every worker maps every batch, a task may take any images:
  the tasks of a function's later maps are balanced by the seconds each
  image took (:meth:`ImageBatches.map`);
* on a cluster (a backend with a ``client``, joblib's Dask backend), whose
  workers need not share a file system, each batch is submitted once as a
  task that packs it, and the tasks of every map, submitted to the client
  directly, refer to it by future, each restricted (loosely) to the workers
  that hold its batch (see :meth:`ImageBatches.map`). Not scattered: Dask cannot recover
  scattered data lost with a worker, but recomputes a lost task result
  elsewhere and reruns a task whose worker died, so a lost worker only
  delays the map. The scheduler keeps each packing task, with its images,
  until the map is closed. Not through joblib's ``Parallel``: it runs a call
  in this process, with the futures in place of the batches, whenever the
  cluster is down to one thread (a worker lost and not yet replaced). The
  tasks of a worker that holds several batches (one per thread) share out
  all of its images by their seconds at each map, as with a shared folder;
  images move between workers when the seconds they took say that the
  workers' shares are uneven (:func:`rebalanced_groups`), by tasks where the
  batches are: only the images that move travel.

Results come back per image, in image order, so that sums over them do not
depend on ``n_jobs`` or on the backend.

Where each image's inference ended can be kept from one map to the next
(:class:`WarmStarts`, for warm starts): every image starts from its own
previous end, whoever computes it, so results stay independent of
``n_jobs`` and of the backend. Beside the batch files, two files per batch
(the ends of the previous map, read; those of this map, written) that the
workers map writable; they swap after a map that completed, so a map
recomputed after a lost worker reads what the lost one read. Without a
shared folder (one batch in this process, or a cluster) the ends travel
with the tasks and their results instead, and this process keeps them.

When a process worker dies during a map (killed, most often by the operating
system for lack of memory), :meth:`ImageBatches.map` starts fresh workers,
which map the same batch files, and raises :class:`LostWorker`: whether to
recompute is the caller's decision (the estimator does once per fit).
"""

import errno
import mmap
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from joblib import effective_n_jobs
from joblib._memmapping_reducer import TemporaryResourcesManager
from joblib.externals.loky.backend import resource_tracker
from joblib.externals.loky.process_executor import TerminatedWorkerError
from joblib.parallel import get_active_backend
from sklearn.utils.parallel import Parallel, delayed

from ._workspace import keep_until_idle, release

__all__ = ["Batch", "ImageBatches", "ImageStarts", "LostWorker", "WarmStarts", "balanced_groups", "cluster_client", "pack",
           "plan_groups", "rebalanced_groups"]

#: the maps whose per-image seconds (their median) balance the next map's tasks
_COST_MAPS = 5

#: on a cluster, where moving images copies them: a move is decided on at
#: least this many maps of the same batches, past the first of them (which
#: finds the moved images cold), and only for at least this gain. Measured
#: (16 horses at half resolution, 2 one-thread Dask workers, fits of 7 loss
#: maps, three fits each): moving after every map that promised 2% moved
#: images at 6, 4 and 1 of the 7 maps (an image's seconds vary by 10-30%
#: from map to map), with a gain of 5% at 1-2; the fit's speed did not change
#: beyond the noise, the traffic between workers did. And (2026-12-04, the
#: same images and cluster) a move costs its map about 0.2 s (0.71-0.79 s
#: against 0.51-0.55), while the moves that a 5% gain let through (loads
#: 0.529 and 0.468 s predicted to become 0.497 and 0.500) came from the
#: noise of the loads and gained nothing measurable: fits of 20 L-BFGS
#: iterations took 14.4-15.3 s with them, 13.7-14.5 s without (2 pairs
#: of 2 fits). A gain of 10% needs loads about 20% apart. The maps are
#: three, so that their median does not see one slow map (2026-12-05, the
#: same images and cluster: the tasks of a fit's third map started 0.25 s
#: late on both workers, each having been sent where the other's batch
#: was, see map, and one ran 785 ms against 445; the median of two maps
#: took that for the images' cost, moved 2 images, which made the batches
#: 544 against 398 ms, and moved one back three maps later). With swaps
#: as well as moves (2026-12-05, the same images and cluster, fits of 20
#: L-BFGS iterations, 6 alternating rounds), a gain of 4% against 10%: 0.649,
#: 0.678, 0.655, 0.683, 0.691, 0.651 s per iteration against 0.687, 0.670,
#: 0.675, 0.658, 0.659, 0.653, and 2% 0.674, 0.696, 0.658 (in the first 3
#: rounds): all within the noise. With moves only, 2% moved an image back and
#: forth every 4-5 maps, each move's map about 0.05 s longer.
_MOVE_AFTER_MAPS = 3
_MOVE_MIN_GAIN = 0.10

#: errors of a file system without room: full, a file size limit, a quota
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


class LostWorker(Exception):
    """A worker process died during :meth:`ImageBatches.map`; fresh workers
    are in place (the map can be called again). Its cause is joblib's error."""


def balanced_groups(costs, n_groups, images=None):
    """Split image indices (``images``, default all) into at most
    ``n_groups`` groups of similar total cost (``costs[k]``: image ``k``'s):
    longest processing time first, then moves and swaps of single images
    between the costliest group and the cheaper ones while they lower the
    costlier of the two; each group is returned in image order.

    One batch per worker rather than one joblib task per image: on a cluster
    each worker then holds only its own images (the horses training set at
    full resolution is 18 GB in float64, too much to copy to every worker),
    and there is one task per worker and iteration. On one machine the two
    cost the same: 16 images of 60x80, TRW 20 iterations, 2 loky workers,
    0.86 s per evaluation either way within the noise of a shared machine
    (0.70-0.93 s with one task per image).

    The refinement is what makes the shares even with few images per worker:
    on 16 half-resolution horses (2 threads, medians of a fit's per-image
    seconds) longest processing time first left the costlier group 2.9%
    above the mean, the best split 0.0%, and the maps' busiest task waits
    for that difference.
    """
    images = np.arange(len(costs)) if images is None else np.asarray(images, dtype=np.int64)
    costs = np.asarray(costs, dtype=float)[images]
    n_groups = max(1, min(int(n_groups), len(costs)))
    loads = np.zeros(n_groups)
    members = [[] for _ in range(n_groups)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = int(np.argmin(loads))  # the first of equal loads
        loads[target] += costs[index]
        members[target].append(index)
    _even_out(costs, members, loads)
    return [sorted(int(images[i]) for i in g) for g in members if g]


def _even_out(costs, members, loads):
    """Move and swap single images (:func:`_best_exchange`) between the
    groups ``members`` (image indices into ``costs``; ``loads``: their
    totals, an array) while that lowers the costliest load; in place."""
    # each step lowers the costliest load or the number of groups that share
    # it, and the sum of squared loads with it; the bound keeps a map's
    # planning short for thousands of images
    for _ in range(4 * sum(map(len, members))):
        high = int(np.argmax(loads))
        step = _best_exchange(costs, members, loads, high)
        if step is None:
            break
        other, leaving, coming = step
        members[high].remove(leaving)
        members[other].append(leaving)
        shift = costs[leaving]
        if coming is not None:
            members[other].remove(coming)
            members[high].append(coming)
            shift -= costs[coming]
        loads[high] -= shift
        loads[other] += shift


def _best_exchange(costs, members, loads, high):
    """The move of one image from group ``high`` to another, or the swap of
    one of its images for a cheaper one of another group, that brings the
    costlier of the two groups lowest, if below ``loads[high]``: (the other
    group, the image leaving ``high``, the one coming back or None). A move
    before a swap that does as well: one image travels instead of two."""
    mine = np.asarray(members[high])
    best, best_peak = None, loads[high] * (1 - 1e-12)
    for other in np.argsort(loads, kind="stable"):
        other = int(other)
        if other == high or loads[other] >= best_peak:
            continue
        theirs = np.asarray([-1] + members[other])  # -1: nothing comes back (a move)
        shift = costs[mine][:, None] - np.where(theirs < 0, 0.0, costs[theirs])[None, :]
        peak = np.maximum(loads[high] - shift, loads[other] + shift)
        peak[shift <= 0] = np.inf
        i, j = np.unravel_index(int(np.argmin(peak)), peak.shape)
        if peak[i, j] < best_peak:
            best_peak = peak[i, j]
            best = (other, int(mine[i]), None if theirs[j] < 0 else int(theirs[j]))
    return best


def rebalanced_groups(groups, costs, min_gain=0.02):
    """Groups of similar total cost reached from ``groups`` by moving or
    swapping few images (:func:`_even_out`), or None when that lowers the
    costliest total by less than ``min_gain`` (relative): for a cluster,
    where moving an image copies it. Each group keeps its images' order,
    the images that come in last."""
    costs = np.asarray(costs, dtype=float)
    members = [list(group) for group in groups]
    loads = np.array([costs[list(group)].sum() for group in groups])
    before = loads.max()
    _even_out(costs, members, loads)
    if loads.max() > (1 - min_gain) * before:
        return None
    regrouped = []
    for group, now in zip(groups, members):
        stayed, were_there = set(now), set(group)
        regrouped.append([k for k in group if k in stayed] + [k for k in now if k not in were_there])
    return regrouped


def plan_groups(samples, n_jobs):
    """The image indices of each batch: one balanced group per worker."""
    n_groups = max(1, min(int(effective_n_jobs(n_jobs)), len(samples)))
    return balanced_groups([s.node_features.shape[0] + s.edges.shape[0] for s in samples], n_groups)


def cluster_client():
    """The client of the active joblib backend when it is a cluster's (Dask), else None."""
    backend, _ = get_active_backend()
    return getattr(backend, "client", None)


@dataclass(frozen=True)
class Batch:
    """Images side by side: image ``b`` is ``node_features[b]``, ``edges[b]``
    (int64, (E, 2)), ``edge_features[b]`` and ``labels[b]`` (int64; ``labels``
    is None at prediction), each a tuple with one array per image."""

    node_features: tuple
    edges: tuple
    edge_features: tuple
    labels: tuple = None

    @property
    def n_images(self):
        return len(self.node_features)

    def __sizeof__(self):
        """The bytes of the images' arrays: what a cluster's scheduler and
        memory manager go by (``dask.sizeof`` falls back on
        ``sys.getsizeof``, which saw 56 bytes in a batch of 800 kB), so that
        they count a batch as the data it is when they place tasks and spill."""
        return object.__sizeof__(self) + sum(
            part.nbytes for field in (self.node_features, self.edges, self.edge_features, self.labels or ())
            for part in field
        )

    def image(self, b):
        """Image ``b`` alone, as a :class:`Batch`."""
        return Batch((self.node_features[b],), (self.edges[b],), (self.edge_features[b],),
                     None if self.labels is None else (self.labels[b],))

    def images(self):
        """Yield (node_features, edges, edge_features, labels) of each image."""
        for b in range(self.n_images):
            yield (self.node_features[b], self.edges[b], self.edge_features[b],
                   None if self.labels is None else self.labels[b])


def pointers(counts):
    """Offsets of consecutive parts of the given sizes: part ``b`` is ``ptr[b]:ptr[b + 1]``."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(counts)
    return ptr


def pack(samples, labels, indices, store=None):
    """The :class:`Batch` of the images ``indices`` of ``samples`` (objects with
    ``node_features``, ``edges``, ``edge_features``) and ``labels`` (or None).
    Each of its fields is ``store(name, parts)`` of the images' arrays
    (default: the arrays themselves, C-contiguous)."""
    chosen = [samples[i] for i in indices]
    fields = {
        "node_features": [s.node_features for s in chosen],
        "edges": [np.asarray(s.edges, dtype=np.int64).reshape(-1, 2) for s in chosen],
        "edge_features": [s.edge_features for s in chosen],
        "labels": None if labels is None else [np.asarray(labels[i], dtype=np.int64) for i in indices],
    }
    return Batch(**{
        name: None if parts is None else (store or _as_they_are)(name, [np.ascontiguousarray(p) for p in parts])
        for name, parts in fields.items()
    })


def _as_they_are(name, parts):
    return tuple(parts)


def _file_backed(array):
    """Whether ``array`` is (a view of) a file's memory map, such as
    ``np.load(path, mmap_mode="r")``: joblib pickles those by reference (file
    name and offset), as the batch files, so they need no copy."""
    while array is not None:
        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename:
            return True
        array = getattr(array, "base", None)
    return False


#: Alignment of each image's array in a batch file (a cache line, as numpy's allocations)
_ALIGN = 64


def _written(path, parts, what):
    """The ``parts`` as read-only memory maps: those of a file already (the
    caller's, :func:`_file_backed`) as they are, the others written one after
    the other into the new file ``path`` with ``write`` calls and mapped
    from it. Not copied, memory-mapped inputs are held once, in the page
    cache (the 200 full-resolution horses of the examples: 9 GB that
    /dev/shm would hold a second time), and cost no time to pack. Written
    through a writable map instead, every page of the file took a page
    fault: measured (1.3 GB of horses' features, in the page cache),
    0.9-1.2 GB/s against 1.8-2.1 GB/s. A full file system is an OSError of
    ``write`` (no SIGBUS, as writing to a map would be), so no room needs
    taking first."""
    offsets, end = [], 0
    for part in parts:
        if _file_backed(part) or part.nbytes == 0:
            offsets.append(None)
            continue
        end += -end % _ALIGN
        offsets.append(end)
        end += part.nbytes
    if end == 0:
        return tuple(parts)
    with _room_for(path, what):
        with open(path, "wb", buffering=0) as file:
            for part, offset in zip(parts, offsets):
                if offset is None:
                    continue
                file.seek(offset)
                data = memoryview(part).cast("B")
                while data:  # a write may be short
                    data = data[file.write(data):]
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=(end,))
    return tuple(
        part if offset is None else mapped[offset:offset + part.nbytes].view(part.dtype).reshape(part.shape)
        for part, offset in zip(parts, offsets)
    )


@contextmanager
def _room_for(path, what):
    """Writing the file ``path`` (in the folder of the batches): on a full file
    system, remove it and raise an OSError that says what to do; register it
    with joblib's resource tracker, which removes it if this process dies
    (and must know it for the folder manager's cleanup)."""
    try:
        yield
    except OSError as exc:
        if os.path.exists(path):
            os.unlink(path)
        if exc.errno not in _NO_ROOM:
            raise
        raise OSError(
            exc.errno,
            f"no room for {what} in {os.path.dirname(path)} ({exc.strerror}); free some space or set the "
            "environment variable JOBLIB_TEMP_FOLDER to a folder with more room",
        ) from exc
    resource_tracker.register(path, "file")


def _call_images(func, task, args, home=None):
    """``func`` on each image of ``task``, a list of (batch, its
    :class:`ImageStarts` or None, positions in the batch), one image at a
    time (worker side): per part, (the images' results, their seconds, the
    ends of the part's starts when they travel back, else None).

    The scratch buffers that the task's images shared stay with the thread
    that ran them: in the process ``home`` (the map's own, without a cluster:
    one batch, or threads) until the map's end; in a worker process (of
    joblib's or of a cluster: any other process) for the task of the next
    map, until the worker has been idle for a while or collects garbage in
    full between tasks (``_workspace.keep_until_idle``). Kept, they spare
    every map faulting its working set in again: measured (16 horses at half
    resolution, fits of 8 L-BFGS iterations, 5 alternating pairs of
    processes, kept / dropped), n_jobs=1 9.16-9.63 / 9.67-10.06 s (per loss
    map no page faults / 11,405), 2 threads 5.45-5.77 / 5.48-5.97 s (system
    time of the process 0.95 / 1.28 s), peak memory 1103 / 1076 MiB; a Dask
    ``LocalCluster`` of 2 one-thread processes (whose nannies set
    ``MALLOC_TRIM_THRESHOLD_``, so that every large allocation takes fresh
    pages), 2026-12-04, 4 alternating pairs of processes, medians of 3
    fits: 6.19-6.34 / 6.72-7.24 s; one Dask process with 2 threads, 3 pairs:
    5.33-5.66 / 6.25-6.38 s; 2 loky workers, 4 pairs: 5.03-5.34 / 5.50-5.95 s.
    The garbage collection is loky's: it replaces a worker whose whole
    resident size after a task exceeds its size after its first task by 300
    MB, unless a full collection brings it back under that. Pools kept
    through that check took workers past it (2026-12-03, 16 full-resolution
    horses: pools of 189 and 873 MB, five workers replaced in a fit of 3
    L-BFGS iterations; 2026-12-04, half resolution, a pool bounded by the
    worker's growth of anonymous memory, 200 MiB: a worker replaced in a fit;
    docs/results/bench_fit_horses.txt)."""
    try:
        out = []
        for batch, starts, positions in task:
            if starts is not None and starts.ends is None:  # they travel back
                starts.ends = np.empty(starts.ptr[-1], starts.dtype)
            results, seconds = [], []
            for b in positions:
                clock = time.perf_counter()
                extra = () if starts is None else (starts.image(b),)
                (result,) = func(batch.image(b), *args, *extra)
                seconds.append(time.perf_counter() - clock)
                results.append(result)
            out.append((results, seconds, None if starts is None else starts.travelling_ends()))
        return out
    finally:
        if home is None or os.getpid() != home:
            keep_until_idle()


def _take(batch, positions):
    """The images ``positions`` of ``batch`` as a batch of their own (worker side)."""
    return _joined([batch.image(b) for b in positions])


def _regroup(batch, kept, *incoming):
    """The images ``kept`` of ``batch``, then those of the ``incoming``
    batches, as one batch (worker side, where ``batch`` is)."""
    return _joined([batch.image(b) for b in kept] + [part.image(b) for part in incoming for b in range(part.n_images)])


def _joined(images):
    """One :class:`Batch` of the images of several."""
    return Batch(*(
        None if getattr(images[0], name) is None else tuple(part for image in images for part in getattr(image, name))
        for name in ("node_features", "edges", "edge_features", "labels")
    ))


@dataclass
class ImageStarts:
    """One batch's side of :class:`WarmStarts` for one map: image ``b`` of
    the batch starts from ``previous[ptr[b]:ptr[b + 1]]`` (None: no earlier
    map, a cold start) and keeps its end in ``ends[ptr[b]:ptr[b + 1]]``,
    which the worker allocates when it is None (the ends then travel back
    with the results: ``travelling``)."""

    ptr: np.ndarray
    dtype: np.dtype
    previous: np.ndarray = None
    ends: np.ndarray = None
    travelling: bool = False

    def image(self, b):
        """Image ``b``'s alone, its ends a view of these (which must be allocated)."""
        part = slice(self.ptr[b], self.ptr[b + 1])
        return ImageStarts(np.array([0, self.ptr[b + 1] - self.ptr[b]]), self.dtype,
                           None if self.previous is None else self.previous[part], self.ends[part])

    def start(self, b):
        """Where image ``b`` of the batch starts (None: a cold start)."""
        return None if self.previous is None else self.previous[self.ptr[b]:self.ptr[b + 1]]

    def keep(self, b, end):
        """Keep where image ``b``'s inference ended, for the next map."""
        self.ends[self.ptr[b]:self.ptr[b + 1]] = np.ravel(end)

    def travelling_ends(self):
        return self.ends if self.travelling else None


class WarmStarts:
    """Where each image's inference ended in the last map, to start the next
    from (see the module docstring): ``ImageBatches.map(func, ...,
    starts=this)``. The first map starts cold. With a shared folder, two
    files per batch; otherwise the ends are kept here, per image (a
    cluster's batches may change between maps)."""

    def __init__(self, batches, sizes, dtype):
        self.batches = batches
        self.sizes = list(sizes)
        self.dtype = np.dtype(dtype)
        self.n_maps = 0
        self.paths = []
        if batches.folder is None:  # the ends travel with the tasks and results
            self.kept = [None] * len(self.sizes)
            return
        self.kept = None
        self.buffers = []
        try:
            self._map_files(batches.folder)
        except BaseException:
            self.close()
            raise

    def _pointers(self, group):
        return pointers([self.sizes[k] for k in group])

    def _map_files(self, folder):
        for c, group in enumerate(self.batches.groups):  # fixed with a shared folder
            size = int(self._pointers(group)[-1])
            pair = []
            for parity in (0, 1):
                path = os.path.join(folder, f"starts{id(self)}-{c}.{parity}")
                pair.append(_writable_map(path, (size,), self.dtype))
                if size:  # an empty one is in memory
                    self.paths.append(path)
            self.buffers.append(pair)

    def image_starts(self):
        """The :class:`ImageStarts` of each batch for the next map."""
        groups = self.batches.groups
        if self.kept is not None:
            return [
                ImageStarts(self._pointers(group), self.dtype,
                            np.concatenate([self.kept[k] for k in group]) if self.n_maps else None, travelling=True)
                for group in groups
            ]
        read = self.n_maps % 2
        return [
            ImageStarts(self._pointers(group), self.dtype, pair[read] if self.n_maps else None, pair[1 - read])
            for group, pair in zip(groups, self.buffers)
        ]

    def advance(self, travelled):
        """After a completed map: its ends (per image, when they travelled)
        become the next map's starts."""
        if self.kept is not None:
            self.kept = list(travelled)
        self.n_maps += 1

    def close(self):
        self.kept = self.buffers = None
        for path in self.paths:
            if os.path.exists(path):
                os.unlink(path)
            resource_tracker.unregister(path, "file")
        self.paths = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _writable_map(path, shape, dtype, what="the inference warm starts"):
    """A writable memory map of an array of ``shape`` and ``dtype`` in a new
    file whose room is taken now, so that a full file system raises OSError
    here rather than SIGBUS when it is written to."""
    dtype = np.dtype(dtype)
    n_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n_bytes == 0:  # an empty file cannot be mapped
        return np.empty(shape, dtype)
    with _room_for(path, what):
        with open(path, "wb") as file:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(file.fileno(), 0, n_bytes)
            else:
                file.truncate(n_bytes)
    return np.memmap(path, dtype=dtype, mode="r+", shape=shape)


class ImageBatches:
    """Images packed into one batch per worker once, mapped over many times.

    ``with ImageBatches(samples, labels, n_jobs) as batches:`` then
    ``batches.map(func, *args)`` runs ``func(batch, *args)`` (which returns one
    result per image of the batch) on every image, as a batch of its own, and
    returns the results of all images, in the order of ``samples``. See the
    module docstring.
    """

    def __init__(self, samples, labels, n_jobs=None, verbose=0):
        self.samples, self.labels = samples, labels
        self.n_jobs, self.verbose = n_jobs, verbose
        self.n_images = len(samples)
        #: (nodes, edges) of each image
        self.graph_sizes = [(s.node_features.shape[0], s.edges.shape[0]) for s in samples]
        self.groups = None
        self.folder = None  # where the batches are dumped, while open
        self._handles = None
        self._parallel = None
        self._client = None  # the cluster's, if any
        self._folder_manager = None
        self._tasks = {}  # func -> the images of each task of its next map
        self._seconds = {}  # func -> the seconds of each image in its last maps (at most _COST_MAPS)
        self._moves = None  # on a cluster: the groups that the batches are to hold from the next map on
        self._settled = {}  # on a cluster: func -> the per-image seconds of its maps since the last move
        self._holders = {}  # on a cluster: a batch's key -> the workers that hold it

    def __enter__(self):
        self.groups = plan_groups(self.samples, self.n_jobs)
        try:
            self._client = cluster_client() if len(self.groups) > 1 else None
            self._handles = self._hand_over()
            if len(self.groups) > 1 and self._client is None:
                self._start_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            self.samples = self.labels = None
        return self

    def _start_workers(self):
        self._parallel = Parallel(n_jobs=self.n_jobs, verbose=max(0, self.verbose - 2))
        self._parallel.__enter__()

    def _stop_workers(self, *exc):
        if self._parallel is not None:
            self._parallel.__exit__(*exc)
            self._parallel = None

    def warm_starts(self, sizes, dtype):
        """A :class:`WarmStarts` for maps over these batches: ``sizes[k]``
        values of ``dtype`` for image ``k``. Close it (or use ``with``)."""
        return WarmStarts(self, sizes, dtype)

    def _hand_over(self):
        if len(self.groups) == 1:
            return [pack(self.samples, self.labels, self.groups[0])]
        if self._client is not None:
            with warnings.catch_warnings():  # the images are the graph, on purpose (see the module docstring)
                warnings.filterwarnings("ignore", "Sending large graph")
                return [
                    self._client.submit(pack, [self.samples[i] for i in group],
                                        None if self.labels is None else [self.labels[i] for i in group],
                                        range(len(group)), pure=False)
                    for group in self.groups
                ]
        self._folder_manager = TemporaryResourcesManager()
        self.folder = self._folder_manager.resolve_temp_folder_name()
        os.makedirs(self.folder, exist_ok=True)
        handles = []
        for c, group in enumerate(self.groups):
            def in_file(name, parts, c=c):
                return _written(os.path.join(self.folder, f"batch{c}.{name}"), parts, "the image batches")

            handles.append(pack(self.samples, self.labels, group, in_file))
        return handles

    def map(self, func, *args, starts=None):
        """``func(batch, *args)`` on every image, as a batch of its own (with
        :class:`WarmStarts` ``starts``: ``func(batch, *args, image_starts)``,
        an :class:`ImageStarts` of that image), the results in image order.

        Each map balances the next map of the same function by the seconds
        that each image took (the median over its last maps: one map's are
        noisy, and the first is often special). Sizes predict badly where an
        image's working set outgrows the cache: measured (16 horses at half
        resolution, 2 threads), the batch holding the largest image (71,000
        pixels, the others 8,000-19,000) took 0.52 s per map against 0.43 s
        for the other, of equal size. With a shared folder every worker maps
        every batch, so a task may take any images; on a cluster, a task may
        take any images of the batches that its worker holds, and images move
        between workers (:meth:`_move_images`). Measured (16 horses at half
        resolution, one Dask worker process with 2 threads, fits of 10
        L-BFGS iterations, 3 alternating pairs of processes), the threads
        sharing the worker's two batches rather than one batch each: 0.624,
        0.618, 0.617 s per iteration against 0.643, 0.652, 0.635 (the busier
        thread's images had taken 4.3% more than the mean of the two, 1.6%
        after).
        """
        if self._moves is not None:
            self._move_images(self._moves)
            self._moves = None
            self._settled = {}
            self._tasks = {}  # planned on the batches before the move
        handles = [None] * len(self.groups) if starts is None else starts.image_starts()
        tasks = self._tasks.get(func) or [[(c, range(len(group)))] for c, group in enumerate(self.groups)]
        # each part its own starts: a batch split between two tasks of a
        # cluster's worker gives each task its own ends (a shared one would
        # be allocated by both threads, and one of them would lose its ends)
        calls = [[(self._handles[c], handles[c] if handles[c] is None else replace(handles[c]), positions)
                  for c, positions in task] for task in tasks]
        if self._client is not None:
            futures = [self._submit_where([self._handles[c] for c, _ in task], _call_images, func, call, args)
                       for task, call in zip(tasks, calls)]
            per_task = self._client.gather(futures)
        elif self._parallel is None:
            per_task = [_call_images(func, call, args, os.getpid()) for call in calls]
        else:
            try:
                per_task = self._parallel(delayed(_call_images)(func, call, args, os.getpid()) for call in calls)
            except TerminatedWorkerError as exc:
                self._stop_workers(type(exc), exc, exc.__traceback__)
                self._start_workers()  # the batch files stay: fresh workers map them again
                raise LostWorker(str(exc)) from exc
        out, seconds, travelled = [None] * self.n_images, [0.0] * self.n_images, [None] * self.n_images
        for task, parts, call in zip(tasks, per_task, calls):
            for (c, positions), (results, times, ends), (_, part_starts, _) in zip(task, parts, call):
                for b, result, t in zip(positions, results, times):
                    out[self.groups[c][b]] = result
                    seconds[self.groups[c][b]] = t
                    if ends is not None:  # they travelled: the part's batch's, this image's among them
                        travelled[self.groups[c][b]] = ends[part_starts.ptr[b]:part_starts.ptr[b + 1]]
        if starts is not None:
            starts.advance(travelled)
        self._balance(func, seconds)
        return out

    def _positions(self):
        """Image ``k`` -> (its batch, its position in the batch)."""
        return {k: (c, b) for c, group in enumerate(self.groups) for b, k in enumerate(group)}

    def _balance(self, func, seconds):
        """Plan the next map of ``func`` from the seconds of each image in this one."""
        if len(self.groups) < 2:  # one batch, in this process: nothing to balance
            return
        history = self._seconds.setdefault(func, [])
        history.append(seconds)
        del history[:-_COST_MAPS]
        costs = [float(c) for c in np.median(history, axis=0)]
        # the batches that one place holds, whose images any of its tasks may
        # take: all of them with a shared folder, a worker's on a cluster
        places = [range(len(self.groups))] if self._client is None else self._batches_by_worker()
        held = [[k for c in batches for k in self.groups[c]] for batches in places]  # each place's images
        where = self._positions()
        self._tasks[func] = [
            [(c, [where[k][1] for k in images if where[k][0] == c]) for c in sorted({where[k][0] for k in images})]
            for batches, images_there in zip(places, held)
            for images in balanced_groups(costs, len(batches), sorted(images_there))
        ]
        if self._client is not None and len(places) > 1:
            settled = self._settled.setdefault(func, [])
            settled.append(seconds)
            del settled[1:-_COST_MAPS]  # the first map on these batches is not one of them
            # where the images live follows the function that costs the most
            heaviest = max(self._seconds, key=lambda f: float(np.sum(np.median(self._seconds[f], axis=0))))
            if heaviest is func and len(settled) > _MOVE_AFTER_MAPS:  # moved at the next map, if any
                costs = [float(c) for c in np.median(settled[1:], axis=0)]
                moved = rebalanced_groups(held, costs, _MOVE_MIN_GAIN)
                if moved is not None:  # the images coming to a worker join its first batch
                    groups = list(self.groups)
                    for batches, before, now in zip(places, held, moved):
                        staying, were_there = set(now), set(before)
                        incoming = [k for k in now if k not in were_there]
                        for c in batches:
                            groups[c] = [k for k in self.groups[c] if k in staying] + (incoming if c == batches[0] else [])
                    self._moves = groups

    def _batches_by_worker(self):
        """The cluster's batches grouped by the workers that hold them (a
        batch whose holders are not known is a group of its own)."""
        places = {}
        for c, handle in enumerate(self._handles):
            holders = tuple(sorted(self._holders.get(handle.key, ()))) or ("?", c)
            places.setdefault(holders, []).append(c)
        return list(places.values())

    def _submit_where(self, batches, func, *args):
        """``func(*args)`` submitted to the cluster to run where the
        ``batches`` (futures) are, a loose restriction: elsewhere if those
        workers are gone. Left to itself the scheduler takes tasks of a name
        with more than twice as many tasks alive as it has threads (a map's
        and the last maps' not yet released) for root tasks, which go to any
        free worker: measured (16 horses at half resolution, 2 one-thread
        workers), in about one fit of two the two tasks of a map went each
        to the other worker, which fetched the other's batch, 0.16-0.28 s
        before they started, and one fit of 12 iterations moved images twice
        after it. Where a batch is is asked once (a request to the scheduler
        at every map cost it about 10 ms), once it is packed or regrouped;
        if a worker is lost, the tasks of its batches run where the
        scheduler recomputes them."""
        unknown = [batch for batch in batches if batch.key not in self._holders]
        if unknown:
            from distributed import wait  # a cluster's client: distributed is there

            wait(unknown)
            self._holders.update((k, v) for k, v in self._client.who_has(unknown).items() if v)
        where = sorted({w for batch in batches for w in self._holders.get(batch.key, ())})
        placed = {"workers": where, "allow_other_workers": True} if where else {}
        return self._client.submit(func, *args, pure=False, **placed)

    def _move_images(self, groups):
        """Move images between a cluster's batches so that batch ``c`` holds
        the images ``groups[c]`` (:func:`rebalanced_groups`): each batch
        sends its leaving images to the others and keeps its own, by tasks
        that run where the batches are; only the images that move travel."""
        where = self._positions()
        handles, order = [], []
        for d, group in enumerate(groups):
            kept = [where[k][1] for k in group if where[k][0] == d]
            incoming = {}
            for k in group:
                if where[k][0] != d:
                    incoming.setdefault(where[k][0], []).append(where[k][1])
            if not incoming and len(kept) == len(self.groups[d]):  # unchanged
                handles.append(self._handles[d])
                order.append(self.groups[d])
                continue
            parts = [self._submit_where([self._handles[c]], _take, self._handles[c], positions)
                     for c, positions in sorted(incoming.items())]
            handles.append(self._submit_where([self._handles[d]], _regroup, self._handles[d], kept, *parts))
            order.append([self.groups[d][b] for b in kept]
                         + [self.groups[c][b] for c, positions in sorted(incoming.items()) for b in positions])
        self._handles, self.groups = handles, order

    def __exit__(self, *exc):
        self._stop_workers(*exc)  # threads of this process end, and their scratch with them
        release()  # what this thread kept from map to map (one batch, mapped here)
        self._handles = self._client = None
        if self._folder_manager is not None:
            self._folder_manager._clean_temporary_resources(force=True)
            self._folder_manager = self.folder = None
        return False
