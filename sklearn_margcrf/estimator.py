"""MarginalCRF: the scikit-learn estimator (Domke 2013, Sec. "Experiments").

A thin layer over the functional core :func:`sklearn_margcrf.loss_and_grad`:

* **parametrisation** (paper, Sec. "Setup" of the experiments): the unary and
  pairwise parameters of image ``y`` are linear in its features,

      theta_i  = F u(y, i)       F : (K, Fu)
      theta_ij = G v(y, i, j)    G : (K, K, Fe)

  and the chain rule gives ``dL/dF = sum_i dL/dtheta_i u_i^T`` and
  ``dL/dG = sum_ij dL/dtheta_ij v_ij^T``;
* **objective** (Sec. "Learning" and the Stanford experiment): the empirical
  risk measured per labelled node plus a ridge penalty,

      R(F, G) = (sum over images of L) / (number of labelled nodes)
                + reg * (||F||^2 + ||G||^2),

  minimised with L-BFGS (scipy), re-initialised when the line search meets a
  bad search direction, as the paper does;
* **a parallel map over images** (joblib): images are packed into one batch per
  worker, the batches are sent once per fit (memory-mapped files for process
  backends, scattered data for the Dask backend) and only the weights travel at
  each L-BFGS iteration. Per-image results are summed in image order, so the
  result does not depend on ``n_jobs`` or on the backend.
"""

import ctypes
import errno
import functools
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.optimize
from joblib import Parallel, delayed, effective_n_jobs
from joblib.parallel import get_active_backend
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, _fit_context
from threadpoolctl import threadpool_limits
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import Bunch, ClassifierTags
from sklearn.utils._param_validation import Interval, Options, StrOptions
from sklearn.utils.validation import check_is_fitted, check_random_state

from . import __version__
from ._graph import _as_float_array, _as_labels, validate_edges
from ._linear import feature_scores, logistic_loss_and_gradient, weight_gradient
from ._warnings import warn_at_caller
from .edge_appearance import RHO_RULES
from .exceptions import InconsistentVersionWarning
from .gradients import (
    GRADIENT_MODES,
    INFERENCE_FREE_LOSSES,
    INFERENCE_METHODS,
    LOSSES,
    MIN_MULTIPLIER,
    check_combination,
    loss_and_grad,
)
from .inference import MIN_RHO, infer
from .sample import as_sample, labels_to_grid, marginals_to_image

__all__ = ["MarginalCRF"]

INFERENCE_CHOICES = INFERENCE_METHODS + ("independent",)


# ---------------------------------------------------------------------------
# Input validation (structured X: a list of samples)
# ---------------------------------------------------------------------------


class _Sample:
    """A validated sample: float64 (or float32) features, int64 edges, and the
    original sample (for its grid / image shape)."""

    __slots__ = ("node_features", "edges", "edge_features", "sample")

    def __init__(self, node_features, edges, edge_features, sample):
        self.node_features = node_features
        self.edges = edges
        self.edge_features = edge_features
        self.sample = sample

    @property
    def n_nodes(self):
        return self.node_features.shape[0]

    @property
    def n_edges(self):
        return self.edges.shape[0]


def _check_X(X, n_node_features=None, n_edge_features=None):
    """Validate a list of samples; return a list of :class:`_Sample`.

    With ``n_node_features`` / ``n_edge_features`` given (predict), the feature
    dimensions must match them; otherwise they must agree across samples.
    Inputs are never modified (float64 or float32 contiguous inputs are not
    even copied: float32 features stay float32; the products with the weights
    read them as they are and compute in float64, :mod:`._linear`).
    """
    if isinstance(X, np.ndarray) and X.dtype != object:
        raise TypeError(
            "X must be a list of samples (node_features, edges, edge_features) or CRFSample "
            f"objects, got a numeric ndarray of shape {X.shape}"
        )
    if isinstance(X, (str, bytes)) or not hasattr(X, "__len__") or not hasattr(X, "__getitem__"):
        raise TypeError(f"X must be a list of samples, got {type(X).__name__}")
    if len(X) == 0:
        raise ValueError("X is empty: need at least one sample")
    samples = []
    for k in range(len(X)):
        sample = as_sample(X[k])
        nf, edges, ef = sample
        nf = _as_float_array(nf, f"X[{k}] node_features", 2, keep_float32=True)
        n_nodes = nf.shape[0]
        if n_nodes == 0:
            raise ValueError(f"X[{k}] has no nodes (node_features of shape {nf.shape})")
        try:
            edges = validate_edges(edges, n_nodes)
        except ValueError as exc:
            raise ValueError(f"X[{k}]: {exc}") from None
        n_edges = edges.shape[0]
        if ef is None or (n_edges == 0 and np.size(ef) == 0):
            width = n_edge_features if n_edge_features is not None else (
                np.shape(ef)[1] if ef is not None and np.ndim(ef) == 2 else 0
            )
            ef = np.zeros((0, width))
        else:
            ef = _as_float_array(ef, f"X[{k}] edge_features", 2, keep_float32=True)
        if ef.shape[0] != n_edges:
            raise ValueError(
                f"X[{k}] has {n_edges} edges but edge_features has {ef.shape[0]} rows "
                "(one row of features per edge expected)"
            )
        samples.append(_Sample(nf, edges, ef, sample))

    if n_node_features is None:
        n_node_features = samples[0].node_features.shape[1]
        n_edge_features = next((s.edge_features.shape[1] for s in samples if s.n_edges), samples[0].edge_features.shape[1])
        where = "X[0]"
    else:
        where = "fit"
    for k, s in enumerate(samples):
        if s.node_features.shape[1] != n_node_features:
            raise ValueError(
                f"X[{k}] has {s.node_features.shape[1]} node features but {where} had "
                f"{n_node_features}: every sample must have the same node features"
            )
        if s.n_edges and s.edge_features.shape[1] != n_edge_features:
            raise ValueError(
                f"X[{k}] has {s.edge_features.shape[1]} edge features but {where} had "
                f"{n_edge_features}: every sample must have the same edge features"
            )
        if not s.n_edges and s.edge_features.shape[1] != n_edge_features:
            s.edge_features = np.zeros((0, n_edge_features))
    return samples, n_node_features, n_edge_features


def _check_y(y, samples, n_states=None):
    """Validate labels; return a list of flat int64 label arrays (one per
    sample, -1 = unlabelled) and the number of states."""
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"y must be a list of label arrays (one per sample), got {type(y).__name__}")
    if len(y) != len(samples):
        raise ValueError(
            f"X and y have different lengths: X has {len(samples)} samples but y has {len(y)} label arrays"
        )
    labels = []
    for k, (s, lab) in enumerate(zip(samples, y)):
        lab = _as_labels(lab, f"y[{k}]")
        try:
            flat = labels_to_grid(lab, s.sample)
        except ValueError as exc:
            raise ValueError(f"y[{k}]: label count does not match the node count: {exc}") from None
        labels.append(np.asarray(flat, dtype=np.int64))
    max_label = max((int(f.max()) for f in labels if f.size), default=-1)
    if n_states is None:
        n_states = max(max_label + 1, 2)
    elif max_label >= n_states:
        k = next(k for k, f in enumerate(labels) if f.size and f.max() == max_label)
        raise ValueError(
            f"y[{k}] has label {max_label} but n_states={n_states}: labels must lie in "
            f"[0, {n_states - 1}] (-1 = unlabelled)"
        )
    return labels, n_states


# ---------------------------------------------------------------------------
# Batches of images, packed for the workers
# ---------------------------------------------------------------------------


def _balanced_chunks(costs, n_chunks):
    """Split image indices into at most ``n_chunks`` groups of similar total cost
    (longest processing time first); each group is returned in image order."""
    n_chunks = max(1, min(int(n_chunks), len(costs)))
    loads = [0.0] * n_chunks
    groups = [[] for _ in range(n_chunks)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(n_chunks), key=lambda c: (loads[c], c))
        loads[target] += costs[index]
        groups[target].append(index)
    return [sorted(g) for g in groups if g]


def _pack(samples, labels, indices, allocate=None):
    """Concatenate the images ``indices`` into one dict of arrays.

    ``allocate(key, shape, dtype)`` returns the array each field is written
    into (default: a new in-memory array), so that a batch can be written
    straight into shared memory without an intermediate copy.
    """
    if allocate is None:
        allocate = _allocate_in_memory
    node_ptr = np.zeros(len(indices) + 1, dtype=np.int64)
    edge_ptr = np.zeros(len(indices) + 1, dtype=np.int64)
    node_ptr[1:] = np.cumsum([samples[i].n_nodes for i in indices])
    edge_ptr[1:] = np.cumsum([samples[i].n_edges for i in indices])

    def stacked(key, parts, dtype=None):
        if dtype is None:  # empty parts (edgeless images) do not promote float32
            dtype = np.result_type(*([p for p in parts if p.size] or parts))
        out = allocate(key, (sum(p.shape[0] for p in parts),) + parts[0].shape[1:], dtype)
        np.concatenate(parts, out=out)
        return out

    return {
        "index": np.asarray(indices, dtype=np.int64),
        "node_ptr": node_ptr,
        "edge_ptr": edge_ptr,
        "node_features": stacked("node_features", [samples[i].node_features for i in indices]),
        "edges": stacked("edges", [samples[i].edges.reshape(-1, 2) for i in indices], np.int64),
        "edge_features": stacked("edge_features", [samples[i].edge_features for i in indices]),
        "labels": stacked("labels", [labels[i] for i in indices], np.int64) if labels is not None else None,
    }


def _allocate_in_memory(key, shape, dtype):
    return np.empty(shape, dtype=dtype)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 2**20  # the largest glibc accepts on 64-bit systems
_TRIM_THRESHOLD = 2**30
_allocator_tuned = False


def _keep_freed_memory():
    """Let glibc keep freed blocks of up to 32 MiB for reuse in this process
    (and up to 1 GiB of free memory in all), once per process.

    Every image's gradient allocates and frees tens of MB of scratch arrays
    (the stack of truncated inference above all). By default glibc returns
    most of them to the system, and the next image faults them in again page
    by page: 7,000-10,000 page faults and an eighth of the CPU time of a
    20-iteration mean-field gradient of a 232 x 315 image went to that.
    Called only in loky and multiprocessing workers, which run these batches;
    the user's own process and Dask's workers (which manage their memory
    themselves) are left alone. Does nothing without glibc.
    """
    global _allocator_tuned
    if _allocator_tuned:
        return
    _allocator_tuned = True
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # setting the mmap threshold switches off glibc's adaptive thresholds,
    # so the trim threshold is set only when the mmap threshold was taken
    if mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX):
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def _in_batch_worker(func, *args):
    """Run ``func(*args)`` in a loky or multiprocessing worker."""
    _keep_freed_memory()
    return func(*args)


def _chunk_images(chunk):
    """Yield (node_features, edges, edge_features, labels) views of each image."""
    node_ptr, edge_ptr = chunk["node_ptr"], chunk["edge_ptr"]
    for b in range(len(chunk["index"])):
        n0, n1 = node_ptr[b], node_ptr[b + 1]
        e0, e1 = edge_ptr[b], edge_ptr[b + 1]
        labels = chunk["labels"][n0:n1] if chunk["labels"] is not None else None
        yield chunk["node_features"][n0:n1], chunk["edges"][e0:e1], chunk["edge_features"][e0:e1], labels


def _theta(node_features, edge_features, unary_coef, pairwise_coef):
    """theta_i = F u_i (n, K) and theta_ij = G v_ij (E, K, K)."""
    n_states = unary_coef.shape[0]
    unary = feature_scores(node_features, unary_coef)
    pairwise = feature_scores(edge_features, pairwise_coef.reshape(n_states * n_states, -1))
    # The features were checked finite in fit / predict; what can still
    # overflow is the product with the weights, and the user never passed a
    # "unary", so say which it is.
    if not (np.isfinite(unary.sum()) and np.isfinite(pairwise.sum())):
        raise FloatingPointError(
            "the potentials theta_i = F u_i or theta_ij = G v_ij of an image overflowed (non-finite values): "
            "the features are too large for the weights; rescale the features (e.g. StandardScaler) or raise reg"
        )
    return unary, pairwise.reshape(-1, n_states, n_states)


def _empty_model(n_states):
    return np.zeros((0, 2), dtype=np.int64), np.zeros((0, n_states, n_states))


#: A number in a warning message: messages that differ only in their
#: figures (an image's iteration count, residual, ...) are one warning.
_FIGURE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


_DEFAULT_SHOW = getattr(warnings, "_showwarning_orig", warnings.showwarning)
_recording = {"lock": threading.Lock(), "depth": 0, "context": None, "show": None, "logs": {}}


def _show_or_record(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` while any :class:`_RecordedWarnings` is open."""
    log = _recording["logs"].get(threading.get_ident())
    if log is not None:
        log.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
    else:
        (_recording["show"] or _DEFAULT_SHOW)(message, category, filename, lineno, file, line)


class _RecordedWarnings:
    """Record the warnings raised in a block (in a worker or in-process).

    ``summary()`` is ``{(category, template): (count, first message, varied)}``
    with ``template`` the message's first line with its figures masked, and
    ``varied`` whether the figures differed; it pickles back to the caller,
    where :func:`_report_warnings` issues each template once.

    Thread-safe: :class:`warnings.catch_warnings` changes process-wide state,
    so blocks running at once in several threads (the threading backend,
    Dask's threads) would restore each other's state, losing warnings and
    leaving the process's warnings going to a dead list. Concurrent blocks
    therefore share one ``catch_warnings``, entered by the first and left by
    the last, and each thread's warnings go to its own block; warnings of
    other threads meanwhile are shown as they would have been.
    """

    def __enter__(self):
        self._records = []
        ident = threading.get_ident()
        with _recording["lock"]:
            if _recording["depth"] == 0:
                context = warnings.catch_warnings()
                context.__enter__()
                warnings.simplefilter("always")
                _recording["context"], _recording["show"] = context, warnings.showwarning
                warnings.showwarning = _show_or_record
            _recording["depth"] += 1
            self._outer = _recording["logs"].get(ident)  # a block nested in this thread
            _recording["logs"][ident] = self._records
        return self

    def __exit__(self, *exc):
        ident = threading.get_ident()
        with _recording["lock"]:
            if self._outer is None:
                del _recording["logs"][ident]
            else:
                _recording["logs"][ident] = self._outer
            _recording["depth"] -= 1
            if _recording["depth"] == 0:
                context, _recording["context"], _recording["show"] = _recording["context"], None, None
                context.__exit__(None, None, None)
        return False

    def summary(self):
        counts = {}
        for record in self._records:
            message = str(record.message).split("\n")[0]
            _merge_warnings(counts, {(record.category, _FIGURE.sub("#", message)): (1, message, False)})
        return counts


def _merge_warnings(total, counts):
    for key, (n, message, varied) in counts.items():
        if key in total:
            n_total, first, varied_total = total[key]
            total[key] = (n_total + n, first, varied_total or varied or message != first)
        else:
            total[key] = (n, message, varied)


def _report_warnings(counts, where):
    """Issue each recorded warning once, with how often it occurred."""
    for (category, _), (n, message, varied) in counts.items():
        times = f" ({n} times{', figures of the first' if varied else ''})" if n > 1 else ""
        warn_at_caller(f"{where}: {message}{times}", category)


def _chunk_loss_grad(chunk, unary_coef, pairwise_coef, config):
    """Loss and weight gradients of every image of a batch (worker side).

    Returns ``(per_image, kernel_seconds, warnings)`` with ``per_image`` a list
    of ``(value, dL/dF, dL/dG)`` in the batch's image order and the warnings
    the batch raised, summarised (:class:`_RecordedWarnings`), so that the
    caller reports them whatever the joblib backend.
    """
    independent = config["inference"] == "independent"
    kwargs = {k: config[k] for k in ("loss", "n_iter", "tol", "max_iter", "alpha", "sides", "multiplier")}
    if independent:
        # No pairwise terms: any iterative method is exact; one iteration
        # from uniform messages gives softmax(theta).
        kwargs.update(inference="trw", gradient_mode="truncated", n_iter=1, rho=None)
    else:
        kwargs.update(inference=config["inference"], gradient_mode=config["gradient_mode"], rho=config["rho"])
    out = []
    kernel = 0.0
    with _RecordedWarnings() as recorded:
        for node_features, edges, edge_features, labels in _chunk_images(chunk):
            out.append(_image_loss_grad(node_features, edges, edge_features, labels, unary_coef, pairwise_coef,
                                        independent, kwargs))
            kernel += out[-1][3]
    return [item[:3] for item in out], kernel, recorded.summary()


def _image_loss_grad(node_features, edges, edge_features, labels, unary_coef, pairwise_coef, independent, kwargs):
    """(loss, dL/dF, dL/dG, kernel seconds) of one image."""
    n_states = unary_coef.shape[0]
    unary, pairwise = _theta(node_features, edge_features, unary_coef, pairwise_coef)
    if independent:
        edges, pairwise = _empty_model(n_states)
    elif not edges.flags.writeable:
        # Memory-mapped batch: the kernels accept read-only arrays, but numba
        # compiles them as a separate signature; a copy of the (small) edge
        # list keeps one compiled version per kernel.
        edges = np.array(edges)
    start = time.perf_counter()
    value, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, **kwargs)
    kernel = time.perf_counter() - start
    grad_f = weight_gradient(grad_unary, node_features)
    if independent:
        grad_g = np.zeros_like(pairwise_coef)
    else:
        grad_g = weight_gradient(grad_pairwise.reshape(-1, n_states * n_states), edge_features).reshape(pairwise_coef.shape)
    return float(value), grad_f, grad_g, kernel


def _chunk_marginals(chunk, unary_coef, pairwise_coef, config):
    """Unary marginals (n, K) of every image of a batch (worker side), the
    number not converged and the warnings raised (:class:`_RecordedWarnings`)."""
    out = []
    not_converged = 0
    with _RecordedWarnings() as recorded:
        for node_features, edges, edge_features, _ in _chunk_images(chunk):
            unary, pairwise = _theta(node_features, edge_features, unary_coef, pairwise_coef)
            if config["inference"] == "independent" or edges.shape[0] == 0:
                mu = np.exp(unary - logsumexp(unary, axis=1, keepdims=True))
            else:
                if not edges.flags.writeable:
                    edges = np.array(edges)
                result = infer(
                    edges, unary, pairwise, method=config["inference"], n_iter=config["n_iter"],
                    tol=config["tol"], max_iter=config["max_iter"], rho=config["rho"],
                )
                mu = result.unary
                not_converged += config["n_iter"] is None and not result.converged
            out.append(mu)
    return out, not_converged, recorded.summary()


_FOLDER_PREFIX = "margcrf_"


def _shared_memory_dir():
    folder = "/dev/shm"
    if os.path.isdir(folder) and os.access(folder, os.W_OK):
        return folder
    return None


def _free_bytes(folder):
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def _reserve(path):
    """Allocate the blocks of a freshly created (sparse) file now, so that a
    full file system (a small /dev/shm, Docker's is 64 MB) raises OSError here
    instead of killing the process with SIGBUS when its pages are written."""
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
            raise OSError(exc.errno, f"no room for the image batches in {os.path.dirname(path)}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


_LOCK_NAME = "in_use.lock"


def _hold_folder(folder):
    """Mark a batch folder as in use for as long as this process lives: an
    exclusive ``flock`` on a file in it, which the kernel releases when the
    process dies. Unlike the process id in the folder's name, the lock is
    seen by processes in other PID namespaces sharing /dev/shm (containers
    run with ``--ipc=host`` or ``-v /dev/shm:/dev/shm``, the containers of a
    Kubernetes pod), to which this process does not exist. Returns the file
    descriptor to close on exit (None without ``fcntl``)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(os.path.join(folder, _LOCK_NAME), os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _new_batch_folder(parent):
    """A new folder ``margcrf_<pid>_<random>`` in ``parent`` (None: the
    temporary folder) and its lock (:func:`_hold_folder`). The folder is made
    under a name that orphan cleanup skips (a leading dot), locked, and only
    then renamed: a cleanup in another PID namespace, to which this process
    looks dead, never sees it unlocked."""
    staging = tempfile.mkdtemp(prefix=f".{_FOLDER_PREFIX}{os.getpid()}_", dir=parent)
    lock = None
    try:
        lock = _hold_folder(staging)
        folder = os.path.join(os.path.dirname(staging), os.path.basename(staging)[1:])
        os.rename(staging, folder)
    except BaseException:
        # nothing else would remove a hidden staging folder
        if lock is not None:
            os.close(lock)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder, lock


def _folder_in_use(path):
    """Whether a live process, possibly one this process cannot see, holds the
    folder's lock (:func:`_hold_folder`)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(os.path.join(path, _LOCK_NAME), os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False  # no lock: the process id in the name decides
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _remove_orphaned_folders(parent):
    """Remove the batch folders of processes that no longer exist.

    A fit killed without cleanup (SIGKILL, out of memory, a closed session)
    leaves its batches in shared memory, where they hold RAM until reboot;
    the next fit on the machine could then run out of memory itself. Folders
    are named ``margcrf_<pid>_...`` so that orphans can be recognised. Only
    called for /dev/shm, which is local to the machine (a temporary folder
    on disk may be shared by several machines, whose process ids mean
    nothing here; a leak there costs disk, not memory).
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        fields = name.split("_")
        if not name.startswith(_FOLDER_PREFIX) or len(fields) < 3 or not fields[1].isdigit():
            continue
        path = os.path.join(parent, name)
        if not _process_alive(int(fields[1])) and not _folder_in_use(path):
            shutil.rmtree(path, ignore_errors=True)


class _ParallelMap:
    """Apply a function to fixed batches of images many times (once per
    L-BFGS iteration), sending the batches once.

    ``groups`` lists the image indices of each batch (see
    :func:`_balanced_chunks`); the batches are packed on entering:

    * one batch: run in-process, no joblib machinery;
    * process backends (loky, multiprocessing): each batch is written straight
      into memory-mapped files (in /dev/shm when available, no in-memory copy
      first); joblib then passes them to the workers by reference (file name
      and offset) instead of pickling them;
    * Dask backend: the batches are scattered to the cluster once and the
      tasks refer to them by future;
    * the ``Parallel`` instance stays open across calls, so loky reuses its
      workers; it is joblib's, not scikit-learn's, whose tasks each enter
      :class:`warnings.catch_warnings`, which is not thread-safe and would undo
      :class:`_RecordedWarnings` in the threads of the threading backend
      (the workers read no scikit-learn configuration, and report their
      warnings to the caller, whose filters then apply);
    * loky and multiprocessing workers keep the memory they free
      (:func:`_keep_freed_memory`).

    Use as a context manager; it removes its files on exit (and, on entry,
    those left behind by killed processes).
    """

    def __init__(self, samples, labels, groups, n_jobs, verbose=0):
        self.samples, self.labels = samples, labels
        self.indices = [list(group) for group in groups]
        self.n_images = sum(len(index) for index in self.indices)
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.chunks = None
        self._folder = None
        self._parallel = None
        self._futures = None
        self._process_workers = False
        self._lock = None

    def __enter__(self):
        try:
            self.chunks = self._pack_batches()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            self.samples = self.labels = None
        return self

    def _pack_batches(self):
        if len(self.indices) == 1:
            return [_pack(self.samples, self.labels, self.indices[0])]
        backend, _ = get_active_backend()
        backend_name = type(backend).__name__
        self._parallel = Parallel(n_jobs=self.n_jobs, verbose=max(0, self.verbose - 2))
        self._parallel.__enter__()
        if backend_name in ("LokyBackend", "MultiprocessingBackend"):
            self._process_workers = True
            parent = _shared_memory_dir()
            if parent is not None:
                _remove_orphaned_folders(parent)
                free, needed = _free_bytes(parent), self._batch_bytes()
                if free is not None and free < needed:
                    if self.verbose > 0:
                        print(f"[MarginalCRF] {parent} has {free / 2**20:.0f} MB free, the image batches need "
                              f"{needed / 2**20:.0f} MB: they go to {tempfile.gettempdir()} instead", flush=True)
                    parent = None  # too small for the batches: a temporary folder on disk
            self._folder, self._lock = _new_batch_folder(parent)
            return [self._pack_to_files(group, c) for c, group in enumerate(self.indices)]
        chunks = [_pack(self.samples, self.labels, group) for group in self.indices]
        if backend_name == "DaskDistributedBackend":
            self._futures = backend.client.scatter(chunks, hash=False)
        return chunks

    def _batch_bytes(self):
        """Bytes of all the batches, from the samples' own dtypes (a batch
        mixing float32 and float64 features is stored in float64, a little
        more; :func:`_reserve` catches what this misses)."""
        total = 0
        for group in self.indices:
            for i in group:
                sample = self.samples[i]
                total += sample.node_features.nbytes + 16 * sample.n_edges + sample.edge_features.nbytes
                if self.labels is not None:
                    total += self.labels[i].nbytes
        return total

    def _pack_to_files(self, group, c):
        def allocate(key, shape, dtype):
            if int(np.prod(shape)) * np.dtype(dtype).itemsize < 4096:  # not worth a file
                return _allocate_in_memory(key, shape, dtype)
            path = os.path.join(self._folder, f"chunk{c}_{key}.npy")
            array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
            _reserve(path)
            return array

        chunk = _pack(self.samples, self.labels, group, allocate)
        for key, array in chunk.items():
            if isinstance(array, np.memmap):
                array.flush()
                # read-only from here on: the workers share the pages
                chunk[key] = np.load(array.filename, mmap_mode="r")
        return chunk

    def __call__(self, func, *args):
        if self._parallel is None:
            # The per-image products are small and the kernels single-threaded:
            # BLAS threads only oversubscribe the cores here (joblib's workers
            # get the same limit from joblib itself).
            with threadpool_limits(limits=1, user_api="blas"):
                return [func(chunk, *args) for chunk in self.chunks]
        data = self._futures if self._futures is not None else self.chunks
        if self._process_workers:
            return self._parallel(delayed(_in_batch_worker)(func, chunk, *args) for chunk in data)
        return self._parallel(delayed(func)(chunk, *args) for chunk in data)

    def __exit__(self, *exc):
        if self._parallel is not None:
            self._parallel.__exit__(*exc)
            self._parallel = None
        if self._futures is not None:
            for future in self._futures:
                future.release()
            self._futures = None
        self.chunks = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        return False


# ---------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------


def _unpack_weights(w, shape_f, shape_g):
    """Copies (F, G) of a weight vector; ``G`` is zero when the vector holds
    ``F`` only (the independent model)."""
    size_f = int(np.prod(shape_f))
    F = w[:size_f].reshape(shape_f).copy()
    G = w[size_f:].reshape(shape_g).copy() if w.size > size_f else np.zeros(shape_g)
    return F, G


class _StopFit(Exception):
    """Raised out of L-BFGS when the user's ``callback`` asks to stop, with
    the weights of that iteration."""

    def __init__(self, weights):
        super().__init__("stopped by the callback")
        self.weights = weights


class MarginalCRF(BaseEstimator):
    """Conditional random field learned with a marginal-based loss under
    approximate inference (Domke, "Learning Graphical Model Parameters with
    Approximate Marginal Inference", TPAMI 2013).

    Each sample is a pairwise graph with features on its nodes and edges; the
    parameters are linear in the features (``theta_i = F u_i``,
    ``theta_ij = G v_ij``), and ``F``, ``G`` minimise the mean loss per
    labelled node plus ``reg * (||F||^2 + ||G||^2)`` with L-BFGS.

    Parameters
    ----------
    loss : {"univariate_logistic", "clique_logistic", "univariate_quadratic", \
            "smooth_classification", "surrogate_likelihood", "pseudolikelihood", \
            "piecewise"}, default="univariate_logistic"
        Training loss (paper, Sec. "Loss Functions"). ``"surrogate_likelihood"``
        is surrogate EM when some labels are hidden. ``"pseudolikelihood"`` and
        ``"piecewise"`` need no inference in training (``inference`` then
        only serves prediction and ``gradient_mode`` is ignored).
    inference : {"trw", "lbp", "mean_field", "exact", "independent"}, default="trw"
        Marginal inference used in training and prediction. ``"independent"``
        is the paper's independent model: logistic regression on the unary
        features, no pairwise weights (``pairwise_coef_`` stays zero).
    gradient_mode : {"truncated", "backprop", "perturbation", "implicit"}, default="truncated"
        How ``dL/dtheta`` is computed (Sec. "Truncated Fitting", "Perturbation",
        "Implicit Fitting"; ``"backprop"`` is back TRW / back mean field run to
        convergence). Not every combination applies: ``"implicit"`` with
        ``"mean_field"``, and ``"truncated"`` / ``"backprop"`` with
        ``"exact"`` raise ValueError in ``fit``.
    n_iter : int, default=20
        Inference iterations of truncated fitting; prediction then also runs
        exactly ``n_iter`` iterations (the model was fit for them). Not used
        by the losses fit without inference (pseudolikelihood, piecewise),
        whose models predict with inference run to ``tol``.
    tol : float, default=1e-4
        Convergence threshold of inference for the other gradient modes and
        for prediction after them and after the losses fit without inference
        (the paper's threshold of 1e-4).
    rho : float, {"auto", "uniform_spanning_tree", "forest_cover"} or None, default=None
        TRW edge appearance probabilities (None: the inference default). Used
        by ``inference="trw"`` only and ignored by the other methods, so that
        a grid search over ``inference`` can share it.
    alpha : float, default=15.0
        Slope of the smoothed classification loss (the paper uses 5, 15, 50).
    reg : float, default=1e-3
        Ridge penalty on all weights, relative to the mean loss per labelled
        node (the paper's ``lambda``).
    max_iter : int, default=200
        Maximum number of L-BFGS iterations of the fit (over all restarts; the
        initialising fits get as many again).
    n_states : int or None, default=None
        Number of labels K. None infers ``max(y) + 1`` (at least 2); give it in
        cross-validation, where a fold may lack a label.
    init : {"independent", "zeros"}, default="independent"
        Starting weights. ``"independent"`` first fits the independent model
        (univariate logistic loss) and starts from its ``F`` with ``G = 0``;
        for ``loss="smooth_classification"`` a surrogate-likelihood fit from
        there is the start (as in the paper).
    n_jobs : int or None, default=None
        Number of joblib workers for the per-image losses and gradients (and
        for prediction). Images are batched per worker. The active joblib
        backend is honoured, e.g. ``with joblib.parallel_config(backend="dask")``.
    verbose : int, default=0
        ``> 0``: print the objective, gradient norm and elapsed time at every
        L-BFGS iteration; ``> 2`` also joblib's progress messages.
    warm_start : bool, default=False
        Start from the weights of the previous fit (when their shapes match)
        instead of ``init``.
    random_state : int, RandomState instance or None, default=None
        Draws the image subsets of the ``incremental`` schedule; nothing else
        in the fit is random.
    sides : {1, 2, 4}, default=2
        Finite differences of the perturbation gradient mode.
    multiplier : float, default=1.0
        Step multiplier of the perturbation gradient mode, at least
        ``eps**(2/3)`` (about 3.7e-11; a smaller step rounds away).
    inference_max_iter : int, default=1000
        Iteration cap of inference run to ``tol``.
    lbfgs_tol : float, default=1e-6
        L-BFGS stops when the largest gradient entry is below this (scipy's
        ``gtol``).
    max_restarts : int, default=5
        How many times L-BFGS is restarted after an abnormal line search (a
        bad search direction, common with approximate gradients).
    incremental : int or None, default=None
        The paper's incremental procedure for large data sets: fit a random
        subset of ``incremental`` images with ``max_iter`` iterations, then
        repeatedly double the number of images and halve the number of
        iterations, each stage starting from the previous weights, until all
        images are used. None fits all images at once.
    callback : callable or None, default=None
        Called after every L-BFGS iteration of ``fit`` (the initialising fits
        included) as ``callback(progress)``, where ``progress`` is a
        :class:`~sklearn.utils.Bunch` with ``stage`` (``"independent"``,
        ``"surrogate_likelihood"`` for the initialising fits, ``"fit"`` or
        ``"fit[k images]"``), ``n_iter`` (iterations of this stage so far),
        ``objective``, ``unary_coef`` and ``pairwise_coef`` (copies of the
        current weights), ``n_restarts`` and ``elapsed`` (seconds since the
        start of ``fit``). If it returns a true value, the fit stops after that
        iteration and the model keeps its weights (remaining stages are
        skipped, no ConvergenceWarning): use it to save checkpoints of a long
        fit, stop on a time budget, or record a learning curve. Exceptions it
        raises propagate out of ``fit``.

    Attributes
    ----------
    unary_coef_ : ndarray of shape (n_states, n_node_features)
        ``F``.
    pairwise_coef_ : ndarray of shape (n_states, n_states, n_edge_features)
        ``G``; ``G[a, b, f]`` weighs feature ``f`` of edge (i, j) for
        ``x_i = a, x_j = b``.
    n_states_ : int
    classes_ : ndarray of shape (n_states,)
        ``arange(n_states_)``.
    n_node_features_, n_edge_features_ : int
    n_iter_ : int
        L-BFGS iterations of the final fit (over its restarts and
        ``incremental`` stages; not counting the initialising fits).
    n_restarts_ : int
        L-BFGS restarts of the final fit.
    loss_curve_ : list of float
        Objective after each L-BFGS iteration of the final fit (stages of
        ``incremental`` one after the other, each on its own subset).
    time_curve_ : list of float
        Seconds since the start of ``fit`` at each entry of ``loss_curve_``
        (initialising fits included in the clock), for objective-vs-time plots.
    fit_time_ : float
        Wall-clock seconds of ``fit`` (including the initialising fits).
    kernel_time_ : float
        Seconds spent inside ``loss_and_grad``, summed over workers.

    Notes
    -----
    ``X`` is a list of samples: ``(node_features (n, Fu), edges (E, 2),
    edge_features (E, Fe))`` triples or :class:`~sklearn_margcrf.CRFSample`
    objects (which may carry a grid and an image shape). ``y`` is a list of
    integer label arrays, one label per node ((n,), the sample's grid shape,
    or its image shape), -1 marking an unlabelled node.
    """

    _parameter_constraints: dict = {
        "loss": [StrOptions(set(LOSSES))],
        "inference": [StrOptions(set(INFERENCE_CHOICES))],
        "gradient_mode": [StrOptions(set(GRADIENT_MODES))],
        "n_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "rho": [None, Interval(Real, MIN_RHO, None, closed="left"), StrOptions(set(RHO_RULES))],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "reg": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "n_states": [None, Interval(Integral, 2, None, closed="left")],
        "init": [StrOptions({"independent", "zeros"})],
        "n_jobs": [None, Interval(Integral, None, -1, closed="right"), Interval(Integral, 1, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "random_state": ["random_state"],
        "sides": [Options(Integral, {1, 2, 4})],
        "multiplier": [Interval(Real, MIN_MULTIPLIER, None, closed="left")],
        "inference_max_iter": [Interval(Integral, 1, None, closed="left")],
        "lbfgs_tol": [Interval(Real, 0, None, closed="left")],
        "max_restarts": [Interval(Integral, 0, None, closed="left")],
        "incremental": [None, Interval(Integral, 1, None, closed="left")],
        "callback": [None, callable],
    }

    def __init__(
        self,
        *,
        loss="univariate_logistic",
        inference="trw",
        gradient_mode="truncated",
        n_iter=20,
        tol=1e-4,
        rho=None,
        alpha=15.0,
        reg=1e-3,
        max_iter=200,
        n_states=None,
        init="independent",
        n_jobs=None,
        verbose=0,
        warm_start=False,
        random_state=None,
        sides=2,
        multiplier=1.0,
        inference_max_iter=1000,
        lbfgs_tol=1e-6,
        max_restarts=5,
        incremental=None,
        callback=None,
    ):
        self.loss = loss
        self.inference = inference
        self.gradient_mode = gradient_mode
        self.n_iter = n_iter
        self.tol = tol
        self.rho = rho
        self.alpha = alpha
        self.reg = reg
        self.max_iter = max_iter
        self.n_states = n_states
        self.init = init
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.warm_start = warm_start
        self.random_state = random_state
        self.sides = sides
        self.multiplier = multiplier
        self.inference_max_iter = inference_max_iter
        self.lbfgs_tol = lbfgs_tol
        self.max_restarts = max_restarts
        self.incremental = incremental
        self.callback = callback

    # -- scikit-learn plumbing ------------------------------------------------

    def __getstate__(self):
        # a pickle records the package version, as scikit-learn's estimators
        # record scikit-learn's (sklearn.base.BaseEstimator.__getstate__)
        return dict(super().__getstate__(), _sklearn_margcrf_version=__version__)

    def __setstate__(self, state):
        state = dict(state)
        version = state.pop("_sklearn_margcrf_version", None)
        if version != __version__:
            warnings.warn(
                InconsistentVersionWarning(
                    estimator_name=type(self).__name__, current_version=__version__, original_version=version
                ),
                stacklevel=2,
            )
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags(multi_class=True, multi_label=False)
        tags.target_tags.required = True
        tags.target_tags.single_output = False  # one label per node: structured output
        tags.target_tags.multi_output = True
        tags.input_tags.two_d_array = False
        tags.input_tags.allow_nan = False
        tags.non_deterministic = False
        return tags

    # -- configuration ----------------------------------------------------------

    def _check_combination(self, loss, inference):
        """ValueError for a combination that does not apply, before any work."""
        if inference == "independent":
            check_combination(loss, "trw", "truncated")
            if loss == "clique_logistic":
                raise ValueError(
                    "loss='clique_logistic' does not apply to inference='independent': the independent "
                    "model has no edges, so there are no clique terms to fit"
                )
            return
        try:
            check_combination(loss, inference, self.gradient_mode)
        except ValueError as exc:
            raise ValueError(
                f"unsupported combination loss={loss!r}, inference={inference!r}, "
                f"gradient_mode={self.gradient_mode!r}: {exc}"
            ) from None

    def _config(self, loss, inference, n_states):
        return {
            "loss": loss,
            "inference": inference,
            "gradient_mode": self.gradient_mode,
            "n_iter": int(self.n_iter),
            "tol": float(self.tol),
            "max_iter": int(self.inference_max_iter),
            "rho": self.rho if inference == "trw" else None,
            "alpha": float(self.alpha),
            "sides": int(self.sides),
            "multiplier": float(self.multiplier),
            "n_states": n_states,
        }

    def _predict_config(self):
        inference = self.inference
        truncated = self.gradient_mode == "truncated" and self.loss not in INFERENCE_FREE_LOSSES
        return {
            "inference": inference,
            "n_iter": int(self.n_iter) if truncated and inference != "exact" else None,
            "tol": float(self.tol),
            "max_iter": int(self.inference_max_iter),
            "rho": self.rho if inference == "trw" else None,
        }

    def _stages(self, n_samples):
        """(image indices, L-BFGS iterations) of each stage of the fit.

        Without ``incremental``: all images, ``max_iter``. With it, the paper's
        incremental procedure (Stanford backgrounds experiment): a random
        subset of ``incremental`` images first, then the number of images is
        doubled and the number of iterations halved until all images are used.
        """
        if self.incremental is None or self.incremental >= n_samples:
            return [(list(range(n_samples)), int(self.max_iter))]
        order = check_random_state(self.random_state).permutation(n_samples)
        stages = []
        size, iterations = int(self.incremental), int(self.max_iter)
        while True:
            size = min(size, n_samples)
            stages.append((sorted(order[:size].tolist()), max(iterations, 1 if self.max_iter else 0)))
            if size == n_samples:
                return stages
            size *= 2
            iterations //= 2

    def _n_chunks(self, n_samples):
        return max(1, min(int(effective_n_jobs(self.n_jobs)), n_samples))

    def _log(self, message):
        if self.verbose > 0:
            print(f"[MarginalCRF] {message}", flush=True)

    # -- fitting ------------------------------------------------------------------

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Fit ``F`` and ``G`` by L-BFGS on the mean loss per labelled node.

        Parameters
        ----------
        X : list of samples
            ``(node_features, edges, edge_features)`` triples or ``CRFSample``.
        y : list of int arrays
            One label per node ((n,), grid or image shape), -1 = unlabelled.

        Returns
        -------
        self
        """
        start = time.perf_counter()
        self._check_combination(self.loss, self.inference)
        check_random_state(self.random_state)
        samples, n_node_features, n_edge_features = _check_X(X)
        labels, n_states = _check_y(y, samples, self.n_states)
        n_labelled = int(sum(np.count_nonzero(lab >= 0) for lab in labels))
        if n_labelled == 0:
            raise ValueError("y has no labelled node (every label is -1): nothing to learn from")

        shape_f = (n_states, n_node_features)
        shape_g = (n_states, n_states, n_edge_features)
        warm = (
            self.warm_start
            and hasattr(self, "unary_coef_")
            and self.unary_coef_.shape == shape_f
            and self.pairwise_coef_.shape == shape_g
        )
        if self.warm_start and hasattr(self, "unary_coef_") and not warm:
            warn_at_caller(
                "warm_start=True but the previous weights have shapes "
                f"{self.unary_coef_.shape}, {self.pairwise_coef_.shape} instead of {shape_f}, {shape_g}: "
                f"starting from init={self.init!r}",
                UserWarning,
            )

        stats = {"start": start, "kernel_time": 0.0, "warnings": {}, "stopped": False}
        if warm:
            unary_coef = self.unary_coef_.copy()
            pairwise_coef = self.pairwise_coef_.copy() if self.inference != "independent" else np.zeros(shape_g)
        else:
            unary_coef, pairwise_coef = np.zeros(shape_f), np.zeros(shape_g)

        fast_path = self.inference == "independent" and self.loss == "univariate_logistic"
        unpack = functools.partial(_unpack_weights, shape_f=shape_f, shape_g=shape_g)
        if not warm and self.init == "independent" and not fast_path:
            self._log("init: fitting the independent model (univariate logistic)")
            data = _LogisticData(samples, labels)
            w, _ = self._minimize(
                lambda w: data.loss_grad(w, shape_f, self.reg),
                unary_coef.ravel(), unpack, "independent", stats, int(self.max_iter),
            )
            unary_coef, _ = unpack(w)
            del data  # its stacked copy of the node features is no longer needed
        surrogate_start = (
            not warm
            and self.init == "independent"
            and self.loss == "smooth_classification"
            and self.inference != "independent"
        )

        info = {"n_iter": 0, "n_restarts": 0, "loss_curve": [], "time_curve": []}
        stages = self._stages(len(samples))
        for stage, (indices, stage_max_iter) in enumerate(stages):
            if stats["stopped"]:  # by the callback
                break
            last = stage == len(stages) - 1
            stage_samples = [samples[k] for k in indices]
            stage_labels = [labels[k] for k in indices]
            stage_labelled = int(sum(np.count_nonzero(lab >= 0) for lab in stage_labels))
            if stage_labelled == 0:
                continue
            name = "fit" if len(indices) == len(samples) else f"fit[{len(indices)} images]"
            if fast_path:
                data = _LogisticData(stage_samples, stage_labels)
                w, stage_info = self._minimize(
                    lambda w: data.loss_grad(w, shape_f, self.reg),
                    unary_coef.ravel(), unpack, name, stats, stage_max_iter, last,
                )
                unary_coef, _ = unpack(w)
            else:
                costs = [s.n_nodes + s.n_edges for s in stage_samples]
                groups = _balanced_chunks(costs, self._n_chunks(len(stage_samples)))
                with _ParallelMap(stage_samples, stage_labels, groups, self.n_jobs, self.verbose) as pmap:
                    if surrogate_start:
                        self._log("init: fitting surrogate likelihood")
                        config = self._config("surrogate_likelihood", self.inference, n_states)
                        (unary_coef, pairwise_coef), _ = self._fit_weights(
                            pmap, config, unary_coef, pairwise_coef, stage_labelled,
                            "surrogate_likelihood", stats, stage_max_iter,
                        )
                        surrogate_start = False
                        if stats["stopped"]:
                            break
                    config = self._config(self.loss, self.inference, n_states)
                    (unary_coef, pairwise_coef), stage_info = self._fit_weights(
                        pmap, config, unary_coef, pairwise_coef, stage_labelled, name, stats, stage_max_iter, last
                    )
            info["n_iter"] += stage_info["n_iter"]
            info["n_restarts"] += stage_info["n_restarts"]
            info["loss_curve"] += stage_info["loss_curve"]
            info["time_curve"] += stage_info["time_curve"]

        self.unary_coef_ = unary_coef
        self.pairwise_coef_ = pairwise_coef
        self.n_states_ = n_states
        self.classes_ = np.arange(n_states)
        self.n_node_features_ = n_node_features
        self.n_edge_features_ = n_edge_features
        self.n_iter_ = info["n_iter"]
        self.n_restarts_ = info["n_restarts"]
        self.loss_curve_ = info["loss_curve"]
        self.time_curve_ = info["time_curve"]
        self.kernel_time_ = stats["kernel_time"]
        _report_warnings(stats["warnings"], "during fit, in per-image loss_and_grad calls")
        self.fit_time_ = time.perf_counter() - start
        return self

    def _fit_weights(self, pmap, config, unary_coef, pairwise_coef, n_labelled, stage, stats, max_iter, warn=True):
        """Minimise the objective of ``config`` over (F, G) from the given start."""
        shape_f, shape_g = unary_coef.shape, pairwise_coef.shape
        independent = config["inference"] == "independent"
        reg = float(self.reg)
        unpack = functools.partial(_unpack_weights, shape_f=shape_f, shape_g=shape_g)

        def objective(w):
            F, G = unpack(w)
            results = pmap(_chunk_loss_grad, F, G, config)
            per_image = [None] * pmap.n_images
            for (batch, seconds, recorded), index in zip(results, pmap.indices):
                stats["kernel_time"] += seconds
                _merge_warnings(stats["warnings"], recorded)
                for k, item in zip(index, batch):
                    per_image[k] = item
            value = 0.0
            grad_f = np.zeros(shape_f)
            grad_g = np.zeros(shape_g)
            for v, gf, gg in per_image:  # fixed (image) order: n_jobs-invariant
                value += v
                grad_f += gf
                grad_g += gg
            grad = np.concatenate([grad_f.ravel(), grad_g.ravel()]) if not independent else grad_f.ravel()
            return _per_pixel_objective(value, grad, w, n_labelled, reg)

        w0 = np.concatenate([unary_coef.ravel(), pairwise_coef.ravel()]) if not independent else unary_coef.ravel()
        w, info = self._minimize(objective, w0, unpack, stage, stats, max_iter, warn)
        return unpack(w), info

    def _minimize(self, objective, w0, unpack, stage, stats, max_iter, warn=True):
        """L-BFGS-B with restarts after an abnormal line search; ``unpack(w)``
        gives the (F, G) of a weight vector for the user's ``callback``, which
        may stop the fit (``stats["stopped"]``)."""
        last = {"x": None, "f": np.nan, "g": None}
        curve = []
        times = []
        n_restarts = 0

        def fun(w):
            f, g = objective(w)
            last.update(x=w.copy(), f=f, g=g)
            return f, g

        def callback(intermediate_result):
            f = float(intermediate_result.fun)
            curve.append(f)
            times.append(time.perf_counter() - stats["start"])
            if self.verbose > 0:
                g = last["g"] if last["x"] is not None and np.array_equal(last["x"], intermediate_result.x) else None
                gnorm = float(np.linalg.norm(g)) if g is not None else float("nan")
                self._log(f"{stage} iter {len(curve):4d}  objective {f:.8g}  |grad| {gnorm:.3e}  time {times[-1]:.2f}s")
            if self.callback is not None:
                unary_coef, pairwise_coef = unpack(intermediate_result.x)
                progress = Bunch(
                    stage=stage, n_iter=len(curve), objective=f, unary_coef=unary_coef, pairwise_coef=pairwise_coef,
                    n_restarts=n_restarts, elapsed=times[-1],
                )
                if self.callback(progress):
                    raise _StopFit(np.array(intermediate_result.x))

        w = np.asarray(w0, dtype=np.float64).copy()
        n_iter = 0
        result = None
        while n_iter < max_iter:
            f_start = last["f"] if last["x"] is not None and np.array_equal(last["x"], w) else None
            try:
                # One BLAS thread: L-BFGS-B's small products gain nothing from
                # threads, and with several their rounding (1e-14) depended on
                # the process's history (e.g. an earlier threading-backend fit),
                # so the weights would not be reproducible bit for bit.
                with threadpool_limits(limits=1, user_api="blas"):
                    result = scipy.optimize.minimize(
                        fun, w, jac=True, method="L-BFGS-B", callback=callback,
                        options={"maxiter": max_iter - n_iter, "gtol": float(self.lbfgs_tol)},
                    )
            except _StopFit as stop:
                self._log(f"{stage}: stopped by the callback after {len(curve)} iterations")
                stats["stopped"] = True
                w, n_iter, result = stop.weights, len(curve), None
                break
            n_iter += int(result.nit)
            improved = f_start is None or (np.isfinite(result.fun) and result.fun < f_start)
            if np.all(np.isfinite(result.x)):
                w = result.x
            if result.status == 2 and n_iter < max_iter and n_restarts < self.max_restarts and improved and result.nit > 0:
                n_restarts += 1
                self._log(f"{stage}: L-BFGS stopped ({result.message}); restart {n_restarts}")
                continue
            break
        if warn and result is not None and result.status != 0:
            if n_iter >= max_iter:
                message = f"L-BFGS reached max_iter={max_iter} iterations ({stage}) without converging; increase max_iter"
            else:
                message = f"L-BFGS stopped early ({stage}): {result.message}"
            warn_at_caller(message, ConvergenceWarning)
        if not np.all(np.isfinite(w)):
            raise FloatingPointError(f"the {stage} weights became non-finite; try a larger reg or fewer n_iter")
        return w, {"n_iter": n_iter, "n_restarts": n_restarts, "loss_curve": curve, "time_curve": times}

    # -- prediction -----------------------------------------------------------------

    def _node_marginals(self, X):
        """Validated samples and their (n, K) unary marginals."""
        check_is_fitted(self)
        samples, _, _ = _check_X(X, self.n_node_features_, self.n_edge_features_)
        costs = [s.n_nodes + s.n_edges for s in samples]
        groups = _balanced_chunks(costs, self._n_chunks(len(samples)))
        marginals = [None] * len(samples)
        not_converged = 0
        recorded = {}
        with _ParallelMap(samples, None, groups, self.n_jobs, self.verbose) as pmap:
            results = pmap(_chunk_marginals, self.unary_coef_, self.pairwise_coef_, self._predict_config())
            for group, (batch, count, warned) in zip(pmap.indices, results):
                not_converged += count
                _merge_warnings(recorded, warned)
                for k, mu in zip(group, batch):
                    marginals[k] = mu
        _report_warnings(recorded, "during prediction, in per-image inference calls")
        if not_converged:
            warn_at_caller(
                f"inference did not reach tol={self.tol:g} within inference_max_iter={self.inference_max_iter} "
                f"iterations on {not_converged} of {len(samples)} samples; their marginals are not converged",
                ConvergenceWarning,
            )
        return samples, marginals

    def predict_proba(self, X):
        """Marginals of every sample: (n, K), (H, W, K) on a grid, or upsampled to
        the image size when the sample carries one.

        Returns
        -------
        list of ndarray
        """
        samples, marginals = self._node_marginals(X)
        return [marginals_to_image(mu, s.sample) for s, mu in zip(samples, marginals)]

    def predict(self, X):
        """Maximum posterior marginal labels, shaped like each sample.

        Returns
        -------
        list of int ndarray
            (n,), (H, W) or the image shape.
        """
        return [np.argmax(p, axis=-1).astype(np.int64) for p in self.predict_proba(X)]

    def score(self, X, y):
        """1 - Hamming error over the labelled nodes of all samples."""
        from .metrics import hamming_error_from_marginals

        samples, marginals = self._node_marginals(X)
        labels, _ = _check_y(y, samples, self.n_states_)
        return 1.0 - hamming_error_from_marginals(labels, marginals)


def _per_pixel_objective(value, grad, w, n_labelled, reg):
    """The fit's objective and its gradient from the summed loss and gradient
    of the images: the mean over the labelled pixels plus the ridge penalty
    ``reg * |w|^2``."""
    return value / n_labelled + reg * float(w @ w), grad / n_labelled + 2.0 * reg * w


class _LogisticData:
    """The labelled nodes of every image, stacked, for the independent model
    with the univariate logistic loss (multinomial logistic regression on the
    unary features, computed in-process)."""

    def __init__(self, samples, labels):
        observed = [lab >= 0 for lab in labels]
        counts = np.array([np.count_nonzero(o) for o in observed])
        stops = np.cumsum(counts)
        n_labelled = int(stops[-1])
        dtype = np.result_type(*(s.node_features.dtype for s in samples))
        self.features = np.empty((n_labelled, samples[0].node_features.shape[1]), dtype=dtype)
        self.targets = np.empty(n_labelled, dtype=np.int64)
        for s, lab, o, start, stop in zip(samples, labels, observed, stops - counts, stops):
            self.features[start:stop] = s.node_features[o]
            self.targets[start:stop] = lab[o]

    def loss_grad(self, w, shape_f, reg):
        value, grad = logistic_loss_and_gradient(self.features, self.targets, w.reshape(shape_f))
        return _per_pixel_objective(value, grad.ravel(), w, self.targets.shape[0], reg)
