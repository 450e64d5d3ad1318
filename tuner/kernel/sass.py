"""The SASS of a compiled variant, read on the CPU: disassemble a CUBIN with nvdisasm and find its
loops (a backward branch), with each loop's static length, the length of the path that takes the
first arm of every if/else inside it (the instructions between an unconditional forward branch and
its target are the other arm: in the matmul loops, the bounds-checked loads of a partial step), and
the instruction mix of that path. Used to count what a step of a kernel's loop costs before (or
without) a GPU (ci/sass_loops.py).

:func:`w_bytes_per_instruction` is the instruction density of a matmul kernel's steady-state main loop:
bytes of W its warps retire per warp-instruction issued (:func:`steady_loop` says which loop that is)."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"^(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(?:\w+,\s*)?`\((\.L_x_\d+)\)")


@dataclass(frozen=True)
class Loop:
    start: int          # index of the loop's first instruction
    end: int            # index of its backward branch
    static: int         # instructions in the body
    path: int           # instructions on the first arms
    mix: tuple          # (opcode, count) on the first arms, most frequent first


def find_nvdisasm() -> str:
    """nvdisasm on PATH, or the one pip's nvidia-cuda-nvdisasm installs; FileNotFoundError if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for cand in sorted(Path(root).glob("*/bin/nvdisasm")):
            return str(cand)
    raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or put it on PATH")


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([find_nvdisasm(), "-c", "-g", str(path)], capture_output=True, text=True,
                              check=True).stdout


def instructions(sass: str) -> tuple:
    """(the instructions in order, {label: index of the instruction after it})"""
    ins, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INSN.match(line)
        if m:
            ins.append(m.group(2))
    return ins, labels


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def loops(sass: str, min_len: int = 100) -> list:
    """Every loop of at least ``min_len`` static instructions, in the order of their backward branches."""
    ins, labels = instructions(sass)
    found = []
    for i, text in enumerate(ins):
        m = _BRANCH.match(text)
        if not (m and labels.get(m.group(3), i) < i and i - labels[m.group(3)] + 1 >= min_len):
            continue
        start = labels[m.group(3)]
        skipped = set()
        for j in range(start, i + 1):
            b = _BRANCH.match(ins[j])
            if b and not b.group(1) and j < labels.get(b.group(3), -1) <= i:
                skipped.update(range(j + 1, labels[b.group(3)]))
        path = [ins[j] for j in range(start, i + 1) if j not in skipped]
        mix = collections.Counter(opcode(t) for t in path).most_common()
        found.append(Loop(start, i, i - start + 1, len(path), tuple(mix)))
    return found


# ----------------------------------------------------------------------------- bytes of W per warp-instruction
_GLOBAL_LOAD = re.compile(r"^(@!?U?P\w+\s+)?LDG(\.\w+)*\s")
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def load_width(text: str) -> int:
    """Bytes one lane's global load (an LDG) reads: 1, 2, 4 (no width modifier), 8 or 16."""
    mods = opcode_modifiers(text)
    return next((_WIDTH[m] for m in mods if m in _WIDTH), 4)


def opcode_modifiers(text: str) -> tuple:
    """The modifiers of an instruction's opcode (``LDG.E.NA.128.CONSTANT`` -> ``("E", "NA", "128", "CONSTANT")``)."""
    return tuple(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[1:])


def is_w_load(text: str) -> bool:
    """A streaming load of W: a global load with L1::no_allocate (SASS ``.NA``); the matmul templates load
    nothing else with that qualifier (NF4T_WLOAD_STREAM)."""
    return bool(_GLOBAL_LOAD.match(text)) and "NA" in opcode_modifiers(text)


def path_instructions(sass: str, loop: Loop) -> list:
    """The instructions of ``loop``'s first-arm path, in order (what :attr:`Loop.path` counts)."""
    ins, labels = instructions(sass)
    skipped = set()
    for j in range(loop.start, loop.end + 1):
        b = _BRANCH.match(ins[j])
        if b and not b.group(1) and j < labels.get(b.group(3), -1) <= loop.end:
            skipped.update(range(j + 1, labels[b.group(3)]))
    return [ins[j] for j in range(loop.start, loop.end + 1) if j not in skipped]


@dataclass(frozen=True)
class LoopDensity:
    """What a trip of a kernel's steady-state main loop costs and retires."""

    loop: Loop
    w_bytes: int                 # bytes of W one lane loads per trip (the width of its W loads, summed)
    w_loads: int                 # W loads per lane per trip
    instructions: int            # warp-instructions per trip (the loop's first-arm path)
    nested: bool                 # the loop loads nested statistics (absmax bytes)

    @property
    def bytes_per_instruction(self) -> float:
        """Bytes of W the warp retires per warp-instruction it issues: 32 x w_bytes / instructions."""
        return 32 * self.w_bytes / self.instructions

    def to_dict(self) -> dict:
        return dict(bytes_per_instruction=round(self.bytes_per_instruction, 3), w_bytes_per_lane=self.w_bytes,
                    w_loads=self.w_loads, instructions=self.instructions, nested=self.nested,
                    loop_static=self.loop.static, hmma=dict(self.loop.mix).get("HMMA", 0))


def steady_loop(sass: str, min_len: int = 60) -> LoopDensity:
    """The steady-state main loop of a matmul kernel's SASS and its density: among the innermost loops (at
    least ``min_len`` instructions; a loop holding another such loop is not one) whose first-arm path loads W,
    those that load nested statistics (an 8- or 16-bit global load: bnb's default, compress_statistics) if any
    do; of those the loop without bounds checks (the fewest predicated global loads on its path: the full-warp
    path, not the checked one), then the one with the most mmas, then the shortest path. ValueError if no loop
    loads W by streaming loads."""
    found = [(lp, path_instructions(sass, lp)) for lp in loops(sass, min_len)]
    found = [(lp, [t for t in body if is_w_load(t)], body) for lp, body in found]
    found = [f for f in found if f[1]]
    best = None
    for lp, w, body in found:
        if any(o is not lp and lp.start <= o.start and o.end <= lp.end for o, _, _ in found):
            continue                      # an outer loop: its inner loop is the steady state
        loads = [t for t in body if _GLOBAL_LOAD.match(t)]
        nested = any(load_width(t) <= 2 for t in loads)
        predicated = sum(1 for t in loads if t.startswith("@"))
        key = (not nested, predicated, -dict(lp.mix).get("HMMA", 0), lp.path)
        if best is None or key < best[0]:
            best = (key, LoopDensity(lp, sum(load_width(t) for t in w), len(w), lp.path, nested))
    if best is None:
        raise ValueError("no loop of the kernel loads W by streaming loads (wload stream): nothing to count")
    return best[1]


def w_bytes_per_instruction(config, arch: str = "sm_90", cache_dir=None) -> LoopDensity:
    """Bytes of W per warp-instruction in the steady-state main loop of matmul ``config`` compiled for ``arch``
    (NVRTC, through the compile cache; nvdisasm on the CPU, no GPU).

    What it counts, per trip of the loop :func:`steady_loop` picks (the full-warp, nested-statistics path, the
    first arm of every if/else in it): the bytes of W one lane loads (the widths of its streaming loads of W,
    ``ld.global.nc.L1::no_allocate``, summed), times 32 lanes, over the warp-instructions on that path (every
    instruction issued once per warp: decode, mmas or FMAs, loads of W, A and statistics, the scale arithmetic,
    address arithmetic, loop control, fillers). It is a static count: no stall, no latency, no occupancy; the
    prologue (table fill, A's stage) and the epilogue are outside it. A config whose W is not loaded by
    streaming loads in the loop (wload plain, the shared-memory rings) raises ValueError."""
    from .compiler import compile_config

    if getattr(config, "wload", "stream") != "stream":
        raise ValueError(f"{config.short()}: bytes of W are counted from W's streaming loads (wload stream)")
    k = compile_config(config, arch, cache_dir=cache_dir)
    return steady_loop(disassemble(k.cubin))


# ----------------------------------------------------------------------------- SASS identity across a change
def identity_sample(family, strength: int = 2) -> list:
    """The configs whose SASS a refactor of the templates or the family must keep byte for byte: for each
    structure of the family, a ``strength``-wise covering sample of its distinct sources in the whole space
    (every dtype and quant, experimental values included), then the built-in defaults and presets."""
    from ..vocabulary import M_BUCKETS, Problem

    sources = list(family.iter_sources(experimental=True))
    out = []
    for name in family.structures:
        mine = [c for c in sources if family.structure(c) == name]
        out += family.covering_sources(mine, strength) if mine else []
    for dtype in ("bf16", "fp16", "fp32"):
        for m in (M_BUCKETS if "m" in family.knob_names else (None,)):
            out.append(family.builtin_default(Problem((64, 64), dtype, "nf4", 64, family.name, m)))
        out += [family.preset(p, dtype=dtype, quant="nf4", **({"m": 1} if "m" in family.knob_names else {}))
                for p in family.presets]
    return list(family.distinct_sources(out).values())


def snapshot(configs, folder, arch: str = "sm_90") -> list:
    """Compile each config (NVRTC, no cache) and write its SASS to ``folder``/<family>-<i>.sass, with
    ``folder``/index.json: the config, registers and the SASS's SHA-256. Run it before and after a
    change (each with that version of the code) and :func:`compare_snapshots` the two folders."""
    import hashlib
    import json

    from .compiler import compile_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, c in enumerate(configs):
        k = compile_config(c, arch, use_cache=False)
        text = disassemble(k.cubin)
        name = f"{c.family.name}-{i:04d}.sass"
        (folder / name).write_text(text)
        rows.append(dict(family=c.family.name, knobs=c.to_dict(), registers=k.registers, file=name,
                         sha256=hashlib.sha256(text.encode()).hexdigest()))
    (folder / "index.json").write_text(json.dumps(rows, indent=1))
    return rows


def compare_snapshots(before, after) -> list:
    """What differs between two :func:`snapshot` folders: one line per config of ``before`` whose SASS in
    ``after`` is missing or not byte for byte the same (an empty list: identical). A knob added between the
    two (in ``after``'s configs, not in ``before``'s) is matched at its default: a new knob's default must leave
    every existing kernel as it was."""
    import json

    from ..families import get

    def rows(folder):
        return json.loads((Path(folder) / "index.json").read_text())

    def ident(family, knobs):
        return json.dumps([family, knobs], sort_keys=True)

    a = {ident(r["family"], r["knobs"]): r for r in rows(before)}
    known = {r["family"]: set(r["knobs"]) for r in rows(before)}
    b = {}
    for r in rows(after):
        old = known.get(r["family"], set(r["knobs"]))
        defaults = get(r["family"]).defaults
        if all(v == defaults.get(k) for k, v in r["knobs"].items() if k not in old):
            b[ident(r["family"], {k: v for k, v in r["knobs"].items() if k in old})] = r
    out = []
    for key, r in a.items():
        s = b.get(key)
        if s is None:
            out.append(f"missing: {key}")
        elif (Path(before) / r["file"]).read_bytes() != (Path(after) / s["file"]).read_bytes():
            out.append(f"different SASS: {key} ({r['file']} / {s['file']}, {r['registers']} / {s['registers']} registers)")
    return out
