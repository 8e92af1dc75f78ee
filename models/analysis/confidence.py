"""Means over seeds with their spread: the sample standard deviation and the Student-t confidence
interval of the mean, computed without SciPy (the regularized incomplete beta function by its
continued fraction, Numerical Recipes' ``betacf``, inverted by bisection).
"""
from __future__ import annotations

import math


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz), converging for x < (a + 1) / (a + b + 2)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_incomplete_beta: x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"student_t_cdf: df must be positive, got {df}")
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for 0 < p < 1 (bisection on the CDF to double precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def mean_and_spread(values, level: float = 0.95) -> dict:
    """{"n", "mean", "std", "ci95"} of ``values`` (numbers; None entries are left out): the mean, the
    sample standard deviation (ddof 1) and the Student-t ``level`` interval of the mean
    [mean - t s / sqrt(n), mean + t s / sqrt(n)] with t the (1 + level) / 2 quantile at n - 1
    degrees of freedom; ``std`` and ``ci95`` are None for fewer than two values, ``mean`` for none."""
    kept = [float(v) for v in values if v is not None]
    n = len(kept)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    mean = math.fsum(kept) / n
    if n < 2:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    if min(kept) == max(kept):  # equal values: exactly no spread (the rounded mean would leave 1e-17)
        return {"n": n, "mean": kept[0], "std": 0.0, "ci95": [kept[0], kept[0]]}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in kept) / (n - 1))
    half = student_t_quantile((1.0 + level) / 2.0, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def welch_difference(a: dict, b: dict) -> dict | None:
    """mean(b) - mean(a) with its Welch 95% interval, for two rows of two or more values each."""
    if a["n"] < 2 or b["n"] < 2:
        return None
    va, vb = a["std"] ** 2 / a["n"], b["std"] ** 2 / b["n"]
    difference = b["mean"] - a["mean"]
    if va + vb == 0:
        return {"difference": difference, "ci95": [difference, difference], "exceeds_spread": difference != 0}
    df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))
    half = student_t_quantile(0.975, df) * math.sqrt(va + vb)
    low, high = difference - half, difference + half
    return {"difference": difference, "ci95": [low, high], "exceeds_spread": low > 0 or high < 0}


def paired_difference(a: dict, b: dict) -> dict | None:
    """b - a seed by seed over the seeds both rows have (two or more): {"n", "mean", "std", "ci95",
    "exceeds_spread"}."""
    values_a = dict(zip(a["seeds"], a["values"]))
    differences = [value - values_a[seed] for seed, value in zip(b["seeds"], b["values"]) if seed in values_a]
    if len(differences) < 2:
        return None
    spread = mean_and_spread(differences)
    low, high = spread["ci95"]
    return dict(spread, exceeds_spread=low > 0 or high < 0)
