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
