"""Linear algebra: factorizations and solvers count what the textbook algorithm performs.
Direct algorithms are checked against naive loops that count their own operations; solvers
against the factorization plus substitution they are made of; iterative ones (QR, SVD,
eigen) against the nominal counts docs/conventions.md names."""

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter


def flops_of(fn, *args):
    with FlopCounter() as fc:
        fn(*args)
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}
    return fc


def counted(op: str, fc) -> int:
    return fc.by_operator()[op].flops


def naive_lu_ops(m: int, n: int) -> int:
    """Run Doolittle elimination on an m x n matrix of symbols, counting each operation."""
    ops = 0
    for k in range(min(m, n)):
        for _i in range(k + 1, m):
            ops += 1  # l = a[i][k] / a[k][k]
            for _j in range(k + 1, n):
                ops += 2  # a[i][j] -= l * a[k][j]
    return ops


def naive_cholesky_ops(n: int) -> int:
    ops = 0
    for j in range(n):
        ops += 2 * j + 1  # a[j][j] - sum of j squares, then a square root
        for _i in range(j + 1, n):
            ops += 2 * j + 1  # a[i][j] - sum of j products, then a divide
    return ops


def naive_substitution_ops(n: int, unit: bool) -> int:
    ops = 0
    for i in range(n):
        ops += 2 * i  # i multiply-subtracts
        ops += 0 if unit else 1  # the divide by the diagonal
    return ops


def spd(n, batch=()):
    a = torch.randn(*batch, n, n, dtype=torch.float64)
    return a @ a.transpose(-1, -2) + n * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("m,n", [(1, 1), (2, 2), (5, 5), (7, 4), (4, 7)])
def test_lu_counts_doolittle(m, n):
    a = torch.randn(2, m, n, dtype=torch.float64)
    fc = flops_of(torch.linalg.lu_factor, a) if m == n else flops_of(torch.linalg.lu, a)
    op = "aten.linalg_lu_factor_ex" if m == n else "aten.linalg_lu"
    assert counted(op, fc) == 2 * naive_lu_ops(m, n)


@pytest.mark.parametrize("n", [1, 2, 6])
def test_cholesky_counts_its_loop(n):
    fc = flops_of(torch.linalg.cholesky, spd(n, (3,)))
    assert counted("aten.linalg_cholesky_ex", fc) == 3 * naive_cholesky_ops(n)


@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solve_counts_substitution(unit):
    n, k = 5, 3
    lower = torch.linalg.cholesky(spd(n))
    b = torch.randn(n, k, dtype=torch.float64)
    fc = flops_of(lambda: torch.linalg.solve_triangular(lower, b, upper=False,
                                                        unitriangular=unit))
    assert counted("aten.linalg_solve_triangular", fc) == k * naive_substitution_ops(n, unit)


def test_solvers_are_their_factorization_plus_substitutions():
    n, k = 6, 4
    a, b = spd(n), torch.randn(n, k, dtype=torch.float64)
    lu = naive_lu_ops(n, n)
    substitutions = k * (naive_substitution_ops(n, True) + naive_substitution_ops(n, False))
    assert counted("aten._linalg_solve_ex", flops_of(torch.linalg.solve, a, b)) == \
        lu + substitutions
    factor = torch.linalg.lu_factor(a)
    assert counted("aten.linalg_lu_solve", flops_of(torch.linalg.lu_solve, *factor, b)) == \
        substitutions
    # inverse: solve A X = I, n right-hand sides
    assert counted("aten.linalg_inv_ex", flops_of(torch.linalg.inv, a)) == lu + n * (
        naive_substitution_ops(n, True) + naive_substitution_ops(n, False))
    # determinant: LU then the product of the diagonal
    assert counted("aten._linalg_det", flops_of(torch.linalg.det, a)) == lu + n - 1
    chol = torch.linalg.cholesky(a)
    assert counted("aten.cholesky_solve", flops_of(torch.cholesky_solve, b, chol)) == \
        2 * k * naive_substitution_ops(n, False)


@pytest.mark.parametrize("m,n", [(8, 5), (5, 8)])
def test_iterative_decompositions_take_the_nominal_counts(m, n):
    """QR (LAWN 41 leading terms), SVD (R-SVD), eigen (symmetric / Hessenberg QR)."""
    a = torch.randn(m, n, dtype=torch.float64)
    big, small = max(m, n), min(m, n)
    qr = 2 * big * small ** 2 - 2 * small ** 3 / 3
    assert counted("aten.linalg_qr", flops_of(torch.linalg.qr, a, "r")) == int(qr)
    # svdvals asks for U and V too where a backward may need them, which a dispatch mode
    # makes torch assume: the values-only call is priced when it is made
    values_only = flops_of(torch.ops.aten._linalg_svd, a, False, False)
    assert counted("aten._linalg_svd", values_only) == \
        int(4 * big * small ** 2 - 4 * small ** 3 / 3)
    assert counted("aten._linalg_svd", flops_of(torch.linalg.svd, a, False)) == \
        6 * big * small ** 2 + 20 * small ** 3
    s = spd(n)
    assert counted("aten._linalg_eigh", flops_of(torch.linalg.eigh, s)) == 9 * n ** 3
    values_only = flops_of(torch.ops.aten._linalg_eigh, s, "L", False)  # likewise
    assert counted("aten._linalg_eigh", values_only) == int(4 * n ** 3 / 3)
    assert counted("aten.linalg_eig", flops_of(torch.linalg.eig, s)) == 25 * n ** 3


def test_complex_matrices_count_real_flops():
    a = spd(4).to(torch.complex128)
    real = counted("aten.linalg_lu_factor_ex", flops_of(torch.linalg.lu_factor, spd(4)))
    assert counted("aten.linalg_lu_factor_ex", flops_of(torch.linalg.lu_factor, a)) == 4 * real


def test_bilinear_counts_its_contraction_space():
    """nn.Bilinear: out[n, o] = sum_ij x1[n, i] W[o, i, j] x2[n, j] + b[o]: one MAC per
    (n, o, i, j), counted by enumerating that space."""
    layer = nn.Bilinear(3, 4, 2)
    x1, x2 = torch.randn(5, 3), torch.randn(5, 4)
    with FlopCounter() as fc:
        layer(x1, x2)
    points = sum(1 for _n in range(5) for _o in range(2) for _i in range(3) for _j in range(4))
    assert fc.by_operator()["aten._trilinear"].macs == points
    assert fc.unsupported_ops() == {}


def test_everything_linalg_offers_is_priced_or_listed():
    """Every torch.linalg entry point runs under the counter; all but the data-dependent
    matrix_exp are priced."""
    a, r = spd(5), torch.randn(7, 4, dtype=torch.float64)
    with FlopCounter() as fc:
        torch.linalg.pinv(r), torch.linalg.lstsq(r, torch.randn(7, 2, dtype=torch.float64))
        torch.linalg.slogdet(a), torch.linalg.matrix_rank(a), torch.linalg.cond(a)
        torch.linalg.householder_product(*torch.geqrf(r)), torch.linalg.ldl_factor(a)
        torch.linalg.qr(r, "complete"), torch.linalg.eigvals(a)
        torch.linalg.matrix_exp(a)
    assert fc.unsupported_ops() == {"aten.linalg_matrix_exp": 1}
