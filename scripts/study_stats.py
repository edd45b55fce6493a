"""Statistics of the convergence studies (scripts/convergence.py, scripts/table1.py), with the
Python standard library only (no SciPy here): Student's t p-values, Welch's and the paired
t-test, the power of the paired t-test and of the equivalence test (TOST), and Holm's step-down
adjustment.
"""
import math
import statistics


def _betacf(a, b, x):
    """Continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df (real, > 0) degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch(xs, ys):
    """Welch's t (mean(xs) - mean(ys)), its Welch-Satterthwaite df and two-sided p.
    None when either sample has fewer than two values or both variances are zero."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    vx, vy = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    if vx + vy == 0.0:
        return None
    t = (statistics.fmean(xs) - statistics.fmean(ys)) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx * vx / (len(xs) - 1) + vy * vy / (len(ys) - 1))
    return t, df, t_two_sided_p(t, df)


def paired(xs, ys):
    """Paired t-test of xs - ys (equal length, matched by seed: the same seed gives the same
    initial weights and data order in every configuration). (mean, sd, t, df, p) or None."""
    if len(xs) != len(ys):
        return None
    return paired_diffs([x - y for x, y in zip(xs, ys)])


def paired_diffs(d):
    """The paired t-test of differences D (one per seed): (mean, sd, t, df, p), or None with
    fewer than two differences or all of them equal."""
    if len(d) < 2:
        return None
    sd = statistics.stdev(d)
    if sd == 0.0:
        return None
    t = statistics.fmean(d) / (sd / math.sqrt(len(d)))
    return statistics.fmean(d), sd, t, len(d) - 1, t_two_sided_p(t, len(d) - 1)


# distribution of sqrt(V), V ~ chi2(df) the scaled sample variance (the same as integrating over
# V's chi-square density, without the singularity at 0 for df = 1).

def phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def simpson(f, a, b, n=2000):
    h = (b - a) / n
    s = f(a) + f(b) + sum((4 if i % 2 else 2) * f(a + i * h) for i in range(1, n))
    return s * h / 3.0


def chi_pdf(u, df):
    """Density of sqrt(V), V ~ chi2(df)."""
    if u <= 0.0:
        return math.sqrt(2.0 / math.pi) if df == 1 else 0.0
    return math.exp((df - 1) * math.log(u) - u * u / 2 - (df / 2 - 1) * math.log(2) - math.lgamma(df / 2))


def over_chi(g, df):
    """E[g(sqrt(V / df))], V ~ chi2(df)."""
    return simpson(lambda u: chi_pdf(u, df) * g(u / math.sqrt(df)), 0.0, math.sqrt(df) + 12.0)


def bisect(below, lo, hi, steps=100):
    """The x in [lo, hi] where the monotone predicate below(x) turns from True to False."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if below(mid) else (lo, mid)
    return (lo + hi) / 2


def chi2_quantile(q, df):
    """x with P(chi2(df) <= x) = q, by bisection on the integrated chi density."""
    cdf = lambda x: simpson(lambda u: chi_pdf(u, df), 0.0, math.sqrt(x), 1000)
    return bisect(lambda x: cdf(x) < q, 0.0, df + 20.0 * math.sqrt(2.0 * df) + 20.0, 80)


def t_crit(alpha, df):
    """c with P(|T| >= c) = alpha for Student's t (bisection on t_two_sided_p)."""
    hi = 1.0
    while t_two_sided_p(hi, df) > alpha:
        hi *= 2.0
    return bisect(lambda t: t_two_sided_p(t, df) > alpha, 0.0, hi, 200)


def power_paired(delta, sigma, n, alpha):
    """Power of the two-sided paired (one-sample) t-test at level alpha with n pairs when the
    mean difference is delta and its sd sigma: P(|T'| > c), T' = (Z + ncp) / sqrt(V / df)."""
    if n < 2 or not sigma > 0:
        return float("nan")
    df, ncp = n - 1, delta / sigma * math.sqrt(n)
    c = t_crit(alpha, df)
    return over_chi(lambda s: phi(-c * s - ncp) + phi(ncp - c * s), df)


def tost_power(margin, sigma, n, alpha, true_diff=0.0):
    """Power of TOST (each one-sided test at alpha: the (1 - 2 alpha) CI inside +-margin):
    P(|m + Z| + c s < k), k = margin sqrt(n) / sigma, m = true_diff sqrt(n) / sigma."""
    if n < 2 or not sigma > 0:
        return float("nan")
    df, k, m = n - 1, margin * math.sqrt(n) / sigma, true_diff * math.sqrt(n) / sigma
    c = t_crit(2 * alpha, df)
    return over_chi(lambda s: max(0.0, phi(k - c * s - m) - phi(c * s - k - m)), df)


def seeds_needed(power_of_n, target=0.8, cap=1000):
    """Smallest n (2..cap) with power_of_n(n) >= target (power grows with n); None above cap."""
    if power_of_n(cap) < target:
        return None
    lo, hi = 1, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_of_n(mid) >= target else (mid, hi)
    return hi


def mde(sigma, n, alpha, target=0.8):
    """The smallest mean difference detected with power `target`."""
    return bisect(lambda d: power_paired(d, sigma, n, alpha) < target, 0.0, 20.0 * sigma, 50)


def holm(ps):
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj
