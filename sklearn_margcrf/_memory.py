"""Memory refused up front: a fit's peak memory per worker, estimated before
the fit starts and compared with the memory available on this machine.

A worker evaluates its batch of images one image at a time, so its peak is

    its batch of features (node and edge features, edges, labels)
  + the inference stack of its largest image: the snapshots of the messages
    that truncated fitting keeps for back TRW / back mean field
    (``_checkpoints.plan_size``: ``n_iter`` snapshots, or the buffer of
    ``checkpoints=``, or what fits ``STACK_MEMORY_BUDGET`` with None)
  + the tables, messages, marginals and gradients of its largest image
  + with warm starts (``inference_warm_start``), where each of its images'
    inference ended, twice (read from the previous evaluation, written by
    this one): ``2 * 2 E K`` values per image for TRW, ``2 * n K`` for mean
    field, in the folder of the batches (``/dev/shm`` when it has room,
    which is memory) or in this process.

The last term is :data:`BYTES_PER_VALUE` bytes for every value of an image's
``theta`` (``n K + E K^2``) and messages (``2 E K``): measured, one gradient
of TRW with 20 iterations on a 200 x 300 grid with two labels holds 98 MiB
of which 37 MiB are the stack, about 58 bytes per value for the rest (see
docs/scaling.rst, "Speed of the kernels"); 64 leaves a margin. The workers
run at once, so a fit needs the sum over its workers. Inference run to
convergence without a stack (``gradient_mode`` other than truncated) and
exact inference's junction trees are counted by their arrays only.
"""

import os
from dataclasses import dataclass

import numpy as np

from ._checkpoints import plan_size
from .gradients import INFERENCE_FREE_LOSSES
from .inference import KERNELS

__all__ = ["AVAILABLE_MEMORY_ENV", "BYTES_PER_VALUE", "WorkerMemory", "available_memory", "check_fit_memory"]

#: Environment variable: the bytes a fit may use, instead of what this
#: module reads from the system (to leave room for other programs, or in tests).
AVAILABLE_MEMORY_ENV = "SKLEARN_MARGCRF_AVAILABLE_MEMORY"

#: Bytes of tables, messages, marginals and gradients per value of an image (see above).
BYTES_PER_VALUE = 64


def _read_number(path, field=None):
    """An integer from a file of /proc or /sys (a ``field: value kB`` line of
    it with ``field``), or None when it is not there."""
    try:
        with open(path) as file:
            for line in file:
                if field is None:
                    text = line.strip()
                    return int(text) if text.isdigit() else None
                if line.startswith(field + ":"):
                    value, *unit = line.split(":", 1)[1].split()
                    return int(value) * (1024 if unit == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def available_memory():
    """(bytes, where they come from): the environment variable
    :data:`AVAILABLE_MEMORY_ENV` when set; otherwise the smallest of
    /proc/meminfo's MemAvailable (or ``os.sysconf``'s available pages) and the
    room left under this process's cgroup limit. (None, None) when unknown."""
    text = os.environ.get(AVAILABLE_MEMORY_ENV)
    if text:
        try:
            return int(float(text)), f"{AVAILABLE_MEMORY_ENV}={text}"
        except ValueError:
            raise ValueError(f"{AVAILABLE_MEMORY_ENV} must be a number of bytes, got {text!r}") from None
    found = []
    meminfo = _read_number("/proc/meminfo", "MemAvailable")
    if meminfo is not None:
        found.append((meminfo, "MemAvailable in /proc/meminfo"))
    else:
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "os.sysconf"))
        except (ValueError, OSError, AttributeError):
            pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        limit_bytes, used = _read_number(limit), _read_number(usage)
        if limit_bytes is not None and used is not None and limit_bytes < 2**60:
            found.append((max(limit_bytes - used, 0), f"the cgroup limit {limit}"))
    return min(found) if found else (None, None)


@dataclass(frozen=True)
class WorkerMemory:
    """The peak bytes of one worker: its batch of features, the inference
    stack of its largest image and that image's other arrays."""

    features: int
    stack: int
    arrays: int
    n_nodes: int
    n_edges: int
    n_snapshots: int
    warm_starts: int = 0

    @property
    def total(self):
        return self.features + self.stack + self.arrays + self.warm_starts


def _stack_plan(objective, n_edges, n_nodes, n_states, itemsize):
    """(snapshots, bytes) of the inference stack of a truncated fit of one image."""
    settings = objective.settings
    truncated = (
        settings.gradient_mode == "truncated" and settings.loss not in INFERENCE_FREE_LOSSES
        and settings.inference != "exact" and not objective.independent and settings.n_iter
    )
    if not truncated:
        return 0, 0
    if settings.inference == "mean_field":
        snapshot = n_nodes * n_states * itemsize
    else:  # TRW keeps its messages, and their powers m ** rho unless rho is 1 or 1/2
        general = settings.inference == "trw" and settings.rho not in (1, 1.0, 0.5)
        snapshot = 2 * n_edges * n_states * itemsize * (2 if general else 1)
    n_snapshots, n_slots = plan_size(int(settings.n_iter), settings.checkpoints, snapshot)
    return n_snapshots, n_slots * snapshot


def worker_memory(samples, labels, group, objective):
    """The :class:`WorkerMemory` of the worker given the images ``group`` of
    ``samples`` (validated, with ``labels``) under ``objective`` (a ``CRFObjective``)."""
    n_states = objective.shape_f[0]
    features = sum(
        samples[k].node_features.nbytes + samples[k].edge_features.nbytes + samples[k].edges.size * 8
        + labels[k].nbytes for k in group
    )
    itemsize = np.dtype(objective.dtype).itemsize
    warm_starts = 0
    if objective.warm_start:  # the ends of the previous evaluation and of this one
        end_size = KERNELS[objective.settings.inference].end_size
        warm_starts = 2 * itemsize * sum(end_size(samples[k].n_nodes, samples[k].n_edges, n_states) for k in group)
    largest = None
    for k in group:
        n_nodes = samples[k].n_nodes
        n_edges = 0 if objective.independent else samples[k].n_edges
        snapshots, stack = _stack_plan(objective, n_edges, n_nodes, n_states, itemsize)
        arrays = BYTES_PER_VALUE * (n_nodes * n_states + n_edges * n_states * (n_states + 2))
        if largest is None or stack + arrays > largest.stack + largest.arrays:
            largest = WorkerMemory(features, stack, arrays, n_nodes, n_edges, snapshots, warm_starts)
    return largest


def _size(n_bytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes} bytes"


def check_fit_memory(samples, labels, groups, objective, checkpoints, n_jobs):
    """MemoryError, before a fit starts, when its workers (one per group of
    image indices) need more memory than is available; the message states
    the estimate, the memory available and the remedies."""
    available, source = available_memory()
    if available is None:
        return
    workers = [worker_memory(samples, labels, group, objective) for group in groups]
    needed = sum(w.total for w in workers)
    if needed <= available:
        return
    worst = max(workers, key=lambda w: w.total)
    stack = (
        f"the inference stack of its largest image ({worst.n_nodes} nodes, {worst.n_edges} edges): "
        f"{worst.n_snapshots} snapshots of the messages, {_size(worst.stack)}; "
        if worst.stack else ""
    )
    warm = f"; where its images' inference ended, for warm starts, {_size(worst.warm_starts)}" if worst.warm_starts else ""
    remedies = [f"lower n_jobs (now {n_jobs!r}; each worker holds its images' arrays)"] if len(workers) > 1 else []
    if worst.stack:
        remedies.append(f"set checkpoints= to keep fewer snapshots (now {checkpoints!r}; e.g. checkpoints=5)")
    if worst.warm_starts:
        remedies.append("set inference_warm_start=False")
    if objective.dtype != np.float32:
        remedies.append("use dtype=np.float32 (half the inference memory)")
    remedies.append("store the features in float32, use smaller images, or free memory")
    raise MemoryError(
        f"this fit needs an estimated {_size(needed)} of memory but {_size(available)} is available ({source}): "
        f"{len(workers)} worker(s) at once, the largest holding {_size(worst.total)} ({stack}its batch of features "
        f"{_size(worst.features)}; tables, messages, marginals and gradients {_size(worst.arrays)}{warm}). "
        f"To fit, {', '.join(remedies)}. Set the environment variable {AVAILABLE_MEMORY_ENV} (bytes) to "
        "override the memory available."
    )
