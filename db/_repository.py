"""The repository API over the tables: everything the library, the CLI, ``reports/`` and ``ci/``
store or read. All SQL of the project lives here. Problems go in and come out as
:class:`nf4tune.vocabulary.Problem` values."""

from __future__ import annotations

import json
from typing import Optional

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from nf4tune.vocabulary import Problem

from ._engine import Database
from ._models import GPU, Environment, Flag, KernelConfigRow, Measurement, Run, _now

RUN_KINDS = ("search", "bench", "regress")
ENV_FIELDS = ("project_version", "git_commit", "nvrtc", "driver", "cuda_python", "bnb", "torch")


def _canonical(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


def _problem_of(row) -> Problem:
    """The problem of a Measurement or Flag row."""
    return Problem(tuple(int(d) for d in row.shape.split("x")), row.dtype, row.quant, row.blocksize,
                   row.family or "dequant", row.m)


def _problem_columns(problem: Problem) -> dict:
    return dict(family=problem.family, shape=problem.shape_text, dtype=problem.dtype, quant=problem.quant,
                blocksize=problem.blocksize, m=problem.m)


def _where_problem(stmt, model, problem: Problem):
    stmt = stmt.where(model.family == problem.family, model.shape == problem.shape_text,
                      model.dtype == problem.dtype, model.quant == problem.quant,
                      model.blocksize == problem.blocksize)
    return stmt.where(model.m.is_(None)) if problem.m is None else stmt.where(model.m == problem.m)


class Repository:
    """Reads and writes through one :class:`~db.Database`; every call is its own transaction,
    so a killed process loses nothing that a call had returned from."""

    def __init__(self, database: Database):
        self.db = database

    @property
    def url(self) -> str:
        return self.db.url

    # -- get-or-create -----------------------------------------------------------------
    def _get_or_create(self, model, lookup: dict, extra: Optional[dict] = None):
        with self.db.session() as s:
            row = s.scalars(select(model).filter_by(**lookup)).first()
            if row is not None:
                if extra:
                    for k, v in extra.items():
                        if v is not None:
                            setattr(row, k, v)
                return row
        try:
            with self.db.session() as s:
                row = model(**lookup, **(extra or {}))
                s.add(row)
                s.flush()
                return row
        except IntegrityError:  # another worker created it first
            with self.db.session() as s:
                return s.scalars(select(model).filter_by(**lookup)).one()

    def gpu(self, name: str, compute_capability: str, sm_count: int, memory_bytes: int, l2_bytes: int,
            copy_gbps: Optional[float] = None) -> GPU:
        return self._get_or_create(GPU, dict(name=name, compute_capability=compute_capability, sm_count=sm_count,
                                             memory_bytes=memory_bytes), dict(l2_bytes=l2_bytes, copy_gbps=copy_gbps))

    def environment(self, **versions) -> Environment:
        return self._get_or_create(Environment, versions)

    def config(self, knobs: dict, template_hash: str, family: str = "dequant") -> KernelConfigRow:
        return self._get_or_create(KernelConfigRow, dict(knobs=_canonical(knobs), template_hash=template_hash),
                                   dict(family=family))

    # -- runs and measurements ---------------------------------------------------------
    def start_run(self, kind: str, gpu: GPU, environment: Environment, command: str = "") -> Run:
        if kind not in RUN_KINDS:
            raise ValueError(f"run kind {kind!r} is not one of {', '.join(RUN_KINDS)}")
        with self.db.session() as s:
            run = Run(kind=kind, gpu_id=gpu.id, environment_id=environment.id, command=command, started_at=_now())
            s.add(run)
            s.flush()
            return run

    def finish_run(self, run: Run) -> None:
        with self.db.session() as s:
            row = s.get(Run, run.id)
            row.ended_at = _now()

    def add_measurement(self, run: Run, problem: Problem, result: dict, config_row: Optional[KernelConfigRow] = None,
                        gpu_state: Optional[dict] = None, bnb_median_us: Optional[float] = None) -> Measurement:
        """Store one result (a :class:`nf4tune.measure.bench.BenchResult` as a dict) for ``problem``."""
        st = gpu_state or {}
        with self.db.session() as s:
            m = Measurement(
                run_id=run.id, config_id=config_row.id if config_row else None, label=result["label"][:128],
                **_problem_columns(problem), status=result["status"], reason=result.get("reason") or "",
                samples_us=list(result.get("samples_us") or []), median_us=result.get("median_us"),
                iqr_us=result.get("iqr_us"), gbps=result.get("gbps"), pct_copy=result.get("pct_copy"),
                bnb_median_us=bnb_median_us, speedup=result.get("speedup_vs_bnb"),
                sm_clock_mhz=st.get("sm_clock_mhz"), mem_clock_mhz=st.get("mem_clock_mhz"),
                temperature_c=st.get("temperature_c"), registers=result.get("registers"))
            s.add(m)
            s.flush()
            return m

    # -- queries -----------------------------------------------------------------------
    def measurement_of(self, gpu_name: str, problem: Problem, knobs: dict, template_hash: str) -> Optional[Measurement]:
        """The latest measurement of this config on this GPU model and problem, if any."""
        with self.db.session() as s:
            stmt = (select(Measurement).join(Run).join(GPU).join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .where(GPU.name == gpu_name, KernelConfigRow.knobs == _canonical(knobs),
                           KernelConfigRow.template_hash == template_hash))
            stmt = _where_problem(stmt, Measurement, problem).order_by(Measurement.id.desc())
            return s.scalars(stmt).first()

    def best(self, gpu_name: Optional[str], problem: Problem, keep=None) -> Optional[tuple[dict, Measurement, str]]:
        """(knobs, measurement, gpu name) of the fastest valid config stored for ``problem`` (with ``keep``: the
        fastest whose knobs ``keep(knobs)`` takes)."""
        with self.db.session() as s:
            stmt = (select(Measurement, KernelConfigRow.knobs, GPU.name).join(Run, Measurement.run_id == Run.id)
                    .join(GPU, Run.gpu_id == GPU.id)
                    .join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .where(Measurement.status == "ok"))
            if gpu_name:
                stmt = stmt.where(GPU.name == gpu_name)
            stmt = _where_problem(stmt, Measurement, problem).order_by(Measurement.median_us.asc(), Measurement.id)
            for m, knobs, gname in s.execute(stmt):          # fastest first: without keep, the first row
                knobs = json.loads(knobs)
                if keep is None or keep(knobs):
                    return knobs, m, gname
            return None

    def reference_medians(self, gpu_name: str, problem: Problem, label: str) -> list[float]:
        """Every stored median of the reference ``label`` (e.g. bnb) for this GPU model and problem."""
        with self.db.session() as s:
            stmt = (select(Measurement.median_us).join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .where(GPU.name == gpu_name, Measurement.label == label, Measurement.median_us.is_not(None)))
            return [v for (v,) in s.execute(_where_problem(stmt, Measurement, problem))]

    def problems(self, gpu_name: Optional[str] = None, family: Optional[str] = None) -> list[tuple[str, Problem]]:
        """(gpu name, problem) pairs that have at least one valid measurement of a config."""
        with self.db.session() as s:
            stmt = (select(GPU.name, Measurement.family, Measurement.shape, Measurement.dtype, Measurement.quant,
                           Measurement.blocksize, Measurement.m)
                    .join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .where(Measurement.status == "ok", Measurement.config_id.is_not(None)).distinct())
            if gpu_name:
                stmt = stmt.where(GPU.name == gpu_name)
            if family:
                stmt = stmt.where(Measurement.family == family)
            out = [(g, Problem(tuple(int(d) for d in shape.split("x")), dtype, quant, bs, fam or "dequant", m))
                   for g, fam, shape, dtype, quant, bs, m in s.execute(stmt)]
            return sorted(out, key=lambda t: (t[0], t[1].sort_key()))

    def measurements(self, run_id: Optional[int] = None) -> list[Measurement]:
        with self.db.session() as s:
            stmt = select(Measurement).order_by(Measurement.id)
            if run_id is not None:
                stmt = stmt.where(Measurement.run_id == run_id)
            return list(s.scalars(stmt))

    def runs(self, kind: Optional[str] = None) -> list[Run]:
        with self.db.session() as s:
            stmt = select(Run).order_by(Run.id)
            if kind:
                stmt = stmt.where(Run.kind == kind)
            return list(s.scalars(stmt))

    def config_measurements(self, gpu_name: str, problem: Problem) -> list[tuple[Measurement, KernelConfigRow, Run]]:
        """Every valid measurement of a config for ``problem`` on this GPU model, with its config
        row and run (what ci/plant_slow_config.py picks from)."""
        with self.db.session() as s:
            stmt = (select(Measurement, KernelConfigRow, Run).join(Run, Measurement.run_id == Run.id)
                    .join(GPU, Run.gpu_id == GPU.id)
                    .join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .where(GPU.name == gpu_name, Measurement.status == "ok"))
            return [tuple(r) for r in s.execute(_where_problem(stmt, Measurement, problem).order_by(Measurement.id))]

    def run_context(self, run_id: int) -> tuple[GPU, Environment]:
        """The GPU and environment rows of a run."""
        with self.db.session() as s:
            run = s.get(Run, run_id)
            return s.get(GPU, run.gpu_id), s.get(Environment, run.environment_id)

    # -- regression flags --------------------------------------------------------------
    def add_flag(self, run: Run, problem: Problem, verdict: dict, measurement: Optional[Measurement] = None) -> Flag:
        """Store one night's verdict (a :class:`nf4tune.track.regression.Verdict` as a dict) for ``problem``."""
        with self.db.session() as s:
            f = Flag(run_id=run.id, measurement_id=measurement.id if measurement else None,
                     **_problem_columns(problem), flag=verdict["flag"], speedup=verdict.get("speedup"),
                     baseline_speedup=verdict.get("baseline_speedup"), drop=verdict.get("drop"),
                     threshold=verdict.get("threshold"), p_value=verdict.get("p_value"),
                     changes=verdict.get("changes") or {}, reason=verdict.get("reason") or "")
            s.add(f)
            s.flush()
            return f

    def flags(self, run_id: Optional[int] = None) -> list[Flag]:
        with self.db.session() as s:
            stmt = select(Flag).order_by(Flag.id)
            if run_id is not None:
                stmt = stmt.where(Flag.run_id == run_id)
            return list(s.scalars(stmt))

    def regress_history(self, gpu_name: str, problem: Problem, peer_label: str) -> list[dict]:
        """Past nights of ``problem`` on this GPU model, oldest first: the flag, the tuned
        measurement it judged (samples, config), the peer's (``peer_label``) measurement of the
        same run, and the run's environment."""
        with self.db.session() as s:
            stmt = (select(Flag, Run, Environment).join(Run, Flag.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .join(Environment, Run.environment_id == Environment.id).where(GPU.name == gpu_name))
            stmt = _where_problem(stmt, Flag, problem).order_by(Run.id, Flag.id)
            nights = []
            for flag, run, env in s.execute(stmt):
                tuned = s.get(Measurement, flag.measurement_id) if flag.measurement_id else None
                # the peer measured beside the judged measurement: a report stores its references
                # before its candidates, so the last peer row before the tuned one (a night
                # judged on a re-measurement has two)
                peers = (_where_problem(select(Measurement), Measurement, problem)
                         .where(Measurement.run_id == run.id, Measurement.label == peer_label))
                peer = None
                if tuned is not None:
                    peer = s.scalars(peers.where(Measurement.id < tuned.id).order_by(Measurement.id.desc())).first()
                if peer is None:
                    peer = s.scalars(peers.order_by(Measurement.id)).first()
                knobs = None
                if tuned is not None and tuned.config_id is not None:
                    knobs = s.get(KernelConfigRow, tuned.config_id).knobs
                nights.append(dict(
                    run_id=run.id, flag=flag.flag, started_at=run.started_at,
                    tuned_us=list(tuned.samples_us) if tuned else [], bnb_us=list(peer.samples_us) if peer else [],
                    bnb_iqr_us=peer.iqr_us if peer else None, bnb_median_us=peer.median_us if peer else None,
                    bnb_reason=peer.reason if peer else "",
                    config=knobs, env={k: getattr(env, k) for k in ENV_FIELDS}))
            return nights

    # -- what the report reads -----------------------------------------------------------
    @property
    def display_url(self) -> str:
        """The database's URL with any password hidden (what a report may print)."""
        from sqlalchemy.engine import make_url

        try:
            return make_url(self.db.url).render_as_string(hide_password=True)
        except Exception:   # not a URL SQLAlchemy parses: print nothing of it past the scheme
            return self.db.url.split("://", 1)[0] + "://..."

    def report_rows(self) -> dict:
        """Everything ``reports/`` draws, as plain values: every measurement with its run, GPU
        and config; every flag with its judged measurement; every run with its environment and
        GPU. Rows whose problem cannot be read (a shape that is not ROWSxCOLS) are not
        returned with the others but listed under ``unreadable`` (table, id, shape)."""
        unreadable = []

        def problem(row, table):
            try:
                return _problem_of(row)
            except (TypeError, ValueError):
                unreadable.append(dict(table=table, id=row.id, shape=row.shape, dtype=row.dtype))
                return None

        with self.db.session() as s:
            meas = []
            for m, run, gpu, knobs in s.execute(
                    select(Measurement, Run, GPU, KernelConfigRow.knobs)
                    .join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .outerjoin(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .order_by(Measurement.id)):
                prob = problem(m, "measurements")
                if prob is None:
                    continue
                meas.append(dict(
                    id=m.id, run=run.id, run_kind=run.kind, started=run.started_at, gpu=gpu.name,
                    problem=prob, label=m.label, status=m.status, reason=m.reason,
                    median_us=m.median_us, iqr_us=m.iqr_us, samples_us=list(m.samples_us or []), gbps=m.gbps,
                    pct_copy=m.pct_copy, speedup=m.speedup, bnb_median_us=m.bnb_median_us,
                    config=json.loads(knobs) if knobs else None, registers=m.registers,
                    sm_clock_mhz=m.sm_clock_mhz, temperature_c=m.temperature_c))
            flags = []
            for f, gname, tuned_us, tuned_iqr, knobs in s.execute(
                    select(Flag, GPU.name, Measurement.median_us, Measurement.iqr_us, KernelConfigRow.knobs)
                    .join(Run, Flag.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .outerjoin(Measurement, Flag.measurement_id == Measurement.id)
                    .outerjoin(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .order_by(Flag.id)):
                prob = problem(f, "flags")
                if prob is None:
                    continue
                flags.append(dict(
                    id=f.id, gpu=gname, problem=prob, run=f.run_id, flag=f.flag, tuned_us=tuned_us,
                    tuned_iqr_us=tuned_iqr, speedup=f.speedup, baseline_speedup=f.baseline_speedup, drop=f.drop,
                    threshold=f.threshold, p_value=f.p_value, changes=f.changes or {}, reason=f.reason,
                    measurement_id=f.measurement_id, config=json.loads(knobs) if knobs else None))
            runs = []
            for run, gpu, env in s.execute(select(Run, GPU, Environment).join(GPU, Run.gpu_id == GPU.id)
                                           .join(Environment, Run.environment_id == Environment.id)
                                           .order_by(Run.id)):
                runs.append(dict(run=run.id, kind=run.kind, started=run.started_at, ended=run.ended_at,
                                 command=run.command, gpu=gpu.name, compute_capability=gpu.compute_capability,
                                 **{k: getattr(env, k) for k in ENV_FIELDS}))
            return dict(measurements=meas, flags=flags, runs=runs, unreadable=unreadable)
