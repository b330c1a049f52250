"""Where a fit's cores go on Dask: wall, thread CPU and preemptions of each image computation.

Each image gradient of a fit (``CRFObjective.image_loss_gradient``, in the
fitting process for ``n_jobs=1``, in the workers on Dask: patched there by
``Client.run``) is timed by the wall clock, by ``time.thread_time`` and by
``getrusage`` of its thread. The thread's CPU over its wall time is the
share of the time it ran; the rest it waited: preempted by other threads
and processes on the same cores (involuntary context switches,
"preemptions"), or for a lock such as the GIL (voluntary ones, "waits").
On a machine with as many cores as compute threads, that is the cost of
whatever else runs there: for a Dask ``LocalCluster``, the scheduler, the
nannies, and the workers' event loops, monitors and statistical profiler
(see docs/scaling.rst). The same images with ``n_jobs=1`` are the reference.

Run on a quiet machine::

    python benchmarks/bench_dask_cpu.py --horses 16 [--backend dask-processes] [--dask-profiler off] [--dask-quiet]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import bench_fit  # noqa: E402


def _patch():
    """Time each image computation of this process (idempotent); clears the records."""
    import resource
    import time

    from sklearn_margcrf import _objective

    cls = _objective.CRFObjective
    if getattr(cls, "_timed_records", None) is not None:
        cls._timed_records.clear()
        return
    untimed = cls.image_loss_gradient
    records = []

    def timed(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        before = resource.getrusage(resource.RUSAGE_THREAD)
        result = untimed(self, *args, **kwargs)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        records.append((time.perf_counter() - wall, time.thread_time() - cpu, after.ru_utime - before.ru_utime,
                        after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt,
                        after.ru_nivcsw - before.ru_nivcsw, after.ru_nvcsw - before.ru_nvcsw))
        return result

    cls.image_loss_gradient = timed
    cls._timed_records = records


def _collect():
    """The records of this process since the last call."""
    from sklearn_margcrf import _objective

    records = list(_objective.CRFObjective._timed_records)
    _objective.CRFObjective._timed_records.clear()
    return records


def _report(name, records):
    a = np.array(records)
    wall, cpu = a[:, 0].sum(), a[:, 1].sum()
    print(f"{name:<24} images {len(a):4d}  wall {wall:6.2f} s  thread CPU {cpu:6.2f} s  CPU / wall {cpu / wall:5.3f}  "
          f"user {a[:, 2].sum():6.2f} s  system {a[:, 3].sum():5.2f} s  page faults {a[:, 4].sum():7.0f}  "
          f"preemptions {a[:, 5].sum():6.0f}  waits {a[:, 6].sum():6.0f}", flush=True)
    return cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_fit.add_fit_arguments(parser, horses=16, lbfgs_iter=8)
    parser.add_argument("--backend", default="dask-processes", choices=bench_fit.BACKENDS)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of n_jobs=1, then 2 workers")
    args = parser.parse_args(argv)
    if args.backend in ("loky", "multiprocessing"):
        parser.error("the workers of joblib's process backends cannot be patched from here; use threading or Dask")
    X, y = bench_fit.load_horses(args.data, args.horses, args.scale)
    print(f"{args.horses} horse images at scale {args.scale:g}, TRW n_iter={args.n_iter}, {args.lbfgs_iter} L-BFGS "
          f"iterations per fit; {args.backend}, Dask profiler {args.dask_profiler}"
          f"{', DASK_QUIET' if args.dask_quiet else ''}", flush=True)
    _patch()
    for _ in range(args.rounds):
        bench_fit.fit(X, y, 1, 1, args.n_iter)  # warm-up
        _collect()
        bench_fit.fit(X, y, 1, args.lbfgs_iter, args.n_iter)
        alone = _report("n_jobs=1", _collect())
        with bench_fit.backend(args.backend, args.dask_profiler == "on", args.dask_quiet):
            client = None
            if args.backend.startswith("dask"):
                from distributed import get_client

                client = get_client()
                client.run(_patch)

            def collect():
                return _collect() if client is None else [r for rs in client.run(_collect).values() for r in rs]

            bench_fit.fit(X, y, 2, 1, args.n_iter)  # warm-up: workers started, compiled
            collect()
            bench_fit.fit(X, y, 2, args.lbfgs_iter, args.n_iter)
            cpu = _report(f"n_jobs=2 {args.backend}", collect())
            print(f"{'':<24} thread CPU against n_jobs=1: {cpu / alone:5.3f}", flush=True)


if __name__ == "__main__":
    main()
