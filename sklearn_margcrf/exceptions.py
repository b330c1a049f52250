"""Exceptions and warnings of sklearn_margcrf."""

__all__ = ["BackpropDivergenceError", "BackpropFallbackWarning"]


class BackpropDivergenceError(RuntimeError):
    """Stack-free back-propagation at the converged messages did not converge.

    The reverse sweeps of Eaton and Ghahramani's scheme converge at the rate
    of the forward iteration near an attractive fixed point; when inference
    stopped at a loose threshold away from one, they can grow without bound.
    """


class BackpropFallbackWarning(RuntimeWarning):
    """``gradient_mode="backprop"`` differentiated the stored forward iterations instead.

    Raised as a warning when the stack-free reverse sweeps diverged: the
    gradient was then computed by back TRW / back mean field through exactly
    the iterations inference ran (the exact gradient of the reported loss).
    """
