"""A kernel family as one declaration, and everything derived from it.

A :class:`Family` declares its template files, its knobs (source knobs that render macros, launch
knobs that only change the launch, problem knobs fixed by the problem), its constraints and
presets, and (in a subclass) what a problem's inputs are, the correctness gate, the launch plan,
the traffic model and the peer it is judged against. A :class:`Knob` is one declaration: its
values, its default, where the greedy refinement tries it, which of its values are experimental
(kept out of the default space), its label and help; its macro's name (``NF4T_<NAME>``) and an enum
knob's named values (``NF4T_<NAME>_<VALUE>``) are derived. A :class:`Constraint` carries its own
help text (its check's docstring, or ``help``). From the knobs and constraints alone this package
derives:

- the space: :meth:`Family.iter_space` walks it, :meth:`Family.count` counts its configs and
  distinct sources from the constraint structure without walking it (:mod:`.space`),
  :meth:`Family.iter_sources` gives one config per distinct source;
- the search parametrisation: knobs tied by constraints form one categorical parameter whose
  choices are exactly the valid combinations, so every sample is a valid config;
- the one-knob refinement neighbours of a config;
- rendering (:meth:`Family.render`: the macros, then the template files of the config's structure);
- serialisation (:meth:`Config.to_dict`, :meth:`Family.from_dict`) and labels
  (:meth:`Config.short`).

A :class:`Config` is a frozen, hashable value: its family's name and the value of every knob.
Experimental values are valid configs (a stored or given config with one loads and runs); only the
space's walks, counts and the search leave them out unless asked (``experimental=True``, or a
restriction that names the value).
"""

from __future__ import annotations

import copy
import heapq
import inspect
import itertools
import json
import math
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from ..vocabulary import InvalidConfig
from . import space as _space

__all__ = ["Knob", "Constraint", "Config", "Family", "DeviceLimits", "SpaceCount", "ROLES"]

#: source: renders a macro of the template; launch: changes only the launch; problem: fixed by
#: the problem being tuned (never searched)
ROLES = ("source", "launch", "problem")
#: a knob's default when none is declared: its first value
_FIRST = object()


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
        warps must hold them. (On an H100, 2026-12-06: 142 registers x 14 warps fit the SM's 65,536 but
        not a quarter's 16,384 per 4 warps, and the launch failed with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.)"""
        per_warp = -(-registers * 32 // 256) * 256
        warps = -(-threads // 32)
        busiest = -(-warps // 4)
        if busiest * per_warp > self.regs_per_sm // 4:
            return (f"{registers} registers x {threads} threads: {busiest} warps of {per_warp} registers on one of "
                    f"the SM's 4 sub-partitions exceed its {self.regs_per_sm // 4}; the block cannot launch")
        return None


def _constant_part(value) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(value)).strip("_").upper()


@dataclass(frozen=True)
class Knob:
    """One knob, declared once.

    - ``values``: what it takes; ``role``: source (renders a macro), launch or problem.
    - ``default``: the value a config takes when it is not given (default: the first value).
    - ``refine``: the greedy refinement tries knobs with a lower number first (None: after those,
      in declaration order).
    - ``experimental``: the values kept out of the default space (never won a served table entry);
      True: every value but the default. The space's walks, counts and the search take them only
      when asked; a config with one is still valid.
    - ``label`` formats the value in a config's short label (``""`` hides it; None values and the
      values in ``hidden`` are never shown: a knob added later leaves the labels of the configs
      that keep its old behaviour as they were); ``help`` says what it changes.
    - ``in_source``: whether the value is written into the source (default: every knob but a launch
      knob; a problem knob that only names the problem sets False).

    The macro is ``NF4T_<NAME>``. An enum knob (string values) is written as named constants,
    ``#define NF4T_LUT_PAIRX 4`` for every value and ``#define NF4T_LUT NF4T_LUT_PAIRX``, so templates
    compare names (``NF4T_LUT == NF4T_LUT_PAIRX``), never positions; an integer knob as its value."""

    name: str
    values: tuple
    role: str = "source"
    default: Any = _FIRST
    refine: Optional[int] = None
    experimental: Union[bool, tuple] = ()
    label: str = "{}"
    help: str = ""
    hidden: tuple = ()
    in_source: Optional[bool] = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"knob {self.name}: role {self.role!r} is not one of {ROLES}")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name) or self.name == "experimental":
            raise ValueError(f"knob {self.name!r}: a knob's name is a lower-case identifier other than 'experimental'")
        if self.default is _FIRST:
            object.__setattr__(self, "default", self.values[0])
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not one of {list(self.values)}")
        if self.in_source is None:
            object.__setattr__(self, "in_source", self.role != "launch")
        if self.in_source and self.role == "launch":
            raise ValueError(f"knob {self.name}: a launch knob is not in the source")
        if self.experimental is True:
            object.__setattr__(self, "experimental", tuple(v for v in self.values if v != self.default))
        elif self.experimental is False:
            object.__setattr__(self, "experimental", ())
        exp = tuple(self.experimental)
        object.__setattr__(self, "experimental", exp)
        if any(v not in self.values for v in exp):
            raise ValueError(f"knob {self.name}: experimental values {list(exp)} are not all of {list(self.values)}")
        if self.default in exp:
            raise ValueError(f"knob {self.name}: the default {self.default!r} cannot be experimental")
        if exp and self.role == "problem":
            raise ValueError(f"knob {self.name}: a problem knob's values are not searched, so none is experimental")
        if self.in_source:
            kinds = {type(v) for v in self.values}
            if not (kinds <= {int} or kinds <= {str}):
                raise ValueError(f"knob {self.name}: a knob in the source takes integers or names, not {kinds}")

    @property
    def macro(self) -> Optional[str]:
        """The macro the knob sets, ``NF4T_<NAME>`` (None: not in the source)."""
        return f"NF4T_{self.name.upper()}" if self.in_source else None

    @property
    def enum(self) -> bool:
        """The knob's values are names, written as named constants."""
        return bool(self.in_source) and any(isinstance(v, str) for v in self.values)

    def constant(self, value) -> str:
        """The named constant of an enum knob's value, ``NF4T_<NAME>_<VALUE>``."""
        return f"{self.macro}_{_constant_part(value)}"

    def code(self, value) -> int:
        """The integer a value is compiled as (an enum's named constant stands for its position)."""
        if self.enum:
            return self.values.index(value)
        return value

    def text(self, value):
        """What ``#define NF4T_<NAME>`` is followed by: the constant's name or the integer."""
        return self.constant(value) if self.enum else value

    def allowed(self, experimental: bool = False) -> tuple:
        """The values of the default space (all of them with ``experimental``)."""
        return self.values if experimental else tuple(v for v in self.values if v not in self.experimental)


@dataclass(frozen=True)
class Constraint:
    """A rule over some knobs: ``check(**{knob: value})`` returns why a combination is invalid,
    or None. Knobs tied by constraints are searched as one parameter. What the rule says (``nf4-tune
    space``) is ``help``, or the check's docstring."""

    knobs: tuple
    check: Callable[..., Optional[str]]
    help: str = ""

    def __post_init__(self):
        if not self.text:
            raise ValueError(f"constraint on {self.knobs}: give its check a docstring or the constraint a help text")

    @property
    def text(self) -> str:
        """The rule in one paragraph (the help, or the check's docstring)."""
        if self.help:
            return self.help
        doc = inspect.getdoc(self.check) or ""
        return " ".join(doc.split("\n\n")[0].split())

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
        return {k.name: v for k, v in zip(self.family.knobs, self.values) if k.in_source}

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

    def experimental(self) -> tuple:
        """The knobs whose value here is experimental."""
        return tuple(k.name for k, v in zip(self.family.knobs, self.values) if v in k.experimental)

    def render(self) -> str:
        return self.family.render(self)


@dataclass(frozen=True)
class SpaceCount:
    """A space's size: configs and distinct sources, exact or estimated (``error``: the half-width of
    a 95% interval; 0 when exact)."""

    configs: float
    sources: float
    exact: bool = True
    configs_error: float = 0.0
    sources_error: float = 0.0
    seconds: float = 0.0
    method: str = "computed"

    def to_dict(self) -> dict:
        d = dict(configs=self.configs, sources=self.sources, exact=self.exact, method=self.method,
                 seconds=round(self.seconds, 3))
        if not self.exact:
            d.update(configs_error=self.configs_error, sources_error=self.sources_error,
                     note="estimated (Knuth's random probes): value +- error is a 95% interval")
        return d


class Family:
    """A kernel family's declaration. Subclasses add the problem-facing parts (inputs, gate,
    launch plan, traffic, peer); the space, search parametrisation and neighbours are derived
    here from :attr:`knobs` and :attr:`constraints`."""

    #: short name, stored with every measurement
    name: str = ""
    #: the template files (kernel_templates/ paths) every variant's source starts with
    headers: tuple = ()
    #: structure -> the template files that follow the headers for it (:meth:`structure` picks one)
    structures: dict = {}
    #: read the template files from this folder instead of the package's (a test's copy)
    template_root: Optional[str] = None
    #: the kernel's extern "C" name
    kernel_name: str = ""
    #: one line for --help and the report
    title: str = ""
    knobs: tuple = ()
    constraints: tuple = ()
    #: named points of the space: name -> tunable knob values (problem knobs come from the problem)
    presets: dict = {}
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

    #: the caches :meth:`extended` drops
    _CACHED = ("knob_names", "knob_index", "groups", "defaults", "refine_order", "_group_choices_cache")

    def __init__(self):
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: duplicate knob names")
        for c in self.constraints:
            unknown = set(c.knobs) - set(names)
            if unknown:
                raise ValueError(f"family {self.name}: constraint on unknown knob(s) {sorted(unknown)}")
        defines = [k.macro for k in self.knobs if k.in_source] + list(self.constants())
        if len(set(defines)) != len(defines):
            raise ValueError(f"family {self.name}: two knobs define the same macro name")
        if not self.structures:
            raise ValueError(f"family {self.name}: no template structure declared")

    def extended(self, *, knobs: Sequence[Knob] = (), constraints: Sequence[Constraint] = (), **attrs) -> "Family":
        """A copy of this family with knobs or constraints added, or attributes replaced (tests use
        it to show that one declaration is all a new knob needs)."""
        new = copy.copy(self)
        for k in self._CACHED:
            new.__dict__.pop(k, None)
        new.knobs = tuple(self.knobs) + tuple(knobs)
        new.constraints = tuple(self.constraints) + tuple(constraints)
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

    @cached_property
    def defaults(self) -> dict:
        """Every knob's default (a config built from a partial dict takes these)."""
        return {k.name: k.default for k in self.knobs}

    @cached_property
    def refine_order(self) -> tuple:
        """The order the greedy refinement tries the tunable knobs in (their ``refine`` numbers,
        then declaration order)."""
        tunable = [(i, k) for i, k in enumerate(self.knobs) if k.role != "problem"]
        ranked = sorted(tunable, key=lambda ik: (ik[1].refine is None, ik[1].refine or 0, ik[0]))
        return tuple(k.name for _, k in ranked)

    def knob(self, name: str) -> Knob:
        return self.knobs[self.knob_index[name]]

    def source_knob_names(self) -> tuple:
        return tuple(k.name for k in self.knobs if k.in_source)

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
        """A validated config; knobs not given take their defaults."""
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

    def in_space(self, config: Config, experimental: bool = False) -> bool:
        """Whether ``config`` is a point of the default space (or, with ``experimental``, of the whole one)."""
        return experimental or not config.experimental()

    # -- the space ---------------------------------------------------------------------
    @cached_property
    def groups(self) -> tuple:
        """Tunable knobs tied by constraints, as tuples in declaration order: each group is one
        search parameter. A knob in no constraint is a group of its own."""
        return tuple(names for names, _ in _space.components(self.tunable_knob_names(), self.constraints))

    def domains(self, experimental: bool = False, **restrict) -> dict:
        """Each knob's allowed values: those ``restrict`` names (any value, experimental ones too),
        else the default space's (every value with ``experimental``)."""
        out = {}
        for name, given in restrict.items():
            if name not in self.knob_names:
                raise InvalidConfig(f"{self.name} has no knob {name!r}")
        for k in self.knobs:
            if k.name in restrict:
                given = restrict[k.name]
                given = tuple(given) if isinstance(given, (list, tuple, set, frozenset)) else (given,)
                bad = [v for v in given if v not in k.values]
                if bad:
                    raise InvalidConfig(f"{k.name} {bad} not in {list(k.values)}")
                out[k.name] = tuple(v for v in k.values if v in given)
            else:
                out[k.name] = k.allowed(experimental)
        return out

    def _group_choices(self, group: tuple, fixed: dict, domains: dict) -> list[tuple]:
        """Valid value combinations of ``group`` given fixed problem knob values (constraints that
        involve only the group's knobs and problem knobs), each knob within ``domains``."""
        gset = set(group)
        relevant = sorted({k for c in self.constraints if set(c.knobs) & gset for k in c.knobs if k in fixed})
        key = (group, tuple((k, fixed[k]) for k in relevant), tuple(domains[k] for k in group))
        cache = self.__dict__.setdefault("_group_choices_cache", {})
        if key not in cache:
            cache[key] = self._walk_group(group, {k: fixed[k] for k in relevant}, domains)
        return cache[key]

    def _walk_group(self, group: tuple, fixed: dict, domains: dict) -> list[tuple]:
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
        doms = [domains[k] for k in order]
        values = dict(fixed)
        found: list = []
        chosen: list = []

        def walk(d):
            if d == len(order):
                found.append(tuple(chosen))
                return
            name = order[d]
            for i, v in enumerate(doms[d]):
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
        vals = [domains[k] for k in group]
        return [tuple(vals[j][i] for j, i in enumerate(t)) for t in idx]

    def iter_space(self, experimental: bool = False, **restrict) -> Iterator[Config]:
        """Every valid config of the default space (with ``experimental``: of the whole space); any
        knob may be restricted to some of its values, e.g. ``dtype=["bf16"]`` or ``warps=[4, 8]``
        (a value named here is taken even if experimental)."""
        domains = self.domains(experimental, **restrict)
        problem = [k.name for k in self.knobs if k.role == "problem"]
        for pvals in itertools.product(*(domains[n] for n in problem)):
            fixed = dict(zip(problem, pvals))
            per_group = [self._group_choices(g, fixed, domains) for g in self.groups]
            for combos in itertools.product(*per_group):
                values = dict(fixed)
                for g, combo in zip(self.groups, combos):
                    values.update(zip(g, combo))
                yield Config(self, self.name, tuple(values[n] for n in self.knob_names))

    def _components(self, experimental: bool, restrict: dict) -> list:
        domains = self.domains(experimental, **restrict)
        hidden = {k.name for k in self.knobs if not k.in_source}
        return [_space.Component(names, domains, cons, hidden)
                for names, cons in _space.components(self.knob_names, self.constraints)]

    def space_size(self, experimental: bool = False, **restrict) -> int:
        """How many valid configs there are, counted exactly from the constraint structure (not walked)."""
        return math.prod(c.count() for c in self._components(experimental, restrict))

    def count(self, experimental: bool = False, budget: Optional[int] = 2_000_000, seconds: float = 2.0,
              probes: int = 200_000, **restrict) -> SpaceCount:
        """The space's configs and distinct sources (:mod:`.space`): exact where the count takes at
        most ``budget`` steps per component, else estimated by random probes (at most ``probes``, for
        about ``seconds``; a fixed seed, so the same probes give the same estimate)."""
        t0 = time.perf_counter()
        configs, sources = [], []
        exact = True
        for comp in self._components(experimental, restrict):
            for out, src in ((configs, False), (sources, True)):
                comp.steps = 0
                try:
                    out.append(comp.count(sources=src, budget=budget))
                except _space.BudgetExceeded:
                    exact = False
                    out.append(comp.estimate(sources=src, seconds=seconds / 2, max_probes=probes))
        if exact:
            return SpaceCount(math.prod(configs), math.prod(sources), seconds=time.perf_counter() - t0)
        (cv, ce), (sv, se) = _space.combine_estimates(configs), _space.combine_estimates(sources)
        return SpaceCount(cv, sv, exact=False, configs_error=ce, sources_error=se,
                          seconds=time.perf_counter() - t0, method="estimated")

    def iter_sources(self, experimental: bool = False, **restrict) -> Iterator[Config]:
        """One valid config per distinct source of the space (restricted as :meth:`iter_space`),
        without walking the configs that only differ in launch knobs or problem knobs outside the
        source: each source's launch and unrendered problem knobs take their first values (in the
        knobs' order) that make it valid."""
        parts = [list(c.iter_sources()) for c in self._components(experimental, restrict)]
        for combo in itertools.product(*parts):
            values = {}
            for d in combo:
                values.update(d)
            yield Config(self, self.name, tuple(values[n] for n in self.knob_names))

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
        of the cost of compiling every source."""
        if strength < 1:
            raise ValueError(f"strength must be at least 1, not {strength}")
        reps = list(self.distinct_sources(configs).items())
        # only the knobs that vary among the sources make combinations worth covering
        vary = [i for i in range(len(reps[0][0])) if len({key[i] for key, _ in reps}) > 1] if reps else []
        picked = _greedy_cover([set(itertools.combinations([key[i] for i in vary], min(strength, len(vary))))
                                for key, _ in reps])
        return [reps[i][1] for i in picked]

    def covering_configs(self, strength: int = 2, experimental: bool = False, **restrict) -> list:
        """Configs for a test that runs them (the GPU gate): a ``strength``-wise covering sample of
        the distinct sources (:meth:`covering_sources` over :meth:`iter_sources`), each completed
        with the launch and unrendered problem knobs (e.g. warps, split-K, the batch bucket) that
        pair the most values not yet paired: every value of those knobs a covered source can take
        appears, with as many other knobs' values as the sample allows."""
        sources = self.covering_sources(self.iter_sources(experimental, **restrict), strength)
        domains = self.domains(experimental, **restrict)
        free = [k.name for k in self.knobs if not k.in_source]
        seen: set = set()
        out = []
        for src in sources:
            base = src.to_dict()
            best = None
            for combo in itertools.product(*(domains[n] for n in free)):
                values = {**base, **dict(zip(free, combo))}
                if self.violation(values) is not None:
                    continue
                pairs = {((a, values[a]), (b, values[b])) for a in free for b in self.knob_names if b != a}
                gain = len(pairs - seen)
                if best is None or gain > best[0]:
                    best = (gain, values, pairs)
            _, values, pairs = best
            seen |= pairs
            out.append(Config(self, self.name, tuple(values[n] for n in self.knob_names)))
        return out

    # -- search parametrisation --------------------------------------------------------
    @staticmethod
    def _choice_text(combo: tuple) -> str:
        return "/".join("None" if v is None else str(v) for v in combo)

    def param_name(self, group: tuple) -> str:
        return "+".join(group)

    def search_space(self, problem, experimental: bool = False) -> dict:
        """optuna parameters -> choices for ``problem``: their product is exactly the valid space
        of the problem's problem-knob values (the default space, or with ``experimental`` the whole)."""
        fixed = self.problem_values(problem)
        domains = self.domains(experimental, **{k: [v] for k, v in fixed.items()})
        return {self.param_name(g): [self._choice_text(c) for c in self._group_choices(g, fixed, domains)]
                for g in self.groups}

    def config_from_params(self, params: dict, problem) -> Config:
        """The config of a search's parameters (choice texts of :meth:`search_space`, default or whole)."""
        values = dict(self.problem_values(problem))
        for g in self.groups:
            name = self.param_name(g)
            text = params[name]
            parts = text.split("/") if isinstance(text, str) else []
            if len(parts) != len(g):
                raise InvalidConfig(f"{name}={text!r} is not a choice of the search space")
            for knob, part in zip(g, parts):
                match = [v for v in self.knob(knob).values if ("None" if v is None else str(v)) == part]
                if not match:
                    raise InvalidConfig(f"{name}={text!r} is not a choice of the search space")
                values[knob] = match[0]
        try:
            return self.config(**values)
        except InvalidConfig as e:
            raise InvalidConfig(f"the parameters are not a choice of the search space: {e}") from None

    def params_from_config(self, config: Config) -> dict:
        return {self.param_name(g): self._choice_text(tuple(getattr(config, k) for k in g)) for g in self.groups}

    def grid_size(self, problem, experimental: bool = False) -> int:
        return math.prod(len(v) for v in self.search_space(problem, experimental).values())

    # -- refinement --------------------------------------------------------------------
    def neighbours(self, config: Config, experimental: bool = False) -> list[Config]:
        """Valid configs one knob step from ``config``, the most promising first: one knob changed
        (knobs in :attr:`refine_order`, values nearest the current first), then two knobs of one
        constraint group changed together (moves one knob alone cannot make, such as a grid
        change that needs its CTA count). The moves of the greedy refinement that ends a search;
        within the default space unless ``experimental``."""
        order = list(self.refine_order)
        rank = {k: i for i, k in enumerate(order)}
        current = config.to_dict()
        allowed = {k.name: set(k.allowed(experimental)) for k in self.knobs}

        def nearest(knob):
            vals = list(self.knob(knob).values)
            i = vals.index(current[knob])
            return sorted((v for v in vals if v != current[knob] and v in allowed[knob]),
                          key=lambda v: (abs(vals.index(v) - i), vals.index(v)))

        out: list = []
        seen = {config}

        def add(changes):
            values = {**current, **changes}
            if any(values[k] not in allowed[k] for k in self.tunable_knob_names()):
                return
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
    def constants(self) -> dict:
        """The named values of the enum knobs in the source: ``NF4T_<KNOB>_<VALUE>`` -> integer."""
        return {k.constant(v): k.code(v) for k in self.knobs if k.enum for v in k.values}

    def macros(self, config: Config) -> dict:
        """What ``#define NF4T_<KNOB>`` is followed by for each knob in the source: an enum's named
        constant, or the integer."""
        return {k.macro: k.text(getattr(config, k.name)) for k in self.knobs if k.in_source}

    def structure(self, config: Config) -> str:
        """The structure (a key of :attr:`structures`) ``config``'s source takes; one-structure
        families have only that one."""
        if len(self.structures) == 1:
            return next(iter(self.structures))
        raise NotImplementedError(f"family {self.name}: which of {list(self.structures)} a config takes")

    def template_files(self, config: Config) -> tuple:
        """The template files joined, in order, into ``config``'s source."""
        return tuple(self.headers) + tuple(self.structures[self.structure(config)])

    def all_template_files(self) -> tuple:
        """Every template file of the family, each once, headers first."""
        return tuple(dict.fromkeys(tuple(self.headers) + tuple(f for fs in self.structures.values() for f in fs)))

    def render(self, config: Config) -> str:
        from nf4tune.kernel_templates import render

        return render(self.template_files(config), self.macros(config), self.constants(), root=self.template_root)

    def template_hash(self) -> str:
        """SHA-256 of every template file of the family: changes whenever any of its sources changes."""
        from nf4tune.kernel_templates import template_hash

        return template_hash(self.all_template_files(), root=self.template_root)

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


def _greedy_cover(combos: list) -> list:
    """Indices of a greedy cover of the union of the sets ``combos``: each pick the set with the
    most elements not yet covered (ties to the lower index); sorted."""
    uncovered = set().union(*combos) if combos else set()
    heap = [(-len(c), i) for i, c in enumerate(combos)]
    heapq.heapify(heap)
    picked = []
    while uncovered:
        _, i = heapq.heappop(heap)
        gain = len(combos[i] & uncovered)
        if heap and gain < -heap[0][0]:          # stale: another set may cover more now
            if gain:
                heapq.heappush(heap, (-gain, i))
            continue
        picked.append(i)
        uncovered -= combos[i]
    return sorted(picked)
