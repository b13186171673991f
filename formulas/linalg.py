"""Dense linear algebra: factorizations, solvers, decompositions, and ``_trilinear``.

These are algorithm counts: the flops (multiplies, adds, divides, square roots) the standard
LAPACK algorithm performs, for real matrices; a complex one counts
``ELEMENT_COSTS["complex_mac"]`` (4) real flops per flop. Leading dims are a batch. Exact
counts (the sums of the textbook loops, checked in the tests against naive loops that count
their operations) where the algorithm is direct: LU, Cholesky, triangular and LU solves,
determinants. Iterative ones (eigenvalues, SVD) have no exact count: they take the standard
nominal counts (Golub & Van Loan, Matrix Computations, 4th ed., Table 8.6.1 and 7.5), as do
Householder QR's (LAWN 41 leading terms). ``macs`` stay 0: MFU's contraction figure does
not include factorizations, as no peer's does. ``docs/conventions.md`` lists them.
"""

from __future__ import annotations

from fractions import Fraction
from math import prod

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import is_complex
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _sum_k(k: int) -> int:
    return k * (k - 1) // 2  # sum of 0..k-1


def _sum_k2(k: int) -> int:
    return (k - 1) * k * (2 * k - 1) // 6  # sum of squares of 0..k-1


def lu_flops(m: int, n: int) -> int:
    """Doolittle LU of an m x n matrix (partial pivoting only swaps): at step k, one divide
    per row below the pivot and a multiply-subtract per entry of the trailing block:
    sum over k < min(m, n) of (m-1-k) + 2 (m-1-k)(n-1-k)."""
    steps = min(m, n)
    a, b = m - 1, n - 1
    rows = steps * a - _sum_k(steps)  # sum of (a - k)
    # sum of (a - k)(b - k) = steps*a*b - (a + b) * sum k + sum k^2
    block = steps * a * b - (a + b) * _sum_k(steps) + _sum_k2(steps)
    return rows + 2 * block


def cholesky_flops(n: int) -> int:
    """Cholesky: column j costs a square root and j multiply-subtracts for its diagonal, a
    divide and j multiply-subtracts for each entry below: sum of (2j + 1)(n - j)."""
    return (2 * n ** 3 + 3 * n ** 2 + n) // 6


def triangular_solve_flops(n: int, rhs: int, unit: bool = False) -> int:
    """Forward or back substitution: per right-hand side, row i takes i multiply-subtracts
    and (unless the diagonal is unit) one divide: n^2 (n^2 - n with a unit diagonal)."""
    return rhs * (n * n - (n if unit else 0))


def lu_solve_flops(n: int, rhs: int) -> int:
    """Solve with an LU factorization: the unit-lower then the upper substitution."""
    return triangular_solve_flops(n, rhs, unit=True) + triangular_solve_flops(n, rhs)


def qr_flops(m: int, n: int) -> int:
    """Householder QR (geqrf) of m x n: 2 m n^2 - 2 n^3 / 3 for m >= n (LAWN 41)."""
    if m < n:
        m, n = n, m
    return int(2 * m * n * n - Fraction(2 * n ** 3, 3))


def form_q_flops(m: int, n: int, k: int) -> int:
    """Forming m x n Q from k reflectors (orgqr): 4 m n k - 2 (m + n) k^2 + 4 k^3 / 3."""
    return int(4 * m * n * k - 2 * (m + n) * k * k + Fraction(4 * k ** 3, 3))


def svd_flops(m: int, n: int, compute_uv: bool, full: bool) -> int:
    """Golub & Van Loan's counts for the R-SVD (m >= n): singular values only
    4 m n^2 - 4 n^3 / 3; with thin U and V 6 m n^2 + 20 n^3; with full U 4 m^2 n + 22 n^3."""
    if m < n:
        m, n = n, m
    if not compute_uv:
        return int(4 * m * n * n - Fraction(4 * n ** 3, 3))
    if full:
        return 4 * m * m * n + 22 * n ** 3
    return 6 * m * n * n + 20 * n ** 3


def _matrix(shape) -> tuple[int, int, int]:
    """(batch, rows, cols) of a [..., m, n] shape."""
    return prod(shape[:-2]), shape[-2], shape[-1]


def _complex(count: int, dtypes) -> int:
    if dtypes is not None and is_complex(dtypes):
        return count * ELEMENT_COSTS["complex_mac"]
    return count


def _rhs(b) -> int:
    return 1 if len(b) == 1 else b[-1]


@register_formula([aten.linalg_lu_factor_ex, aten.linalg_lu])
def lu_factor(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, m, n = _matrix(a)
    return Cost(_complex(batch * lu_flops(m, n), dtypes))


@register_formula(aten.linalg_lu_solve)
def lu_solve(lu, pivots, b, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, n, _ = _matrix(lu)
    return Cost(_complex(batch * lu_solve_flops(n, _rhs(b)), dtypes))


@register_formula([aten._linalg_solve_ex, aten.linalg_solve_ex])
def solve(a, b, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # LU, then the two substitutions for each right-hand side
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * (lu_flops(n, n) + lu_solve_flops(n, _rhs(b))), dtypes))


@register_formula(aten.linalg_inv_ex)
def inv(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # torch inverts by solving A X = I: LU, then n right-hand sides
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * (lu_flops(n, n) + lu_solve_flops(n, n)), dtypes))


@register_formula(aten.linalg_cholesky_ex)
def cholesky(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * cholesky_flops(n), dtypes))


@register_formula(aten.cholesky_solve)
def cholesky_solve(b, l, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, n, _ = _matrix(l)
    return Cost(_complex(batch * 2 * triangular_solve_flops(n, _rhs(b)), dtypes))


@register_formula(aten.cholesky_inverse)
def cholesky_inverse(l, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # A^-1 = L^-T L^-1: both substitutions for each of the n columns of I
    batch, n, _ = _matrix(l)
    return Cost(_complex(batch * 2 * triangular_solve_flops(n, n), dtypes))


@register_formula(aten.linalg_solve_triangular)
def solve_triangular(a, b, *, out_shape, dtypes=None, upper=False, left=True,
                     unitriangular=False, **kwargs) -> Cost:
    batch, n, _ = _matrix(a)
    rhs = _rhs(b) if left else b[-2]
    return Cost(_complex(batch * triangular_solve_flops(n, rhs, bool(unitriangular)), dtypes))


@register_formula(aten.triangular_solve)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False, *, out_shape,
                     dtypes=None, **kwargs) -> Cost:
    batch, n, _ = _matrix(a)
    unit = kwargs.get("unitriangular", unitriangular)
    return Cost(_complex(batch * triangular_solve_flops(n, _rhs(b), bool(unit)), dtypes))


@register_formula(aten._linalg_det)
def det(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # LU, then the product of the diagonal (n - 1 multiplies)
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * (lu_flops(n, n) + max(n - 1, 0)), dtypes))


@register_formula(aten._linalg_slogdet)
def slogdet(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # LU, then a log of each diagonal entry and their sum
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * (lu_flops(n, n) + n + max(n - 1, 0)), dtypes))


@register_formula(aten.geqrf)
def geqrf(a, *, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, m, n = _matrix(a)
    return Cost(_complex(batch * qr_flops(m, n), dtypes))


@register_formula(aten.linalg_qr)
def qr(a, mode="reduced", *, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, m, n = _matrix(a)
    mode = kwargs.get("mode", mode)
    k = min(m, n)
    count = qr_flops(m, n)
    if mode == "reduced":
        count += form_q_flops(m, k, k)
    elif mode == "complete":
        count += form_q_flops(m, m, k)
    return Cost(_complex(batch * count, dtypes))


@register_formula([aten.linalg_householder_product, aten.orgqr])
def householder_product(a, tau, *, out_shape, dtypes=None, **kwargs) -> Cost:
    batch, m, n = _matrix(a)
    return Cost(_complex(batch * form_q_flops(m, n, tau[-1]), dtypes))


@register_formula(aten._linalg_svd)
def svd(a, full_matrices=False, compute_uv=True, *args, out_shape, dtypes=None,
        **kwargs) -> Cost:
    batch, m, n = _matrix(a)
    full = kwargs.get("full_matrices", full_matrices)
    uv = kwargs.get("compute_uv", compute_uv)
    return Cost(_complex(batch * svd_flops(m, n, uv, full), dtypes))


@register_formula(aten.linalg_pinv)
def pinv(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # thin SVD, 1/s for each singular value, V diag(1/s) (n k) and the product with U^T
    batch, m, n = _matrix(a)
    k = min(m, n)
    count = svd_flops(m, n, True, False) + k + n * k + 2 * n * k * m
    return Cost(_complex(batch * count, dtypes))


@register_formula(aten._linalg_eigh)
def eigh(a, uplo="L", compute_v=True, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # symmetric QR: eigenvalues 4 n^3 / 3 (tridiagonalisation), with vectors 9 n^3 (GVL)
    batch, n, _ = _matrix(a)
    vectors = kwargs.get("compute_v", compute_v)
    count = 9 * n ** 3 if vectors else int(Fraction(4 * n ** 3, 3))
    return Cost(_complex(batch * count, dtypes))


@register_formula(aten.linalg_eig)
def eig(a, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # Hessenberg QR with the Schur vectors and eigenvectors: 25 n^3 (GVL)
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * 25 * n ** 3, dtypes))


@register_formula(aten.linalg_lstsq)
def lstsq(a, b, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # QR of A, Q^T B (4 m n - 2 n^2 per column of B), then R's back substitution
    batch, m, n = _matrix(a)
    rhs = _rhs(b)
    k = min(m, n)
    count = qr_flops(m, n) + rhs * (4 * m * k - 2 * k * k) + triangular_solve_flops(k, rhs)
    return Cost(_complex(batch * count, dtypes))


@register_formula(aten.linalg_ldl_factor_ex)
def ldl_factor(a, *args, out_shape, dtypes=None, **kwargs) -> Cost:
    # Bunch-Kaufman: n^3 / 3, as Cholesky's leading term
    batch, n, _ = _matrix(a)
    return Cost(_complex(batch * cholesky_flops(n), dtypes))


@register_formula(aten._trilinear)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1, *, out_shape,
              dtypes=None, **kwargs) -> Cost:
    # nn.Bilinear: the three operands, each with size-1 dims inserted at its expand dims,
    # broadcast to one index space; one multiply-accumulate per point of it, the product of
    # the three factors one more multiply: 3 flops per point
    def expanded(shape, dims):
        shape = list(shape)
        for d in sorted(dims):
            shape.insert(d, 1)
        return shape

    space = torch.broadcast_shapes(tuple(expanded(i1, expand1)), tuple(expanded(i2, expand2)),
                                   tuple(expanded(i3, expand3)))
    points = prod(space)
    return Cost(_complex(3 * points, dtypes), points)
