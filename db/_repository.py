"""The small repository API over the tables: everything the CLI and library store or read."""

from __future__ import annotations

import datetime as dt
import json
from typing import Optional

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ._engine import Database
from ._models import GPU, Environment, Flag, KernelConfigRow, Measurement, Run, _now


def _shape_text(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _canonical(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


class Repository:
    """Reads and writes through one :class:`~db.Database`; every call is its own transaction,
    so a killed process loses nothing that a call had returned from."""

    def __init__(self, database: Database):
        self.db = database

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

    def config(self, knobs: dict, template_hash: str) -> KernelConfigRow:
        return self._get_or_create(KernelConfigRow, dict(knobs=_canonical(knobs), template_hash=template_hash))

    # -- runs and measurements ---------------------------------------------------------
    def start_run(self, kind: str, gpu: GPU, environment: Environment, command: str = "") -> Run:
        if kind not in ("search", "bench", "regress"):
            raise ValueError(f"run kind {kind!r} is not search, bench or regress")
        with self.db.session() as s:
            run = Run(kind=kind, gpu_id=gpu.id, environment_id=environment.id, command=command, started_at=_now())
            s.add(run)
            s.flush()
            return run

    def finish_run(self, run: Run) -> None:
        with self.db.session() as s:
            row = s.get(Run, run.id)
            row.ended_at = _now()

    def add_measurement(self, run: Run, problem: dict, result: dict, config_row: Optional[KernelConfigRow] = None,
                        gpu_state: Optional[dict] = None, bnb_median_us: Optional[float] = None) -> Measurement:
        """Store one result (a :class:`tuner.bench.BenchResult` as a dict) for ``problem``."""
        st = gpu_state or {}
        with self.db.session() as s:
            m = Measurement(
                run_id=run.id, config_id=config_row.id if config_row else None, label=result["label"][:128],
                shape=_shape_text(problem["shape"]), dtype=problem["dtype"], quant=problem["quant"],
                blocksize=int(problem["blocksize"]), status=result["status"], reason=result.get("reason") or "",
                samples_us=list(result.get("samples_us") or []), median_us=result.get("median_us"),
                iqr_us=result.get("iqr_us"), gbps=result.get("gbps"), pct_copy=result.get("pct_copy"),
                bnb_median_us=bnb_median_us, speedup=result.get("speedup_vs_bnb"),
                sm_clock_mhz=st.get("sm_clock_mhz"), mem_clock_mhz=st.get("mem_clock_mhz"),
                temperature_c=st.get("temperature_c"), registers=result.get("registers"))
            s.add(m)
            s.flush()
            return m

    # -- queries -----------------------------------------------------------------------
    def _problem_filter(self, stmt, problem: dict):
        return stmt.where(Measurement.shape == _shape_text(problem["shape"]), Measurement.dtype == problem["dtype"],
                          Measurement.quant == problem["quant"], Measurement.blocksize == int(problem["blocksize"]))

    def measurement_of(self, gpu_name: str, problem: dict, knobs: dict, template_hash: str) -> Optional[Measurement]:
        """The latest measurement of this config on this GPU model and problem, if any."""
        with self.db.session() as s:
            stmt = (select(Measurement).join(Run).join(GPU).join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .where(GPU.name == gpu_name, KernelConfigRow.knobs == _canonical(knobs),
                           KernelConfigRow.template_hash == template_hash))
            stmt = self._problem_filter(stmt, problem).order_by(Measurement.id.desc())
            return s.scalars(stmt).first()

    def best(self, gpu_name: Optional[str], problem: dict) -> Optional[tuple[dict, Measurement, str]]:
        """(knobs, measurement, gpu name) of the fastest valid config stored for ``problem``."""
        with self.db.session() as s:
            stmt = (select(Measurement, KernelConfigRow.knobs, GPU.name).join(Run, Measurement.run_id == Run.id)
                    .join(GPU, Run.gpu_id == GPU.id)
                    .join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                    .where(Measurement.status == "ok"))
            if gpu_name:
                stmt = stmt.where(GPU.name == gpu_name)
            stmt = self._problem_filter(stmt, problem).order_by(Measurement.median_us.asc())
            row = s.execute(stmt).first()
            if row is None:
                return None
            m, knobs, gname = row
            return json.loads(knobs), m, gname

    def reference_medians(self, gpu_name: str, problem: dict, label: str) -> list[float]:
        """Every stored median of the reference ``label`` (e.g. bnb) for this GPU model and problem."""
        with self.db.session() as s:
            stmt = (select(Measurement.median_us).join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .where(GPU.name == gpu_name, Measurement.label == label, Measurement.median_us.is_not(None)))
            return [v for (v,) in s.execute(self._problem_filter(stmt, problem))]

    def problems(self, gpu_name: Optional[str] = None) -> list[tuple[str, dict]]:
        """(gpu name, problem) pairs that have at least one valid measurement."""
        with self.db.session() as s:
            stmt = (select(GPU.name, Measurement.shape, Measurement.dtype, Measurement.quant, Measurement.blocksize)
                    .join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .where(Measurement.status == "ok", Measurement.config_id.is_not(None)).distinct())
            if gpu_name:
                stmt = stmt.where(GPU.name == gpu_name)
            out = []
            for g, shape, dtype, quant, bs in s.execute(stmt):
                out.append((g, dict(shape=tuple(int(d) for d in shape.split("x")), dtype=dtype, quant=quant,
                                    blocksize=bs)))
            return sorted(out, key=lambda t: (t[0], t[1]["shape"], t[1]["dtype"], t[1]["quant"], t[1]["blocksize"]))

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

    # -- regression flags --------------------------------------------------------------
    def add_flag(self, run: Run, problem: dict, verdict: dict, measurement: Optional[Measurement] = None) -> Flag:
        """Store one night's verdict (a :class:`tuner.regression.Verdict` as a dict) for ``problem``."""
        with self.db.session() as s:
            f = Flag(run_id=run.id, measurement_id=measurement.id if measurement else None,
                     shape=_shape_text(problem["shape"]), dtype=problem["dtype"], quant=problem["quant"],
                     blocksize=int(problem["blocksize"]), flag=verdict["flag"], speedup=verdict.get("speedup"),
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

    def regress_history(self, gpu_name: str, problem: dict) -> list[dict]:
        """Past nights of ``problem`` on this GPU model, oldest first: the flag, the tuned
        measurement it judged (samples, config), bnb's measurement of the same run, and the
        run's environment."""
        with self.db.session() as s:
            stmt = (select(Flag, Run, Environment).join(Run, Flag.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                    .join(Environment, Run.environment_id == Environment.id)
                    .where(GPU.name == gpu_name, Flag.shape == _shape_text(problem["shape"]),
                           Flag.dtype == problem["dtype"], Flag.quant == problem["quant"],
                           Flag.blocksize == int(problem["blocksize"]))
                    .order_by(Run.id, Flag.id))
            nights = []
            for flag, run, env in s.execute(stmt):
                tuned = s.get(Measurement, flag.measurement_id) if flag.measurement_id else None
                bnb = s.scalars(self._problem_filter(select(Measurement), problem)
                                .where(Measurement.run_id == run.id, Measurement.label == "bnb dequantize_4bit")
                                .order_by(Measurement.id)).first()
                knobs = None
                if tuned is not None and tuned.config_id is not None:
                    knobs = s.get(KernelConfigRow, tuned.config_id).knobs
                nights.append(dict(
                    run_id=run.id, flag=flag.flag, started_at=run.started_at,
                    tuned_us=list(tuned.samples_us) if tuned else [], bnb_us=list(bnb.samples_us) if bnb else [],
                    config=knobs, env={k: getattr(env, k) for k in ("project_version", "git_commit", "nvrtc",
                                                                     "driver", "cuda_python", "bnb", "torch")}))
            return nights
