"""The README's main command, in a tiny configuration."""

import pytest

pytest.importorskip("skimage", reason="the demo's built-in problem uses scikit-image")
pytest.importorskip("matplotlib", reason="the demo saves a matplotlib figure")


def test_demo_main_writes_the_figure(tmp_path, capsys):
    try:
        from sklearn_margcrf.estimator import MarginalCRF  # noqa: F401
    except ImportError as exc:  # the estimator is written in another issue
        pytest.skip(f"sklearn_margcrf.estimator.MarginalCRF is not importable yet: {exc}")
    from sklearn_margcrf.demo import main

    out = tmp_path / "figures" / "demo.png"
    results = main(
        ["--out", str(out), "--n-train", "2", "--n-test", "1", "--shape", "12x16",
         "--n-iter", "3", "--max-iter", "3"]
    )
    assert out.is_file() and out.stat().st_size > 0
    assert results["figure"] == str(out.resolve())
    printed = capsys.readouterr().out
    assert str(out.resolve()) in printed
    assert len(results["errors"]) == 3
    for name in ("independent", "surrogate likelihood", "univariate logistic"):
        assert name in printed
        (train, test), = [v for k, v in results["errors"].items() if k.startswith(name)]
        assert 0.0 <= train <= 1.0 and 0.0 <= test <= 1.0


def test_demo_default_figure_goes_to_the_current_directory(tmp_path, monkeypatch):
    from sklearn_margcrf.demo import DEFAULT_FIGURE, _figure_path

    monkeypatch.chdir(tmp_path)
    assert _figure_path(None) == (tmp_path / DEFAULT_FIGURE).resolve()


def test_demo_rejects_a_bad_shape():
    from sklearn_margcrf.demo import main

    with pytest.raises(SystemExit):
        main(["--shape", "12by16"])
