"""A kernel family as one declaration, and everything derived from it.

A :class:`Family` declares its template, its knobs (source knobs that render macros, launch
knobs that only change the launch, problem knobs fixed by the problem), its constraints, its
defaults and presets, and (in a subclass) what a problem's inputs are, the correctness gate,
the launch plan, the traffic model and the peer it is judged against. From the knobs and
constraints alone this module derives:

- the space: :meth:`Family.iter_space` walks it, :meth:`Family.space_size` counts it from the
  constraint structure without walking it;
- the search parametrisation: knobs tied by constraints form one categorical parameter whose
  choices are exactly the valid combinations, so every sample is a valid config;
- the one-knob refinement neighbours of a config;
- serialisation (:meth:`Config.to_dict`, :meth:`Family.from_dict`) and labels
  (:meth:`Config.short`).

A :class:`Config` is a frozen, hashable value: its family's name and the value of every knob.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterator, Optional, Sequence

from .vocabulary import InvalidConfig

__all__ = ["Knob", "Constraint", "Config", "Family", "DeviceLimits", "ROLES"]

#: source: renders a macro of the template; launch: changes only the launch; problem: fixed by
#: the problem being tuned (never searched)
ROLES = ("source", "launch", "problem")


def _group_key(group: tuple, fixed: dict) -> tuple:
    """The cache key of a constraint group's choices under fixed problem knob values."""
    return group, tuple(sorted(fixed.items(), key=lambda kv: kv[0]))


@dataclass(frozen=True)
class DeviceLimits:
    """What a launch plan needs of the device (nf4tune.kernel.arch fills it in from the device's
    properties, or from its table for a named arch)."""

    sm_count: int
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    smem_per_block: int = 48 * 1024       # without opting in
    smem_per_block_optin: int = 48 * 1024

    def registers_refusal(self, registers: int, threads: int) -> Optional[str]:
        """Why a block of ``threads`` at ``registers`` per thread cannot launch (None: it can). A warp's
        registers are allocated in units of 256 (8 per thread), and a block's warps are spread over the
        SM's 4 sub-partitions, each with a quarter of the register file: the sub-partition with the most
        warps must hold them. (Session 20 on the H100: 142 registers x 14 warps fits the SM's 65,536 but not
        a quarter's 16,384 per 4 warps, and the launch failed with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.)"""
        per_warp = -(-registers * 32 // 256) * 256
        warps = -(-threads // 32)
        busiest = -(-warps // 4)
        if busiest * per_warp > self.regs_per_sm // 4:
            return (f"{registers} registers x {threads} threads: {busiest} warps of {per_warp} registers on one of "
                    f"the SM's 4 sub-partitions exceed its {self.regs_per_sm // 4}; the block cannot launch")
        return None


@dataclass(frozen=True)
class Knob:
    """One knob: its values, its role, and for a source knob the macro it sets.

    ``codes`` maps a value to the macro's value (default: the value itself for integers, else its
    index in ``values``). ``label`` formats the value in a config's short label (``""`` hides
    it; None values and the values in ``hidden`` are never shown: a knob added later leaves the
    labels of the configs that keep its old behaviour as they were)."""

    name: str
    values: tuple
    role: str = "source"
    macro: Optional[str] = None         # a problem knob without one only names the problem
    codes: Optional[dict] = None
    label: str = "{}"
    help: str = ""
    hidden: tuple = ()

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"knob {self.name}: role {self.role!r} is not one of {ROLES}")
        if self.role == "source" and self.macro is None:
            raise ValueError(f"knob {self.name}: a source knob needs the macro it sets")

    def code(self, value) -> int:
        if self.codes is not None:
            return self.codes[value]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return self.values.index(value)


@dataclass(frozen=True)
class Constraint:
    """A rule over some knobs: ``check(**{knob: value})`` returns why a combination is invalid,
    or None. Knobs tied by constraints are searched as one parameter."""

    knobs: tuple
    check: Callable[..., Optional[str]]

    def violation(self, values: dict) -> Optional[str]:
        return self.check(**{k: values[k] for k in self.knobs})


@dataclass(frozen=True)
class Config:
    """One point of a family's space (a frozen, hashable value). Knob values read as
    attributes: ``config.threads``."""

    family: "Family" = field(compare=False, repr=False, hash=False)
    name: str
    values: tuple

    def __getattr__(self, knob):
        if knob.startswith("_") or knob in ("family", "name", "values"):
            raise AttributeError(knob)
        fam = self.__dict__.get("family")
        i = fam.knob_index.get(knob) if fam is not None else None
        if i is None:
            raise AttributeError(f"{type(self).__name__} of family {self.__dict__.get('name')!r} has no knob {knob!r}")
        return self.values[i]

    def __repr__(self) -> str:
        return f"Config({self.name}: {self.short()})"

    # -- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict:
        return dict(zip(self.family.knob_names, self.values))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    # -- derived -------------------------------------------------------------------
    def source_knobs(self) -> dict:
        """The knobs that change the CUDA source (the rest change only the launch, or only say
        which problem the config is for)."""
        return {k.name: v for k, v in zip(self.family.knobs, self.values) if k.role != "launch" and k.macro}

    def tunable(self) -> dict:
        return {k.name: v for k, v in zip(self.family.knobs, self.values) if k.role != "problem"}

    def replace(self, **changes) -> "Config":
        return self.family.config(**{**self.to_dict(), **changes})

    def short(self) -> str:
        parts = []
        for k, v in zip(self.family.knobs, self.values):
            if v is None or not k.label or v in k.hidden:
                continue
            parts.append(k.label.format(v))
        return " ".join(parts)

    def render(self) -> str:
        return self.family.render(self)


class Family:
    """A kernel family's declaration. Subclasses add the problem-facing parts (inputs, gate,
    launch plan, traffic, peer); the space, search parametrisation and neighbours are derived
    here from :attr:`knobs` and :attr:`constraints`."""

    #: short name, stored with every measurement
    name: str = ""
    #: file under kernel_templates/
    template: str = ""
    #: the kernel's extern "C" name
    kernel_name: str = ""
    #: one line for --help and the report
    title: str = ""
    knobs: tuple = ()
    constraints: tuple = ()
    #: default values of every knob (a config built from a partial dict takes these)
    defaults: dict = {}
    #: named points of the space: name -> tunable knob values (problem knobs come from the problem)
    presets: dict = {}
    #: the order the greedy refinement tries knobs in (default: declaration order)
    refine_order: tuple = ()
    #: the label of the peer the family is judged against (its median is the x-bnb basis)
    peer_label: str = ""
    #: time the peers (bnb's calls: several launches with Python between them) from a CUDA-graph
    #: replay, so that host time between their launches cannot enter (nf4tune.measure.timing);
    #: a peer callable with the attribute ``graph = False`` is timed by direct calls
    time_peers_in_graph: bool = True
    #: the label of the ceiling measured beside it, and what its % column means
    ceiling_label: str = ""
    #: the problem knobs and where they come from: knob name -> Problem attribute
    problem_knobs: dict = {}

    def __init__(self):
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: duplicate knob names")
        for c in self.constraints:
            unknown = set(c.knobs) - set(names)
            if unknown:
                raise ValueError(f"family {self.name}: constraint on unknown knob(s) {sorted(unknown)}")
        missing = set(names) - set(self.defaults)
        if missing:
            raise ValueError(f"family {self.name}: no default for knob(s) {sorted(missing)}")

    def extended(self, *, knobs: Sequence[Knob] = (), constraints: Sequence[Constraint] = (),
                 defaults: Optional[dict] = None, **attrs) -> "Family":
        """A copy of this family with knobs, constraints or defaults added (tests use it to show
        that one declaration is all a new knob needs)."""
        new = copy.copy(self)
        for k in ("knob_names", "knob_index", "groups", "_group_choices_cache", "_choice_map_cache"):
            new.__dict__.pop(k, None)
        new.knobs = tuple(self.knobs) + tuple(knobs)
        new.constraints = tuple(self.constraints) + tuple(constraints)
        new.defaults = {**self.defaults, **(defaults or {})}
        for k, v in attrs.items():
            setattr(new, k, v)
        Family.__init__(new)
        return new

    # -- knobs -------------------------------------------------------------------------
    @cached_property
    def knob_names(self) -> tuple:
        return tuple(k.name for k in self.knobs)

    @cached_property
    def knob_index(self) -> dict:
        return {k.name: i for i, k in enumerate(self.knobs)}

    def knob(self, name: str) -> Knob:
        return self.knobs[self.knob_index[name]]

    def source_knob_names(self) -> tuple:
        return tuple(k.name for k in self.knobs if k.role != "launch" and k.macro)

    def tunable_knob_names(self) -> tuple:
        return tuple(k.name for k in self.knobs if k.role != "problem")

    # -- configs -----------------------------------------------------------------------
    def violation(self, values: dict) -> Optional[str]:
        """Why ``values`` (every knob) is not a point of the space, or None."""
        for k in self.knobs:
            v = values[k.name]
            if v not in k.values or (v is not None and type(v) is bool):
                return f"{k.name}={v!r} is not one of {list(k.values)}"
        for c in self.constraints:
            reason = c.violation(values)
            if reason:
                return reason
        return None

    def config(self, **knobs) -> Config:
        """A validated config; knobs not given take :attr:`defaults`."""
        unknown = set(knobs) - set(self.knob_names)
        if unknown:
            raise InvalidConfig(f"unknown knob(s): {sorted(unknown)}; known: {list(self.knob_names)}")
        values = {**self.defaults, **knobs}
        reason = self.violation(values)
        if reason:
            raise InvalidConfig(reason)
        return Config(self, self.name, tuple(values[n] for n in self.knob_names))

    def from_dict(self, d: dict) -> Config:
        if not isinstance(d, dict):
            raise InvalidConfig("a config must be an object of knob: value")
        return self.config(**d)

    def from_json(self, text: str) -> Config:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidConfig(f"config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise InvalidConfig("config JSON must be an object of knob: value")
        return self.from_dict(d)

    def preset(self, name: str, problem=None, **problem_values) -> Config:
        """The named preset, with the problem knobs of ``problem`` (or given by name)."""
        if name not in self.presets:
            raise InvalidConfig(f"unknown preset {name!r}; known: {sorted(self.presets)}")
        return self.config(**self.presets[name], **self.problem_values(problem, **problem_values))

    def problem_values(self, problem=None, **given) -> dict:
        """The problem knobs' values for ``problem`` (a :class:`~nf4tune.vocabulary.Problem`), or
        as given by name."""
        out = {}
        for knob, attr in self.problem_knobs.items():
            if problem is not None:
                out[knob] = getattr(problem, attr)
            elif knob in given:
                out[knob] = given[knob]
        return out

    def for_problem(self, config: Config, problem) -> Config:
        """``config`` with the problem knobs of ``problem`` (a tuned config of another problem
        carried over)."""
        return config.replace(**self.problem_values(problem))

    # -- the space ---------------------------------------------------------------------
    @cached_property
    def groups(self) -> tuple:
        """Tunable knobs tied by constraints, as tuples in declaration order: each group is one
        search parameter. A knob in no constraint is a group of its own."""
        tunable = self.tunable_knob_names()
        parent = {k: k for k in tunable}

        def find(k):
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for c in self.constraints:
            ks = [k for k in c.knobs if k in parent]
            for a, b in zip(ks, ks[1:]):
                parent[find(a)] = find(b)
        by_root: dict = {}
        for k in tunable:
            by_root.setdefault(find(k), []).append(k)
        return tuple(tuple(g) for g in sorted(by_root.values(), key=lambda g: tunable.index(g[0])))

    def _problem_domain(self, restrict: Optional[dict]) -> dict:
        """Allowed values of the problem knobs: every value, or those ``restrict`` names."""
        out = {}
        for k in self.knobs:
            if k.role != "problem":
                continue
            vals = tuple(k.values)
            if restrict and k.name in restrict:
                given = restrict[k.name]
                given = tuple(given) if isinstance(given, (list, tuple, set)) else (given,)
                bad = [v for v in given if v not in k.values]
                if bad:
                    raise InvalidConfig(f"{k.name} {bad} not in {list(k.values)}")
                vals = given
            out[k.name] = vals
        return out

    def _group_choices(self, group: tuple, fixed: dict) -> list[tuple]:
        """Valid value combinations of ``group`` given fixed problem knob values (constraints
        that involve only the group's knobs and problem knobs)."""
        return self._memo("_group_choices_cache", _group_key(group, fixed), lambda: self._walk_group(group, fixed))

    def _memo(self, cache_name: str, key, build):
        """``build()`` once per key, kept in the instance's cache ``cache_name`` (dropped by
        :meth:`extended`)."""
        cache = self.__dict__.setdefault(cache_name, {})
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def _walk_group(self, group: tuple, fixed: dict) -> list[tuple]:
        """The valid combinations of ``group``, in ``itertools.product`` order, by a depth-first
        walk that checks each constraint as soon as its knobs have values and prunes there (the
        product of a large group's values is millions of combinations, its valid part thousands).
        The walk assigns first the knobs that complete the smallest constraints."""
        gset = set(group)
        rules = [c for c in self.constraints if set(c.knobs) & gset]
        order: list = []
        pending = list(rules)
        while pending:
            # the constraint closest to complete (fewest unassigned knobs, then fewest knobs)
            c = min(pending, key=lambda c: (sum(k in gset and k not in order for k in c.knobs), len(c.knobs)))
            pending.remove(c)
            order += [k for k in group if k in c.knobs and k not in order]
        order += [k for k in group if k not in order]
        depth = {k: i for i, k in enumerate(order)}
        checks: list = [[] for _ in order]
        for c in rules:
            checks[max(depth[k] for k in c.knobs if k in gset)].append(c)
        domains = [self.knob(k).values for k in order]
        values = dict(fixed)
        found: list = []
        chosen: list = []

        def walk(d):
            if d == len(order):
                found.append(tuple(chosen))
                return
            name = order[d]
            for i, v in enumerate(domains[d]):
                values[name] = v
                if all(c.violation(values) is None for c in checks[d]):
                    chosen.append(i)
                    walk(d + 1)
                    chosen.pop()
            del values[name]

        walk(0)
        # back to the group's knob order, sorted as itertools.product over the group yields them
        at = [order.index(k) for k in group]
        idx = sorted(tuple(f[j] for j in at) for f in found)
        vals = [self.knob(k).values for k in group]
        return [tuple(vals[j][i] for j, i in enumerate(t)) for t in idx]

    def _tuned_restriction(self, restrict: Optional[dict]) -> dict:
        """The tunable knobs ``restrict`` names, with their allowed values (checked)."""
        out = {}
        for name, given in (restrict or {}).items():
            if name not in self.knob_names:
                raise InvalidConfig(f"{self.name} has no knob {name!r}")
            k = self.knob(name)
            if k.role == "problem":
                continue
            given = tuple(given) if isinstance(given, (list, tuple, set)) else (given,)
            bad = [v for v in given if v not in k.values]
            if bad:
                raise InvalidConfig(f"{name} {bad} not in {list(k.values)}")
            out[name] = set(given)
        return out

    def _restricted_choices(self, group: tuple, fixed: dict, tuned: dict) -> list[tuple]:
        combos = self._group_choices(group, fixed)
        idx = [(i, tuned[n]) for i, n in enumerate(group) if n in tuned]
        return [c for c in combos if all(c[i] in allowed for i, allowed in idx)] if idx else combos

    def iter_space(self, **restrict) -> Iterator[Config]:
        """Every valid config; any knob may be restricted to some of its values, e.g.
        ``dtype=["bf16"]`` or ``warps=[4, 8]``."""
        domain = self._problem_domain(restrict)
        tuned = self._tuned_restriction(restrict)
        names = list(domain)
        for pvals in itertools.product(*domain.values()):
            fixed = dict(zip(names, pvals))
            per_group = [self._restricted_choices(g, fixed, tuned) for g in self.groups]
            for combos in itertools.product(*per_group):
                values = dict(fixed)
                for g, combo in zip(self.groups, combos):
                    values.update(zip(g, combo))
                yield Config(self, self.name, tuple(values[n] for n in self.knob_names))

    def space_size(self, **restrict) -> int:
        """How many valid configs there are, counted per constraint group (not walked)."""
        domain = self._problem_domain(restrict)
        tuned = self._tuned_restriction(restrict)
        total = 0
        for pvals in itertools.product(*domain.values()):
            fixed = dict(zip(domain, pvals))
            total += math.prod(len(self._restricted_choices(g, fixed, tuned)) for g in self.groups)
        return total

    def distinct_sources(self, configs) -> dict:
        """One representative config per distinct rendered source, keyed by its source knobs."""
        out: dict = {}
        for c in configs:
            out.setdefault(tuple(sorted(c.source_knobs().items(), key=lambda kv: kv[0])), c)
        return out

    def covering_sources(self, configs, strength: int = 3) -> list:
        """A covering sample of the distinct sources among ``configs``: every combination of
        ``strength`` source-knob values that some distinct source has, some source in the sample
        has too (a ``strength``-wise covering array of the valid sources, chosen greedily: each
        pick the source that covers most combinations not yet covered, ties to the earlier source
        in ``configs``' order, so the same configs give the same sample).

        Compiling it checks every interaction of up to ``strength`` source knobs for a small part
        of the cost of compiling every source (matmul bf16/nf4: 274 of 20,000 at strength 3)."""
        import heapq

        if strength < 1:
            raise ValueError(f"strength must be at least 1, not {strength}")
        reps = list(self.distinct_sources(configs).items())
        combos = [set(itertools.combinations(key, min(strength, len(key)))) for key, _ in reps]
        uncovered = set().union(*combos) if combos else set()
        heap = [(-len(c), i) for i, c in enumerate(combos)]
        heapq.heapify(heap)
        picked = []
        while uncovered:
            _, i = heapq.heappop(heap)
            gain = len(combos[i] & uncovered)
            if heap and gain < -heap[0][0]:          # stale: another source may cover more now
                if gain:
                    heapq.heappush(heap, (-gain, i))
                continue
            picked.append(i)
            uncovered -= combos[i]
        return [reps[i][1] for i in sorted(picked)]

    # -- search parametrisation --------------------------------------------------------
    @staticmethod
    def _choice_text(combo: tuple) -> str:
        return "/".join("None" if v is None else str(v) for v in combo)

    def param_name(self, group: tuple) -> str:
        return "+".join(group)

    def search_space(self, problem) -> dict:
        """optuna parameters -> choices for ``problem``: their product is exactly the valid space
        of the problem's problem-knob values."""
        fixed = self.problem_values(problem)
        return {self.param_name(g): [self._choice_text(c) for c in self._group_choices(g, fixed)]
                for g in self.groups}

    def config_from_params(self, params: dict, problem) -> Config:
        fixed = self.problem_values(problem)
        values = dict(fixed)
        for g in self.groups:
            text = params[self.param_name(g)]
            combos = self._choice_map(g, fixed)
            if text not in combos:
                raise InvalidConfig(f"{self.param_name(g)}={text!r} is not a choice of the search space")
            values.update(zip(g, combos[text]))
        return self.config(**values)

    def _choice_map(self, group: tuple, fixed: dict) -> dict:
        """choice text -> combination of ``group`` (built once per group and problem: a search
        turns every trial's parameters back into a config)."""
        return self._memo("_choice_map_cache", _group_key(group, fixed),
                          lambda: {self._choice_text(c): c for c in self._group_choices(group, fixed)})

    def params_from_config(self, config: Config) -> dict:
        return {self.param_name(g): self._choice_text(tuple(getattr(config, k) for k in g)) for g in self.groups}

    def grid_size(self, problem) -> int:
        return math.prod(len(v) for v in self.search_space(problem).values())

    # -- refinement --------------------------------------------------------------------
    def neighbours(self, config: Config) -> list[Config]:
        """Valid configs one knob step from ``config``, the most promising first: one knob changed
        (knobs in :attr:`refine_order`, values nearest the current first), then two knobs of one
        constraint group changed together (moves one knob alone cannot make, such as a grid
        change that needs its CTA count). The moves of the greedy refinement that ends a search."""
        order = list(self.refine_order) or list(self.tunable_knob_names())
        order += [k for k in self.tunable_knob_names() if k not in order]
        rank = {k: i for i, k in enumerate(order)}
        current = config.to_dict()

        def nearest(knob):
            vals = list(self.knob(knob).values)
            i = vals.index(current[knob])
            return sorted((v for v in vals if v != current[knob]), key=lambda v: (abs(vals.index(v) - i), vals.index(v)))

        out: list = []
        seen = {config}

        def add(changes):
            values = {**current, **changes}
            if self.violation(values) is None:
                c = Config(self, self.name, tuple(values[n] for n in self.knob_names))
                if c not in seen:
                    seen.add(c)
                    out.append(c)

        for knob in order:
            for v in nearest(knob):
                add({knob: v})
        pairs = []
        for g in self.groups:
            for a, b in itertools.combinations(g, 2):
                pairs.append((min(rank[a], rank[b]), a, b))
        for _, a, b in sorted(pairs):
            for va in nearest(a):
                for vb in nearest(b):
                    add({a: va, b: vb})
        return out

    # -- rendering ---------------------------------------------------------------------
    def macros(self, config: Config) -> dict:
        return {k.macro: k.code(getattr(config, k.name)) for k in self.knobs if k.role != "launch" and k.macro}

    def render(self, config: Config) -> str:
        from nf4tune.kernel_templates import render

        return render(self.template, self.macros(config))

    def template_hash(self) -> str:
        from nf4tune.kernel_templates import template_hash

        return template_hash(self.template)

    # -- problem-facing parts, declared by each family ----------------------------------
    def builtin_default(self, problem) -> Config:
        """The config served for a problem no table covers (and a search's first start point)."""
        raise NotImplementedError

    def check_problem(self, problem) -> None:
        """Raise ValueError when ``problem`` is not one this family can tune."""
        raise NotImplementedError

    def compare(self, got, want, inputs, config=None) -> Optional[str]:
        """Why ``got`` (the variant ``config``'s output) is not acceptable against ``want``, or None."""
        raise NotImplementedError

    def verify_peers(self, peers: dict, inputs, want) -> Optional[str]:
        """After timing: why the peers' outputs cannot be trusted, or None."""
        return None
