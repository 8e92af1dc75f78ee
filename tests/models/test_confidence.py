"""The statistics of study summaries without SciPy: the regularized incomplete beta function, Student's
t distribution and its quantiles against published values, and means with their spread."""
import math

import numpy as np
import pytest

from tinygrad_caps.models.analysis.confidence import (mean_and_spread, regularized_incomplete_beta, student_t_cdf,
                                                      student_t_quantile)

# t_{0.975, df}: the two-sided 95% critical values of Student's t (any statistics table, e.g. NIST's
# Engineering Statistics Handbook 1.3.6.7.2), and t_{0.995, df} for a few.
T975 = {1: 12.7062047362, 2: 4.30265272975, 3: 3.18244630528, 4: 2.77644510520, 5: 2.57058183564,
        6: 2.44691185114, 7: 2.36462425159, 8: 2.30600413520, 9: 2.26215716280, 10: 2.22813885196,
        15: 2.13144954556, 20: 2.08596344727, 25: 2.05953855275, 30: 2.04227245630, 60: 2.00029782106,
        120: 1.97993040505, 1000: 1.96233908082}
T995 = {1: 63.6567411629, 4: 4.60409487142, 10: 3.16927267262}


@pytest.mark.parametrize("df", sorted(T975))
def test_the_975_quantile_matches_the_tables(df):
    assert student_t_quantile(0.975, df) == pytest.approx(T975[df], rel=1e-9)


@pytest.mark.parametrize("df", sorted(T995))
def test_the_995_quantile_matches_the_tables(df):
    assert student_t_quantile(0.995, df) == pytest.approx(T995[df], rel=1e-9)


def test_large_df_tends_to_the_normal_and_the_quantile_is_odd():
    assert student_t_quantile(0.975, 1e7) == pytest.approx(1.959963984540054, rel=1e-6)
    assert student_t_quantile(0.025, 7) == -student_t_quantile(0.975, 7)
    assert student_t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        student_t_quantile(1.0, 3)


def test_cdf_in_closed_form_for_one_and_two_degrees_of_freedom():
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)  # Cauchy
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


def test_incomplete_beta_edges_and_symmetry():
    assert regularized_incomplete_beta(2.0, 3.0, 0.0) == 0.0 and regularized_incomplete_beta(2.0, 3.0, 1.0) == 1.0
    for x in (0.1, 0.4, 0.9):
        assert regularized_incomplete_beta(2.5, 1.5, x) == pytest.approx(1 - regularized_incomplete_beta(1.5, 2.5, 1 - x))
        assert regularized_incomplete_beta(1.0, 1.0, x) == pytest.approx(x)  # the uniform distribution


def test_mean_and_spread_by_hand():
    values = [0.80, 0.82, 0.87]
    result = mean_and_spread(values)
    assert result["n"] == 3 and result["mean"] == pytest.approx(np.mean(values))
    assert result["std"] == pytest.approx(np.std(values, ddof=1))
    half = T975[2] * np.std(values, ddof=1) / math.sqrt(3)
    assert result["ci95"] == pytest.approx([np.mean(values) - half, np.mean(values) + half])
    assert mean_and_spread([0.5]) == {"n": 1, "mean": 0.5, "std": None, "ci95": None}
    assert mean_and_spread([]) == {"n": 0, "mean": None, "std": None, "ci95": None}
    assert mean_and_spread([None, 0.25, 0.75])["n"] == 2


def test_equal_values_have_exactly_no_spread():
    for values in ([0.1] * 3, [0.9123] * 5):
        spread = mean_and_spread(values)
        assert spread["std"] == 0.0 and spread["ci95"] == [values[0], values[0]] and spread["mean"] == values[0]


def test_welch_and_paired_differences_of_two_rows():
    from tinygrad_caps.models.analysis.confidence import paired_difference, welch_difference

    a = {"n": 3, "mean": 1.0, "std": 1.0, "seeds": [0, 1, 2], "values": [0.0, 1.0, 2.0]}
    b = {"n": 3, "mean": 2.0, "std": 1.0, "seeds": [0, 1, 2], "values": [1.0, 2.0, 4.0]}
    welch = welch_difference(a, b)  # df = 4, half = t(0.975, 4) sqrt(2 / 3)
    half = 2.7764451051977987 * (2 / 3) ** 0.5
    assert welch["difference"] == 1.0 and welch["ci95"] == pytest.approx([1 - half, 1 + half], abs=1e-9)
    assert not welch["exceeds_spread"] and welch_difference(dict(a, n=1), b) is None
    paired = paired_difference(a, b)  # differences 1, 1, 2
    assert paired["n"] == 3 and paired["mean"] == pytest.approx(4 / 3, abs=1e-12)
    assert paired_difference(a, dict(b, seeds=[0, 7, 8])) is None  # one common seed


def test_path_and_inner_shares_of_a_layers_iterations():
    from tinygrad_caps.models.analysis.routing_statistics import inner_share, path_shares

    rows = [{"grad_norm_sum": 1.0, "grad_norm_agreement": 1.0}, {"grad_norm_sum": 2.0, "grad_norm_agreement": None}]
    assert path_shares(rows) == [(0.25, 0.25), (0.5, None)]
    assert inner_share(rows) == 0.5 and inner_share(rows[1:]) is None
    assert inner_share([{"grad_norm_sum": None, "grad_norm_agreement": 0.0}, rows[1]]) is None


def rows_of(values_a, values_b):
    """Two summary rows (``mean_and_spread`` of each list, with seeds) as ``welch_difference`` reads them."""
    rows = []
    for values in (values_a, values_b):
        rows.append(dict(mean_and_spread(values), seeds=list(range(len(values))), values=list(values)))
    return rows


def test_welch_interval_of_unequal_sizes_and_spreads_by_hand():
    from tinygrad_caps.models.analysis.confidence import welch_difference

    # a: 3 values, s^2 = 9 (s^2 / n = 3); b: 9 values, s^2 = 18 (s^2 / n = 2). Welch-Satterthwaite:
    # df = (3 + 2)^2 / (3^2 / 2 + 2^2 / 8) = 25 / 5 = 5, where Student's pooled n_a + n_b - 2 is 10.
    a, b = rows_of([-2.5, 0.5, 3.5], [-4.5, -4.5, 7.5, 7.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    assert (a["n"], a["std"] ** 2, b["n"], b["std"] ** 2) == pytest.approx((3, 9.0, 9, 18.0), abs=1e-12)
    welch = welch_difference(a, b)
    half = T975[5] * math.sqrt(5.0)  # t(0.975, 5) sqrt(3 + 2)
    assert welch["difference"] == pytest.approx(1.0, abs=1e-12)
    assert welch["ci95"] == pytest.approx([1.0 - half, 1.0 + half], rel=1e-9, abs=1e-12)
    pooled_half = T975[10] * math.sqrt(5.0)  # what n_a + n_b - 2 degrees of freedom would give
    assert welch["ci95"][1] - welch["ci95"][0] > 2 * pooled_half + 0.5
    assert not welch["exceeds_spread"]
    # the interval is symmetric in the rows: b - a is -(a - b)
    assert welch_difference(b, a)["ci95"] == pytest.approx([-1.0 - half, -1.0 + half], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("sizes, spreads", [((2, 7), (0.01, 0.2)), ((3, 10), (0.3, 0.02)), ((4, 5), (1.0, 3.0)),
                                            ((12, 3), (0.05, 0.05))])
def test_welch_interval_equals_scipys_welch_satterthwaite(sizes, spreads):
    stats = pytest.importorskip("scipy.stats", reason="SciPy is not installed (the README's set-up does not "
                                "install it); the hand-computed Welch case above runs without it")
    from tinygrad_caps.models.analysis.confidence import welch_difference

    rng = np.random.default_rng(sum(sizes))
    values_a = list(0.5 + spreads[0] * rng.standard_normal(sizes[0]))
    values_b = list(0.6 + spreads[1] * rng.standard_normal(sizes[1]))
    a, b = rows_of(values_a, values_b)
    expected = stats.ttest_ind(values_b, values_a, equal_var=False).confidence_interval(0.95)
    welch = welch_difference(a, b)
    assert welch["ci95"] == pytest.approx([expected.low, expected.high], rel=1e-9, abs=1e-12)
    va, vb = a["std"] ** 2 / a["n"], b["std"] ** 2 / b["n"]  # the degrees of freedom SciPy's interval used
    df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))
    assert abs(df - (a["n"] + b["n"] - 2)) > 0.5  # a case where Student's pooled df would differ
