"""Counting and enumerating a family's space from its declaration, without walking every config.

The space is the knobs' allowed values (each knob's domain) filtered by the constraints. Knobs that
no constraint ties are independent, so the space falls apart into *components* (knobs joined by
constraints), and every count is a product over them.

Inside a component, :class:`Component` counts by dynamic programming over an order of its knobs:
after the first ``d`` knobs have values, what is left to count depends only on the *frontier*, the
assigned knobs that still share a constraint with an unassigned one; counts are kept per (depth,
frontier values), and each constraint is evaluated once per distinct tuple of its own knobs' values.
Small constraints (a few knobs each) keep the frontier small and the count fast; a constraint over
many knobs makes it large.

Two counts come out of one component:

- configs: every valid assignment;
- sources: the distinct projections onto the knobs that render the CUDA source (source knobs and the
  problem knobs with a macro). The other knobs (launch knobs, problem knobs that only name the
  problem) are ordered last and counted existentially: a source counts once if any of their values
  completes it.

Where the exact count would take more than ``budget`` steps, :meth:`Component.estimate` estimates it
by Knuth's random probes of the pruned search tree (an unbiased estimator; its standard error from the
probes' spread), and the result says so.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

__all__ = ["Component", "components", "BudgetExceeded", "Estimate"]


class BudgetExceeded(RuntimeError):
    """The exact count needs more steps than its budget."""


@dataclass(frozen=True)
class Estimate:
    value: float
    error: float            # half-width of a 95% interval (1.96 standard errors)
    probes: int


def components(names: Sequence[str], constraints: Sequence) -> list:
    """Knob names grouped by the constraints that tie them: [(names, constraints)], each list in
    declaration order (a knob in no constraint is a component of its own)."""
    parent = {n: n for n in names}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for c in constraints:
        ks = [k for k in c.knobs if k in parent]
        for a, b in zip(ks, ks[1:]):
            parent[find(a)] = find(b)
    groups: dict = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    out = []
    for members in sorted(groups.values(), key=lambda g: list(names).index(g[0])):
        mset = set(members)
        out.append((tuple(members), tuple(c for c in constraints if set(c.knobs) & mset)))
    return out


class Component:
    """One component of a space: knob ``names`` with allowed ``domains`` (name -> tuple of values),
    the ``constraints`` among them, and the knobs in ``hidden`` that do not change the source
    (counted existentially for the source count; ordered last)."""

    def __init__(self, names: Sequence[str], domains: dict, constraints: Sequence, hidden: set):
        self.names = tuple(names)
        self.domains = {n: tuple(domains[n]) for n in names}
        self.constraints = tuple(constraints)
        self.hidden = set(hidden) & set(names)
        self.order = self._order()
        depth = {n: i for i, n in enumerate(self.order)}
        self.shown = sum(1 for n in self.order if n not in self.hidden)
        n = len(self.order)
        self.checks: list = [[] for _ in range(n)]       # constraints completed at each depth
        last_use = {}                                      # the deepest knob each knob shares a constraint with
        for c in self.constraints:
            idx = [depth[k] for k in c.knobs]
            at = max(idx)
            self.checks[at].append((c, tuple(idx)))
            for i in idx:
                last_use[i] = max(last_use.get(i, -1), at)
        # frontier before depth d: assigned knobs still tied to a knob at depth >= d
        self.frontier = [tuple(i for i in range(d) if last_use.get(i, -1) >= d) for d in range(n + 1)]
        self._ok: dict = {}
        self.steps = 0

    def _order(self) -> list:
        """Shown knobs first, hidden ones last; within each, repeatedly the knobs that complete the
        constraint closest to complete (fewest unplaced knobs), so constraints are checked early and
        leave the frontier soon."""
        placed: list = []
        for part in ([n for n in self.names if n not in self.hidden], [n for n in self.names if n in self.hidden]):
            todo = set(part)
            while todo:
                best = None
                for c in self.constraints:
                    left = [k for k in c.knobs if k in todo]
                    if not left or any(k not in placed and k not in todo for k in c.knobs):
                        continue          # done already, or needs a knob of a later part
                    key = (len(left), len(c.knobs))
                    if best is None or key < best[0]:
                        best = (key, left)
                if best is None:
                    nxt = [n for n in part if n in todo][:1]
                else:
                    nxt = [n for n in part if n in best[1]]
                placed += nxt
                todo -= set(nxt)
        return placed

    # -- checks -----------------------------------------------------------------------------
    def _valid(self, d: int, values: list) -> bool:
        """The constraints completed at depth d hold for ``values`` (indexed by depth)."""
        for c, idx in self.checks[d]:
            key = (id(c), tuple(values[i] for i in idx))
            ok = self._ok.get(key)
            if ok is None:
                ok = c.check(**{k: values[i] for k, i in zip(c.knobs, idx)}) is None
                self._ok[key] = ok
            if not ok:
                return False
        return True

    def _tick(self, budget):
        self.steps += 1
        if budget is not None and self.steps > budget:
            raise BudgetExceeded(f"more than {budget} steps")

    # -- exact counts -------------------------------------------------------------------------
    def count(self, sources: bool = False, budget: Optional[int] = None) -> int:
        """Valid configs of the component, or (``sources``) distinct assignments of its shown knobs
        that some values of the hidden ones complete. BudgetExceeded past ``budget`` steps."""
        memo: dict = {}
        values = [None] * len(self.order)
        domains = [self.domains[n] for n in self.order]
        stop = self.shown if sources else len(self.order)

        def rec(d):
            if d == len(self.order):
                return 1
            key = (d, tuple(values[i] for i in self.frontier[d]))
            got = memo.get(key)
            if got is not None:
                return got
            self._tick(budget)
            total = 0
            for v in domains[d]:
                values[d] = v
                if self._valid(d, values):
                    sub = rec(d + 1)
                    if d >= stop and sub:
                        total = 1
                        break
                    total += sub
            values[d] = None
            memo[key] = total
            return total

        return rec(0)

    def _completes(self, d: int, values: list, memo: dict) -> bool:
        """Whether some completion of ``values[:d]`` satisfies every rule (memoised in ``memo`` on the
        frontier: what is left depends only on the assigned knobs still tied to later ones)."""
        if d == len(self.order):
            return True
        key = (d, tuple(values[i] for i in self.frontier[d]))
        got = memo.get(key)
        if got is None:
            got = False
            for v in self.domains[self.order[d]]:
                values[d] = v
                if self._valid(d, values) and self._completes(d + 1, values, memo):
                    got = True
                    break
            values[d] = None
            memo[key] = got
        return got

    def iter_sources(self) -> Iterator[dict]:
        """Each distinct assignment of the shown knobs, with the first values of the hidden knobs
        (in their domains' order) that complete it: {name: value}, in the order of the knobs'
        domains (depth first)."""
        memo: dict = {}
        values = [None] * len(self.order)
        domains = [self.domains[n] for n in self.order]

        def alive(d):
            return self._completes(d, values, memo)

        def witness(d):
            """Set the hidden knobs from depth d on to their first values that complete the assignment."""
            if d == len(self.order):
                return True
            for v in domains[d]:
                values[d] = v
                if self._valid(d, values) and alive(d + 1):
                    return witness(d + 1)
            return False

        def walk(d):
            if d == self.shown:
                if witness(d):
                    yield dict(zip(self.order, values))
                return
            for v in domains[d]:
                values[d] = v
                if self._valid(d, values) and alive(d + 1):
                    yield from walk(d + 1)
            values[d] = None

        yield from walk(0)

    # -- estimates ----------------------------------------------------------------------------
    def estimate(self, sources: bool = False, seconds: float = 1.0, max_probes: int = 200_000,
                 seed: int = 0) -> Estimate:
        """Knuth's estimate of :meth:`count`: random walks down the pruned tree, each taking a value
        uniformly among the valid ones at every depth and weighing its leaf by the product of the
        valid choices on the way (0 at a dead end); the mean weight is unbiased."""
        rng = random.Random(seed)
        domains = [self.domains[n] for n in self.order]
        stop = self.shown if sources else len(self.order)
        values = [None] * len(self.order)
        exist_memo: dict = {}

        def exists(d):
            return self._completes(d, values, exist_memo)

        weights = []
        t_end = time.perf_counter() + seconds
        while len(weights) < max_probes and (len(weights) < 64 or time.perf_counter() < t_end):
            w = 1.0
            for d in range(stop):
                ok = []
                for v in domains[d]:
                    values[d] = v
                    if self._valid(d, values):
                        ok.append(v)
                if not ok:
                    w = 0.0
                    break
                w *= len(ok)
                values[d] = rng.choice(ok)
            if w and sources and stop < len(self.order) and not exists(stop):
                w = 0.0
            values = [None] * len(self.order)
            weights.append(w)
        n = len(weights)
        mean = sum(weights) / n
        var = sum((x - mean) ** 2 for x in weights) / max(1, n - 1)
        return Estimate(mean, 1.96 * math.sqrt(var / n), n)


def product(counts: Sequence) -> int:
    return math.prod(counts)


def combine_estimates(parts: Sequence) -> tuple:
    """(value, error) of a product of independent factors, each an int (exact) or an Estimate
    (first-order propagation of the relative errors)."""
    value = 1.0
    rel2 = 0.0
    for p in parts:
        if isinstance(p, Estimate):
            value *= p.value
            if p.value:
                rel2 += (p.error / p.value) ** 2
        else:
            value *= p
    return value, abs(value) * math.sqrt(rel2)


CheckFn = Callable[..., Optional[str]]
