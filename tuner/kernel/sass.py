"""The SASS of a compiled variant, read on the CPU: disassemble a CUBIN with nvdisasm and find its
loops (a backward branch), with each loop's static length, the length of the path that takes the
first arm of every if/else inside it (the instructions between an unconditional forward branch and
its target are the other arm: in the matmul loops, the bounds-checked loads of a partial step), and
the instruction mix of that path. Used to count what a step of a kernel's loop costs before (or
without) a GPU (ci/sass_loops.py)."""

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
    ``after`` is missing or not byte for byte the same (an empty list: identical)."""
    import json

    def index(folder):
        rows = json.loads((Path(folder) / "index.json").read_text())
        return {json.dumps([r["family"], r["knobs"]], sort_keys=True): r for r in rows}

    a, b = index(before), index(after)
    out = []
    for key, r in a.items():
        s = b.get(key)
        if s is None:
            out.append(f"missing: {key}")
        elif (Path(before) / r["file"]).read_bytes() != (Path(after) / s["file"]).read_bytes():
            out.append(f"different SASS: {key} ({r['file']} / {s['file']}, {r['registers']} / {s['registers']} registers)")
    return out
