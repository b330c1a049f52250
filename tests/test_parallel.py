"""The parallel map over images (sklearn_margcrf._parallel) and the objective
it evaluates (sklearn_margcrf._objective): batches handed to joblib once per
fit and removed after it, a clear error when they do not fit, per-image
diagnostics returned as counts."""

import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from contextlib import contextmanager

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf._parallel import ImageBatches, balanced_groups, pack, rebalanced_groups
from sklearn_margcrf._workspace import release, scratch, workspace
from sklearn_margcrf.estimator import _check_X, _check_y


def _files(folder):
    """(path, inode, modification time, size) of every file under ``folder``."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(root, name))
            out.append((os.path.join(root, name), stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return sorted(out)


@pytest.mark.parametrize("backend", ["loky", "threading", "multiprocessing"])
def test_batches_are_dumped_once_and_nothing_is_left_behind(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(tmp_path))
    # batches of 2 images of 200 x 200 nodes: above joblib's 1 MB threshold,
    # so that joblib would dump a copy of any array it were given by value
    X, y = make_structured_data(n_samples=4, shape=(200, 200))
    seen = []
    with warnings.catch_warnings(), joblib.parallel_config(backend=backend):
        warnings.simplefilter("ignore", ConvergenceWarning)
        MarginalCRF(n_iter=2, max_iter=3, n_jobs=2, callback=lambda p: seen.append(_files(tmp_path))).fit(X, y)
    # two batches of four files (features, edges, labels), the same ones at
    # every iteration: written once, and joblib memory-mapped nothing of its
    # own (they went by reference)
    names = sorted(os.path.basename(path) for path, _, _, _ in seen[0])
    assert len(seen) > 2 and names == [f"batch{c}.{name}" for c in (0, 1)
                                       for name in ("edge_features", "edges", "labels", "node_features")]
    assert all(size > 2**20 for path, _, _, size in seen[0] if not path.endswith(".labels"))
    assert all(files == seen[0] for files in seen)
    assert list(tmp_path.iterdir()) == []


def test_results_come_back_in_image_order():
    shapes = [(3, 4), (6, 6), (2, 3), (5, 6), (4, 4)]
    data = [make_structured_data(n_samples=1, shape=shape) for shape in shapes]
    samples, _, _ = _check_X([X[0] for X, _ in data])
    labels, _ = _check_y([y[0] for _, y in data], samples)

    def sizes(batch):
        return [node_features.shape[0] for node_features, _, _, _ in batch.images()]

    for backend in ["threading", "loky"]:
        with joblib.parallel_config(backend=backend), ImageBatches(samples, labels, n_jobs=2) as batches:
            assert len(batches.groups) == 2
            assert batches.map(sizes) == [h * w for h, w in shapes]


def _sleep_by_first_feature(batch):
    """(image number, thread) of each image of ``batch``; image 0 takes 20 times as long as the others."""
    out = []
    for node_features, _, _, _ in batch.images():
        number = int(node_features[0, 0])
        time.sleep(0.2 if number == 0 else 0.05)
        out.append((number, threading.get_ident()))
    return out


@contextmanager
def _one_worker_of_two_threads():
    """joblib's Dask backend on a cluster of one worker with two threads (in this process)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster:
        with distributed.Client(cluster), joblib.parallel_config(backend="dask"):
            yield


@pytest.mark.parametrize("backend", ["threading", "dask-threads"])
def test_the_next_map_balances_the_workers_by_the_seconds_of_each_image(backend):
    # four images of one size: a first map gives each worker two of them,
    # although image 0 takes 20 times as long; the next map gives image 0 a
    # worker of its own and the other three to the other worker. On a
    # cluster, so do the threads of one worker that holds both batches,
    # without moving images between them.
    X, y = make_structured_data(n_samples=4, shape=(4, 4))
    for number, sample in enumerate(X):
        sample.node_features[0, 0] = number
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    config = joblib.parallel_config(backend="threading") if backend == "threading" else _one_worker_of_two_threads()
    with config, ImageBatches(samples, labels, n_jobs=2) as batches:
        groups = [list(group) for group in batches.groups]
        first = batches.map(_sleep_by_first_feature)
        second = batches.map(_sleep_by_first_feature)
        assert batches.groups == groups
    assert [number for number, _ in first] == [number for number, _ in second] == [0, 1, 2, 3]

    def sharing_a_thread_with_0(results):
        return sorted(number for number, thread in results[1:] if thread == results[0][1])

    assert len(sharing_a_thread_with_0(first)) == 1  # by size, two images per worker
    assert sharing_a_thread_with_0(second) == []
    assert len({thread for _, thread in second[1:]}) == 1


def _count_with_starts(batch, image_starts):
    """Per image: (image number, where it started: None cold), ending at
    100 x its number at its first map and one more at each later map; image
    0 takes 4 times as long as the others."""
    out = []
    for b, (node_features, _, _, _) in enumerate(batch.images()):
        number = int(node_features[0, 0])
        time.sleep(0.2 if number == 0 else 0.05)
        start = image_starts.start(b)
        started = None if start is None else float(start[0])
        image_starts.keep(b, [100.0 * number if started is None else started + 1])
        out.append((number, started))
    return out


def test_on_a_cluster_images_move_between_batches_to_balance_the_workers():
    distributed = pytest.importorskip("distributed")
    X, y = make_structured_data(n_samples=4, shape=(4, 4))
    for number, sample in enumerate(X):
        sample.node_features[0, 0] = number
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        with distributed.Client(cluster), joblib.parallel_config(backend="dask"):
            with ImageBatches(samples, labels, n_jobs=2) as batches, batches.warm_starts([1] * 4, np.float64) as starts:
                groups = [sorted(group) for group in batches.groups]
                maps, pending = [], []
                for _ in range(4):
                    maps.append(batches.map(_count_with_starts, starts=starts))
                    pending.append([sorted(group) for group in batches.groups])
                maps.append(batches.map(_count_with_starts, starts=starts))
                moved = [sorted(group) for group in batches.groups]
                maps.append(batches.map(_count_with_starts, starts=starts))
                after = [sorted(group) for group in batches.groups]
    assert sorted(map(len, groups)) == [2, 2]  # by size
    # a move is decided on three maps past the first (which finds moved
    # images cold), and made at the next map: the fifth
    assert pending == [groups] * 4
    assert sorted(moved) == [[0], [1, 2, 3]] and after == moved  # balanced: no more moves
    # results in image order, and each image started where it ended, wherever it moved
    assert maps == [[(k, None) for k in range(4)]] + [[(k, 100.0 * k + i) for k in range(4)] for i in range(5)]


def test_on_a_cluster_a_worker_s_threads_share_its_batches_and_each_image_starts_where_it_ended():
    # one worker holds both batches: from the second map on its two tasks
    # split them by the images' seconds (image 0 alone), each task with
    # parts of both batches, and every image still starts from its own end
    X, y = make_structured_data(n_samples=4, shape=(4, 4))
    for number, sample in enumerate(X):
        sample.node_features[0, 0] = number
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    with _one_worker_of_two_threads():
        with ImageBatches(samples, labels, n_jobs=2) as batches, batches.warm_starts([1] * 4, np.float64) as starts:
            groups = [list(group) for group in batches.groups]
            maps = [batches.map(_count_with_starts_and_thread, starts=starts) for _ in range(4)]
            assert batches.groups == groups  # nothing moved
    assert sorted(map(len, groups)) == [2, 2]  # by size

    def sharing_a_thread_with_0(results):
        return sorted(number for (number, _), thread in results[1:] if thread == results[0][1])

    assert len(sharing_a_thread_with_0(maps[0])) == 1
    assert [sharing_a_thread_with_0(m) for m in maps[1:]] == [[]] * 3
    assert [[count for count, _ in m] for m in maps] == (
        [[(k, None) for k in range(4)]] + [[(k, 100.0 * k + i) for k in range(4)] for i in range(3)])


def _count_with_starts_and_thread(batch, image_starts):
    """:func:`_count_with_starts`, each image's result with the thread that ran it."""
    return [(count, threading.get_ident()) for count in _count_with_starts(batch, image_starts)]


def _one_per_image(batch):
    """A result per image of ``batch`` (where the map runs is what the test looks at)."""
    return [None] * batch.n_images


def test_on_a_cluster_each_map_runs_where_its_batches_are():
    # The scheduler takes tasks of a name with many tasks alive for root
    # tasks and sends them to any free worker, which then fetches the batch
    # from the other; kept alive here, eight tasks of the map's name make
    # every map's tasks look so.
    distributed = pytest.importorskip("distributed")
    X, y = make_structured_data(n_samples=4, shape=(4, 4))
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client, joblib.parallel_config(backend="dask"):
            crowd = [client.submit(len, [k], key=f"_call_images-crowd-{k}") for k in range(8)]
            client.gather(crowd)
            with ImageBatches(samples, labels, n_jobs=2) as batches:
                ran = [batches.map(_one_per_image) for _ in range(24)]
                fetched = client.run(lambda dask_worker: [key for transfer in dask_worker.transfer_incoming_log
                                                          for key in transfer["keys"]])
    # no batch travelled between workers (only images that moved may)
    assert [key for keys in fetched.values() for key in keys if not key.startswith("_take-")] == []
    assert all(len(r) == 4 for r in ran)
    del crowd


def _scratch_address(batch):
    """Per image: the address of 800 kB of scratch taken in a workspace."""
    out = []
    for _ in batch.images():
        with workspace():
            out.append(scratch(100_000, np.float64).ctypes.data)
    return out


@pytest.mark.parametrize("n_jobs, backend", [(1, "loky"), (2, "threading")])
def test_maps_in_this_process_keep_their_scratch_from_map_to_map_and_free_it_at_the_end(n_jobs, backend):
    # one batch mapped here, or threads: the scratch of a map serves the next
    # one (no fresh pages to fault in), and goes when the map is closed
    X, y = make_structured_data(n_samples=2, shape=(4, 4))
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    release()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with joblib.parallel_config(backend=backend), ImageBatches(samples, labels, n_jobs=n_jobs) as batches:
            first = batches.map(_scratch_address)
            held = tracemalloc.get_traced_memory()[0] - base
            second = batches.map(_scratch_address)
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held > 800_000
    if n_jobs == 1:
        assert second == first  # the images of a batch share one buffer, map after map
    assert left < 100_000


def test_process_workers_keep_their_scratch_until_a_full_collection():
    # kept from one task to the next; freed when the worker collects garbage
    # (as loky does before it judges a worker's size, see _call_images)
    X, y = make_structured_data(n_samples=2, shape=(4, 4))
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    with joblib.parallel_config(backend="loky"), ImageBatches(samples, labels, n_jobs=2) as batches:
        for _ in range(2):  # a fresh worker's first task is followed by loky's first collection
            batches.map(_scratch_address)
        kept = joblib.Parallel(n_jobs=2)(joblib.delayed(_pool_bytes)(0.2) for _ in range(4))
        collected = joblib.Parallel(n_jobs=2)(joblib.delayed(_pool_bytes)(0.2, True) for _ in range(4))
    assert max(kept) > 0
    assert collected == [0] * 4


def _pool_bytes(pause, collect=False):
    from sklearn_margcrf import _workspace

    time.sleep(pause)  # every worker gets a task
    if collect:
        gc.collect()
    pool = getattr(_workspace._local, "pool", None)
    return 0 if pool is None else sum(b.nbytes for b in pool.free)


def test_balanced_groups_even_the_loads_where_longest_first_does_not():
    # longest processing time first puts 3 | 3 then 2, 2 on the lighter
    # side: 7 against 6; a swap of a 3 for a 2 cannot help, but the best
    # split is 6 | 6
    assert balanced_groups([3.0, 3.0, 2.0, 2.0, 2.0], 2) == [[2, 3, 4], [0, 1]]
    # small random instances: the costliest load is never above
    # longest-first's; no single image can move from the costliest group to
    # the cheapest with gain (so, with two groups, the costliest is within
    # half that group's smallest cost of the best split, found by brute force)
    rng = np.random.default_rng(3)
    for n, n_groups in [(5, 2), (8, 2), (11, 2), (9, 3), (12, 4)]:
        for _ in range(20):
            costs = rng.lognormal(0, 0.7, n)
            groups = balanced_groups(list(costs), n_groups)
            assert sorted(k for g in groups for k in g) == list(range(n))
            assert all(g == sorted(g) for g in groups)
            loads = np.array([costs[g].sum() for g in groups])
            lpt = np.zeros(n_groups)  # longest processing time first, as it was
            for k in sorted(range(n), key=lambda k: -costs[k]):
                lpt[int(np.argmin(lpt))] += costs[k]
            assert loads.max() <= lpt.max() + 1e-12
            smallest = costs[groups[int(np.argmax(loads))]].min()
            assert loads.max() - loads.min() <= smallest + 1e-12
            if n_groups == 2:
                best = min(max(costs[[k for k in range(n) if m >> k & 1]].sum(),
                               costs[[k for k in range(n) if not m >> k & 1]].sum()) for m in range(1 << n))
                assert loads.max() <= best + smallest / 2 + 1e-12
    # more groups than images, and equal costs
    assert balanced_groups([1.0, 2.0], 5) == [[1], [0]]
    assert [len(g) for g in balanced_groups([1.0] * 9, 3)] == [3, 3, 3]


def test_rebalanced_groups_move_few_images_and_only_for_a_real_gain():
    # loads 3 and 1: one image of cost 1 moves, the first of the costliest group
    assert rebalanced_groups([[0, 1, 2], [3]], [1.0] * 4) == [[1, 2], [3, 0]]
    # the image whose move brings the totals closest: image 1 (cost 2) to even 4 against 0
    assert rebalanced_groups([[0, 1, 2], [3]], [1.0, 2.0, 1.0, 0.0]) == [[0, 2], [3, 1]]
    # loads 5 and 3.5: no single image can move with gain, a swap can
    # (3 for 2.5: 4.5 against 4; as good as 2 for 1, found first)
    assert rebalanced_groups([[0, 1], [2, 3]], [3.0, 2.0, 2.5, 1.0]) == [[1, 2], [3, 0]]
    # no move lowers the costliest total by 2%
    assert rebalanced_groups([[0], [1]], [1.0, 0.99]) is None
    assert rebalanced_groups([[0, 1], [2]], [1.0, 0.02, 1.0]) is None


_FULL_FOLDER_SCRIPT = """
import resource, signal, sys, warnings
import joblib
sys.path.insert(0, {tests!r})
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF

X, y = make_structured_data(n_samples=2, shape=(30, 30))
warnings.simplefilter("ignore")
MarginalCRF(n_iter=2, max_iter=1).fit(X, y)  # kernels compiled or loaded from numba's cache first
# files may grow to 16 kB only: the batches (30 x 30 x 4 features each) do not fit
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    with joblib.parallel_config(backend="threading"):
        MarginalCRF(n_iter=2, max_iter=1, n_jobs=2).fit(X, y)
except OSError as exc:
    print("OSError:", exc)
"""


def test_a_full_temporary_folder_is_a_clear_error(tmp_path):
    script = _FULL_FOLDER_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JOBLIB_TEMP_FOLDER=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "OSError: " in out.stdout and "no room for the image batches in" in out.stdout, out.stdout
    assert "JOBLIB_TEMP_FOLDER" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_diagnostics_come_back_as_counts_without_warnings():
    X, y = make_structured_data(n_samples=3)
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    estimator = MarginalCRF(gradient_mode="backprop", inference_max_iter=2, tol=1e-12)
    objective = estimator._objective("univariate_logistic", "trw", (2, 3), (2, 2, 2))
    w = np.random.default_rng(0).normal(size=objective.pack(np.zeros((2, 3)), np.zeros((2, 2, 2))).size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is warned: it is all in the counts
        with ImageBatches(samples, labels) as batches:
            _, _, diagnostics, _ = objective.loss_gradient(w, batches, n_labelled=1, reg=0.0)
    assert diagnostics.not_converged == 3
    assert diagnostics.floored == diagnostics.fallback == 0


def test_packing_in_memory_keeps_each_image_as_it_is():
    X, _ = make_structured_data(n_samples=2)
    X32 = [(s.node_features.astype(np.float32), s.edges, s.edge_features.astype(np.float32)) for s in X]
    X32.append((X32[0][0], np.zeros((0, 2), np.int64), None))  # its edge features: a float64 (0, 2) placeholder
    samples, _, _ = _check_X(X32)
    batch = pack(samples, None, [0, 1, 2])
    # one batch in this process: the images' own arrays, not copies (nor
    # promoted to float64 by the edgeless image's placeholder)
    for (node_features, edges, edge_features, labels), sample in zip(batch.images(), samples):
        assert node_features.dtype == np.float32 and np.shares_memory(node_features, sample.node_features)
        assert edges.dtype == np.int64 and edges.shape == (sample.n_edges, 2) and labels is None
        if sample.n_edges:
            assert edge_features.dtype == np.float32 and np.shares_memory(edge_features, sample.edge_features)


@pytest.mark.parametrize("backend", ["loky", "threading"])
def test_memory_mapped_features_go_to_the_workers_uncopied(backend, tmp_path, monkeypatch):
    batch_folder = tmp_path / "batches"
    batch_folder.mkdir()
    monkeypatch.setenv("JOBLIB_TEMP_FOLDER", str(batch_folder))
    X, y = make_structured_data(n_samples=4, shape=(60, 60))
    mapped = []
    for k, sample in enumerate(X):
        np.save(tmp_path / f"node{k}.npy", sample.node_features)
        np.save(tmp_path / f"edge{k}.npy", sample.edge_features)
        mapped.append((np.load(tmp_path / f"node{k}.npy", mmap_mode="r"), sample.edges,
                       np.load(tmp_path / f"edge{k}.npy", mmap_mode="r")))
    seen = []
    model = MarginalCRF(n_iter=2, max_iter=3, n_jobs=2, callback=lambda p: seen.append(_files(batch_folder)))
    with warnings.catch_warnings(), joblib.parallel_config(backend=backend):
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(mapped, [labels.ravel() for labels in y])
    # only the arrays in memory (edges, labels) were written; the features went by reference
    names = sorted(os.path.basename(path) for path, _, _, _ in seen[0])
    assert names == [f"batch{c}.{name}" for c in (0, 1) for name in ("edges", "labels")]
    with warnings.catch_warnings(), joblib.parallel_config(backend=backend):
        warnings.simplefilter("ignore", ConvergenceWarning)
        in_memory = clone(model).set_params(callback=None).fit(X, y)
    np.testing.assert_array_equal(model.unary_coef_, in_memory.unary_coef_)
    np.testing.assert_array_equal(model.pairwise_coef_, in_memory.pairwise_coef_)
    assert list(batch_folder.iterdir()) == []


_KILLED_FIT_SCRIPT = """
import sys, time, warnings
import joblib
sys.path.insert(0, {tests!r})
from estimator_checks import make_structured_data
from sklearn_margcrf import MarginalCRF

X, y = make_structured_data(n_samples=2, shape=(20, 20))
warnings.simplefilter("ignore")


def wait_to_be_killed(progress):
    print("fitting", flush=True)
    time.sleep(600)


with joblib.parallel_config(backend="threading"):
    MarginalCRF(n_iter=2, max_iter=3, n_jobs=2, callback=wait_to_be_killed).fit(X, y)
"""


def test_the_batches_of_a_killed_fit_are_removed(tmp_path):
    # by joblib's resource tracker, which outlives the process it tracks
    script = _KILLED_FIT_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JOBLIB_TEMP_FOLDER=str(tmp_path))
    fit = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, env=env)
    try:
        assert fit.stdout.readline().strip() == "fitting"
        assert len(_files(tmp_path)) == 8  # two batches of four arrays
    finally:
        fit.kill()
        fit.wait()
    for _ in range(100):
        if not list(tmp_path.iterdir()):
            break
        time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []


def test_a_batch_reports_the_bytes_of_its_images():
    # what a cluster's scheduler and memory manager go by (dask.sizeof falls
    # back on sys.getsizeof)
    X, y = make_structured_data(n_samples=3, shape=(6, 7))
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    batch = pack(samples, labels, [0, 2])
    images = sum(a.nbytes for k in (0, 2) for a in (samples[k].node_features, samples[k].edge_features))
    images += sum(np.asarray(samples[k].edges).size * 8 + np.size(labels[k]) * 8 for k in (0, 2))
    assert images <= sys.getsizeof(batch) <= images + 1024
    unlabelled = pack(samples, None, [0, 2])
    assert sys.getsizeof(unlabelled) < sys.getsizeof(batch)
    sizeof = pytest.importorskip("dask.sizeof").sizeof
    assert sizeof(batch) == sys.getsizeof(batch)
