"""The paper's ``backnorm`` operator (Sec. "Truncated Fitting", Appendix C).

If ``c = b / sum(b)`` is a normalised product and ``g = dL/dc``, then
``nu = backnorm(g, c) = c * (g - g . c)`` gives ``dL/da = nu / a`` for every
factor ``a`` of ``b`` (and ``dL/df = nu`` when ``a = exp(f)``). Back TRW and
back mean field both call this one function.
"""

from numba import njit


@njit(cache=True, nogil=True, inline="always")
def backnorm(g, c, out):
    """Write ``c * (g - g . c)`` into ``out`` (1-D arrays of equal length >= 1).

    The dot product starts from its first term, not from ``0.0``, so that it
    stays in the arrays' precision (float32 or float64)."""
    dot = g[0] * c[0]
    for k in range(1, c.shape[0]):
        dot += g[k] * c[k]
    for k in range(c.shape[0]):
        out[k] = c[k] * (g[k] - dot)


@njit(cache=True, nogil=True, inline="always")
def backnorm_ratio_of_scaled(b, inv_c, out):
    """Write ``backnorm(g, c) / c = g - g . c`` into ``out`` from the scaled
    adjoint ``b = g * c`` and ``inv_c = 1 / c``: ``b / c - sum(b)``. Back TRW
    keeps ``g * c``, which stays within the range of its precision where
    ``g`` itself would not (entries ``c`` near the message floor), and needs
    ``nu / c`` rather than ``nu``, whose ``c * (...) / c`` could also leave it."""
    total = b[0]
    for k in range(1, b.shape[0]):
        total += b[k]
    for k in range(b.shape[0]):
        out[k] = b[k] * inv_c[k] - total
