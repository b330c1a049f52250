"""Smoke test of examples/chain_misspecification.py on a tiny configuration."""

import importlib

import numpy as np
import pytest

pytest.importorskip("matplotlib")

@pytest.fixture(scope="module")
def script():
    return importlib.import_module("chain_misspecification")  # examples/ is on sys.path (conftest.py)


def test_gibbs_sampler_matches_exact_marginals(script):
    rng = np.random.default_rng(1)
    model = script.random_ladder(5, rng)
    x, y = script.gibbs_sample(model, 4000, rng, chains=400, burn_in=100, thin=5)
    assert x.shape == y.shape == (4000, 5)
    exact = script.exact_joint_marginals(model)
    empirical = np.stack([x.mean(0), y.mean(0)])
    assert np.max(np.abs(empirical - exact)) < 0.04  # ~ 5 standard errors


def test_true_conditional_is_well_specified(script):
    # at shift 0 the true conditional p(y | x) is a chain the fitted family contains
    rng = np.random.default_rng(2)
    model = script.random_ladder(4, rng)
    x = rng.integers(0, 2, (3, 4))
    p1 = script.true_conditional_marginals(model, x)
    edges, unary, pairwise = script.ladder_graph(model)
    for b in range(3):  # condition the ladder on x by brute force over y
        ys = np.array(np.meshgrid(*[[0, 1]] * 4, indexing="ij")).reshape(4, -1).T
        logp = []
        for yy in ys:
            states = np.concatenate([x[b], yy])
            logp.append(unary[np.arange(8), states].sum() + pairwise[np.arange(len(edges)), states[edges[:, 0]], states[edges[:, 1]]].sum())
        p = np.exp(np.array(logp) - max(logp))
        p /= p.sum()
        np.testing.assert_allclose(p1[b], p @ ys, atol=1e-10)


def test_chain_misspecification_tiny(script, tmp_path, capsys):
    result = script.main(
        ["--n-nodes", "6", "--n-distributions", "1", "--train-sizes", "400", "--shifts", "0", "3",
         "--n-test", "400", "--chains", "100", "--burn-in", "100", "--thin", "5", "--max-iter", "100",
         "--n-jobs", "1", "--out", str(tmp_path)]
    )
    errors = result["errors"]  # (distributions, sizes, shifts, losses)
    assert errors.shape == (1, 1, 2, 3)
    assert np.all(np.isfinite(errors)) and np.all((errors >= 0) & (errors <= 1))
    bayes = result["bayes"][0]
    assert 0 <= bayes <= 1
    # well specified with enough data: every loss is close to the Bayes error
    assert np.all(np.abs(errors[0, 0, 0] - bayes) < 0.03)
    # no fitted model beats the Bayes rule by more than test noise
    assert np.all(errors > bayes - 0.03)
    assert max(result["sampler_gap"]) < 0.1
    for name in ("chain_misspecification_errors.png", "chain_misspecification_marginals.png", "chain_misspecification.txt"):
        assert (tmp_path / name).stat().st_size > 0
    out = capsys.readouterr().out
    assert "likelihood" in out and "Our results" in out
