#!/usr/bin/env python3
"""The polynomial of the host's AVX-512 GELU (backends/host/elementwise.c).

GELU(x) = x Phi(x), and with a = |x|, Phi(-a) = exp(-a^2 / 2) F(a) / 2 where
F(a) = erfc(a / sqrt 2) exp(a^2 / 2) varies slowly (1 at 0, about
sqrt(2 / pi) / a for large a). The host computes F as a polynomial in
s = t - 0.375, t = 1 / (1 + 0.3 a), over a in [0, 14.5] (beyond 14.4,
exp(-a^2 / 2) is below the smallest float). This fits it: least squares
on Chebyshev nodes in t, reweighted towards the largest relative error
(Lawson's iteration, which tends to the minimax fit), each coefficient
rounded to float in turn and the higher ones fitted again around it.
Prints the coefficients, lowest degree first, and the relative error of
the float coefficients over a dense sweep in units of 2^-23.

numpy only; the reference is math.erfc in double.
"""
import math

import numpy as np

Q, S0, DEGREE, A_MAX = 0.3, 0.375, 10, 14.5


def f_of(a):
    return math.erfc(a / math.sqrt(2.0)) * math.exp(a * a / 2.0)


def fit(s, want, fixed, iterations=100):
    """The coefficients past `fixed`, minimising the largest relative error."""
    basis = np.vander(s, DEGREE + 1, increasing=True)
    rest = want - basis[:, : len(fixed)] @ np.array(fixed) if fixed else want.copy()
    weight = np.ones(len(s))
    for _ in range(iterations):
        scale = np.sqrt(weight) / want
        coef = np.linalg.lstsq(basis[:, len(fixed):] * scale[:, None], rest * scale, rcond=None)[0]
        err = (basis[:, len(fixed):] @ coef - rest) / want
        weight = weight * np.abs(err) + 1e-300
        weight /= weight.sum()
    return list(fixed) + list(coef)


def main():
    t_min = 1.0 / (1.0 + Q * A_MAX)
    nodes = np.cos(np.pi * (np.arange(4000) + 0.5) / 4000)
    t = t_min + (nodes + 1.0) * (1.0 - t_min) / 2.0
    want = np.array([f_of(a) for a in (1.0 / t - 1.0) / Q])
    fixed = []
    for i in range(DEGREE + 1):
        fixed.append(float(np.float32(fit(t - S0, want, fixed)[i])))
    a = np.linspace(0.0, A_MAX, 40001)
    exact = np.array([f_of(x) for x in a])
    got = np.polyval(np.array(fixed)[::-1], 1.0 / (1.0 + Q * a) - S0)
    print(", ".join("%.9ef" % c for c in fixed))
    print("relative error %.2f x 2^-23" % (np.max(np.abs(got - exact) / exact) / 2.0**-23))


if __name__ == "__main__":
    main()
