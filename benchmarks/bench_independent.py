"""The independent model's loss and gradient: one fused numba pass against the
same computation with (n, K) numpy temporaries.

``MarginalCRF(inference="independent")`` and every ``init="independent"``
evaluate the multinomial logistic loss of the stacked unary features many
times (one per L-BFGS step). The fused pass
(``sklearn_margcrf._linear.logistic_loss_and_gradient``) reads the features
once and allocates nothing per row; the reference (scores, logsumexp, softmax
residual, then the weight gradient) reads them twice and allocates several
(n, K) float64 arrays per call, whose first touch costs page faults (on some
virtual machines far more than the arithmetic). Prints the minimum wall and
CPU time of each over ``--repeat`` calls and their largest difference.

Run on a quiet machine::

    python benchmarks/bench_independent.py [--rows 3000000] [--features 100] [--states 2] [--repeat 5]
"""

import argparse

from _common import best_time

import numpy as np
from scipy.special import logsumexp

from sklearn_margcrf._linear import feature_scores, logistic_loss_and_gradient, weight_gradient


def with_temporaries(features, targets, coef):
    """The loss and gradient computed with (n, K) numpy arrays."""
    scores = feature_scores(features, coef)
    log_z = logsumexp(scores, axis=1)
    rows = np.arange(scores.shape[0])
    value = float(np.sum(log_z - scores[rows, targets]))
    residual = np.exp(scores - log_z[:, None])
    residual[rows, targets] -= 1.0
    return value, weight_gradient(residual, features)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--states", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    features = rng.normal(size=(args.rows, args.features)).astype(np.float32)
    targets = rng.integers(0, args.states, size=args.rows)
    coef = 0.1 * rng.normal(size=(args.states, args.features))
    print(f"{args.rows} rows x {args.features} float32 features, K = {args.states}, min of {args.repeat} calls")
    results = {}
    for name, fn in (("fused pass", logistic_loss_and_gradient), ("numpy temporaries", with_temporaries)):
        wall, cpu = best_time(lambda fn=fn: results.__setitem__(name, fn(features, targets, coef)), args.repeat)
        print(f"  {name:<18} wall {wall:.3f} s  cpu {cpu:.3f} s")
    (v1, g1), (v2, g2) = results.values()
    print(f"  relative difference: loss {abs(v1 - v2) / abs(v2):.1e}, gradient {np.max(np.abs(g1 - g2)) / np.max(np.abs(g2)):.1e}")


if __name__ == "__main__":
    main()
