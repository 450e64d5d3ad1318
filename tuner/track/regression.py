"""Regression maths for the nightly job: judge one night's re-measurement of a tuned kernel
against its history. Pure functions of numbers, tested on synthetic histories.

The quantity judged is the speedup over bnb (``bnb / tuned``), a ratio that cancels machine
drift. Per night and problem, :func:`judge` returns one of:

- ``broken``: the stored config no longer passes the bit-exact gate;
- ``invalid-environment``: clocks or temperature off, so the night is not judged;
- ``noisy-reference``: something on the host (a stall, another process) disturbed the
  reference, so the night is not judged and does not fail: bnb's own samples tonight spread
  far more than on the recent good nights (relative IQR over 3x their median and over 10%),
  or bnb was slow for the whole measurement (the speedup over 1.5x the baseline's, with the
  config and bnb's version unchanged: the tuned kernel cannot have become that much faster);
- ``regression-vs-bnb``: the tuned kernel is slower than bnb;
- ``suspicious``: the speedup fell by more than max(5%, 3x the measured noise) against the
  rolling baseline of recent good nights, significantly on the raw samples (one-sided
  Mann-Whitney U), for the first time;
- ``regression``: the same drop, persisting from the previous night (or an immediate
  re-measurement);
- ``ok``.

How "fell by more than the threshold" is decided: a measured drop is an estimate, and a true
drop of exactly the threshold measures above it only half the time, so a rule on the point
estimate alone would catch a real 5% slowdown on a coin flip per night. The rule is therefore:
the drop is significant (Mann-Whitney p < 0.01) *and* the threshold lies within the drop's
one-sided 99.9% confidence band (drop + 3.09 x its standard error >= threshold; the error
combines tonight's repetitions and the baseline median's own error). At H200 noise (about 1%
per repetition, 25 repetitions) a real 5% slowdown is caught on nearly every night, a quiet
night's drop (a few tenths of a percent) is far short of the band, and true drops under about
3.5% are not flagged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..vocabulary import NOISY_REFERENCE

__all__ = ["Night", "Verdict", "judge", "mann_whitney_greater", "env_changes", "relative_iqr", "MIN_DROP",
           "NOISE_FACTOR", "NOISY_FACTOR", "NOISY_MIN", "NOISY_JUMP", "NOT_JUDGED", "METHOD_KEYS"]

MIN_DROP = 0.05          # at least a 5% drop of the speedup
NOISE_FACTOR = 3.0       # and at least 3x the baseline's night-to-night noise
ALPHA = 0.01             # significance of the drop on the raw samples
CONFIDENCE_Z = 3.09      # one-sided 99.9% band of the measured drop
BASELINE_NIGHTS = 10     # rolling window of recent good nights
MIN_BASELINE = 3
NOISY_FACTOR = 3.0       # tonight's peer relative IQR over the good nights' median relative IQR
NOISY_MIN = 0.10         # and over 10% absolute: a noisy reference, the night is not judged
NOISY_JUMP = 1.5         # a speedup this far over the baseline's, nothing else changed: bnb was slowed throughout
#: the verdicts of nights that were not judged: they neither join the baseline nor break a run
#: of suspicious nights
NOT_JUDGED = (NOISY_REFERENCE, "invalid-environment")
#: environment entries that are how a night was measured, not what was measured: a night is
#: compared only with good nights measured the same way (bnb timed from CUDA-graph replays runs
#: faster than bnb timed by direct calls, which would read as a drop of the speedup)
METHOD_KEYS = ("bnb_timing",)


def _baseline(history: Sequence[Night], night: Night) -> list:
    """The recent good nights measured the way ``night`` was (at most BASELINE_NIGHTS)."""
    return [h for h in history if h.verdict == "ok"
            and all(h.env.get(k) == night.env.get(k) for k in METHOD_KEYS)][-BASELINE_NIGHTS:]


@dataclass
class Night:
    """One night's measurement of one problem: interleaved raw samples of the tuned kernel
    and of bnb, the gate's verdict, and the environment."""

    tuned_us: Sequence[float]
    bnb_us: Sequence[float]
    gate_ok: bool = True
    env: dict = field(default_factory=dict)       # versions: driver, nvrtc, bnb, torch, commit ...
    sm_clock_mhz: Optional[float] = None
    max_sm_clock_mhz: Optional[float] = None
    temperature_c: Optional[float] = None
    verdict: Optional[str] = None                 # filled in by judge() for past nights

    @property
    def speedup(self) -> float:
        return statistics.median(self.bnb_us) / statistics.median(self.tuned_us)

    def sample_speedups(self) -> list[float]:
        """Per-repetition speedups: the samples are interleaved, so repetition i of bnb and of
        the tuned kernel saw the same machine state."""
        n = min(len(self.tuned_us), len(self.bnb_us))
        return [self.bnb_us[i] / self.tuned_us[i] for i in range(n)]


@dataclass
class Verdict:
    flag: str
    drop: Optional[float] = None         # relative drop of the speedup against the baseline
    threshold: Optional[float] = None
    p_value: Optional[float] = None
    baseline_speedup: Optional[float] = None
    speedup: Optional[float] = None
    changes: dict = field(default_factory=dict)
    reason: str = ""


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value that values in ``x`` tend to be greater than in ``y`` (Mann-Whitney U,
    normal approximation with tie correction)."""
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return 1.0
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(pooled)
    i = 0
    tie_term = 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = r
        t = j - i + 1
        tie_term += t ** 3 - t
        i = j + 1
    rx = sum(r for r, (_, g) in zip(ranks, pooled) if g == 0)
    u = rx - nx * (nx + 1) / 2
    n = nx + ny
    mu = nx * ny / 2
    var = nx * ny / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 0.5
    z = (u - mu - 0.5) / math.sqrt(var)   # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def env_changes(before: dict, after: dict) -> dict:
    """``{key: (before, after)}`` for every environment entry that differs."""
    keys = sorted(set(before) | set(after))
    return {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}


def _environment_off(n: Night, max_temp_c: float = 87.0, min_clock_fraction: float = 0.85) -> Optional[str]:
    if n.temperature_c is not None and n.temperature_c > max_temp_c:
        return f"GPU at {n.temperature_c:.0f} C (over {max_temp_c:.0f} C)"
    if n.sm_clock_mhz is not None and n.max_sm_clock_mhz:
        if n.sm_clock_mhz < min_clock_fraction * n.max_sm_clock_mhz:
            return f"SM clock {n.sm_clock_mhz:.0f} MHz under {min_clock_fraction:.0%} of {n.max_sm_clock_mhz:.0f} MHz"
    return None


def relative_iqr(samples: Sequence[float]) -> Optional[float]:
    """Interquartile range over median of the finite samples (None for fewer than 4)."""
    xs = [x for x in samples if x is not None and math.isfinite(x)]
    if len(xs) < 4:
        return None
    med = statistics.median(xs)
    if med <= 0:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / med


def _noisy_reference(history: Sequence[Night], night: Night) -> Optional[str]:
    """Why tonight's peer samples are too disturbed to judge by, or None: their spread against
    the good nights' (or, without a baseline yet, against the absolute limit alone), then the
    speedup's jump with nothing else changed."""
    good = _baseline(history, night)
    tonight = relative_iqr(night.bnb_us)
    if tonight is not None and tonight > NOISY_MIN:
        past = [r for r in (relative_iqr(g.bnb_us) for g in good) if r is not None]
        if len(past) < MIN_BASELINE:
            return (f"bnb's relative IQR tonight is {tonight:.1%}, over {NOISY_MIN:.0%} (no baseline of "
                    f"{MIN_BASELINE} good nights to compare with yet): the reference was disturbed; not judged")
        base = statistics.median(past)
        if tonight > NOISY_FACTOR * base:
            return (f"bnb's relative IQR tonight is {tonight:.1%}, {tonight / base:.1f}x its median {base:.1%} over "
                    f"the last {len(past)} good nights (limit {NOISY_FACTOR:g}x and {NOISY_MIN:.0%}): the reference "
                    "was disturbed (a host stall, another process); not judged")
    if len(good) >= MIN_BASELINE:
        same = all(night.env.get(k) == good[-1].env.get(k) for k in ("config", "bnb"))
        base = statistics.median(g.speedup for g in good)
        if same and night.speedup > NOISY_JUMP * base:
            return (f"the speedup over bnb is {night.speedup:.2f}, {night.speedup / base:.1f}x the baseline's "
                    f"{base:.2f} with the same config and bnb (limit {NOISY_JUMP:g}x): bnb was slowed for the whole "
                    "measurement (a host stall?); not judged")
    return None


def _drop_verdict(history: Sequence[Night], night: Night) -> Verdict:
    good = _baseline(history, night)
    if len(good) < MIN_BASELINE:
        earlier = [h for h in history if h.verdict == "ok"]
        reason = f"baseline has {len(good)} good nights, needs {MIN_BASELINE}"
        changed = env_changes(earlier[-1].env, night.env) if earlier else {}
        method = {k: v for k, v in changed.items() if k in METHOD_KEYS}
        if method:
            reason += " (a new baseline: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in method.items()) + ")"
        return Verdict("ok", speedup=night.speedup, reason=reason, changes=changed)
    speedups = [g.speedup for g in good]
    base = statistics.median(speedups)
    noise = statistics.pstdev(speedups) / base if len(speedups) > 1 else 0.0
    threshold = max(MIN_DROP, NOISE_FACTOR * noise)
    drop = (base - night.speedup) / base
    tonight = night.sample_speedups()
    pooled = [s for g in good for s in g.sample_speedups()]
    p = mann_whitney_greater(pooled, tonight)
    # the drop's uncertainty: tonight's median (standard error from its per-repetition
    # speedups) and the baseline's median (night-to-night noise over sqrt(nights)); the
    # night-to-night noise itself is in the threshold (3x noise), not in this band
    se = 1.2533 * statistics.pstdev(tonight) / math.sqrt(len(tonight)) / base if len(tonight) > 1 else 0.0
    margin = CONFIDENCE_Z * math.sqrt(se ** 2 + noise ** 2 / len(good))
    v = Verdict("ok", drop=drop, threshold=threshold, p_value=p, baseline_speedup=base, speedup=night.speedup,
                changes=env_changes(good[-1].env, night.env))
    if p < ALPHA and drop + margin >= threshold:
        v.flag = "suspicious"
    return v


def judge(history: Sequence[Night], night: Night, remeasure: Optional[Night] = None) -> Verdict:
    """The verdict of ``night`` given the judged ``history`` (oldest first). ``remeasure`` is an
    immediate second measurement of the same night, which can confirm a drop at once."""
    if not night.gate_ok:
        return Verdict("broken", speedup=None, reason="the stored config no longer passes the bit-exact gate",
                       changes=env_changes(history[-1].env, night.env) if history else {})
    off = _environment_off(night)
    if off:
        return Verdict("invalid-environment", reason=off)
    noisy = _noisy_reference(history, night)
    if noisy:
        good = [h for h in history if h.verdict == "ok"]
        return Verdict(NOISY_REFERENCE, speedup=night.speedup, reason=noisy,
                       changes=env_changes(good[-1].env, night.env) if good else {})
    if statistics.median(night.tuned_us) > statistics.median(night.bnb_us):
        v = _drop_verdict(history, night)
        v.flag = "regression-vs-bnb"
        v.reason = "the tuned kernel is slower than bnb"
        return v
    v = _drop_verdict(history, night)
    if v.flag != "suspicious":
        return v
    judged = [h.verdict for h in history if h.verdict not in NOT_JUDGED]
    previous = judged[-1] if judged else None
    if previous in ("suspicious", "regression"):
        v.flag, v.reason = "regression", "the drop persists from the previous night"
        return v
    if remeasure is not None and _drop_verdict(history, remeasure).flag == "suspicious":
        v.flag, v.reason = "regression", "the drop persists in an immediate re-measurement"
        return v
    v.reason = "first night of a significant drop"
    return v
