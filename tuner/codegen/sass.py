"""What the compiler made of a kernel: its SASS (``nvdisasm``), and the static counts of its MMA loop.

The MMA loop is the innermost loop holding ``HGMMA`` instructions (in a warp-specialized tile,
the MMA warps' loop over the ring slots). Loops nested in it are of two sorts: waits (the spin
of a barrier or semaphore wait that did not succeed at once), and, where the MMA warps copy
operands themselves (cp.async), copy loops over a slab's 16-byte pieces, which run a number of
passes the SASS does not show. The loop's instructions outside both are the issue work an MMA
warp does per ring slot when no wait spins and, where it has no copy loop, all of it; divided by
its ``HGMMA``, that is what a change to the loop has to lower. Copy loops are counted apart, per
pass. These are counts of the code, not of its time. ``nvdisasm`` comes from the
``nvidia-cuda-nvdisasm`` wheel (``pip install '.[inspect]'``) or from PATH.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


class DisassemblerMissing(RuntimeError):
    """No nvdisasm here."""


_INSN = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+|[A-Za-z_]\w*):\s*$")
_FUNC = re.compile(r"^//-+ \.text\.(\S+)\s+-+")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


@dataclass
class Insn:
    """One SASS instruction at its address."""

    addr: int
    text: str

    @property
    def mnemonic(self) -> str:
        """The instruction without its predicate and operands: ``HGMMA.64x96x16.F32``."""
        words = self.text.split()
        return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]

    @property
    def opcode(self) -> str:
        """``HGMMA.64x96x16.F32`` -> ``HGMMA``; ``WARPGROUP.DEPBAR.LE`` -> ``WARPGROUP.DEPBAR``
        (the two WARPGROUP instructions, the fence and the wait, are told apart)."""
        parts = self.mnemonic.split(".")
        return ".".join(parts[:2]) if parts[0] == "WARPGROUP" else parts[0]


@dataclass
class Function:
    """One kernel (or device function) of the disassembly."""

    name: str
    insns: list[Insn] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> address of the next instruction

    def loops(self) -> list[tuple[int, int]]:
        """Each backward branch as (first, last) address of the loop it closes."""
        out = []
        for i in self.insns:
            m = _TARGET.search(i.text)
            if m and " BRA" in f" {i.text}" and self.labels.get(m.group(1), i.addr + 1) <= i.addr:
                out.append((self.labels[m.group(1)], i.addr))
        return out


def parse_sass(text: str) -> list[Function]:
    """The functions of ``nvdisasm -c`` output, their instructions and label addresses."""
    funcs: list[Function] = []
    pending: list[str] = []
    for line in text.splitlines():
        if m := _FUNC.match(line):
            funcs.append(Function(m.group(1)))
            pending = []
        elif not funcs:
            continue
        elif m := _INSN.match(line):
            addr = int(m.group(1), 16)
            for label in pending:
                funcs[-1].labels[label] = addr
            pending = []
            funcs[-1].insns.append(Insn(addr, m.group(2)))
        elif m := _LABEL.match(line):
            pending.append(m.group(1))
    return funcs


@dataclass
class LoopStats:
    """Static counts of a function's MMA loop (None where it has no loop holding an HGMMA)."""

    kernel: str
    instructions: int  # the whole function
    loop: int | None = None  # in the MMA loop, outside the loops nested in it
    nested: int | None = None  # in the nested loops that wait (spin)
    copy_loops: list[int] = field(default_factory=list)  # instructions a pass of each nested copy loop
    ops: Counter[str] = field(default_factory=Counter)

    @property
    def hgmma(self) -> int:
        return self.ops["HGMMA"]

    @property
    def per_hgmma(self) -> float | None:
        return self.loop / self.hgmma if self.loop and self.hgmma else None

    @property
    def serialized(self) -> bool:
        """Each MMA waited for before the next issues (ptxas does that where it cannot prove the
        accumulators safe, e.g. without a ``wgmma.fence`` before a slot's MMAs): the tensor pipe
        then idles between MMAs, whatever the rest of the loop costs."""
        return self.hgmma > 1 and self.ops["WARPGROUP.DEPBAR"] >= self.hgmma


COPY_OPS = ("LDGSTS",)  # cp.async: a loop holding one copies operands, it does not wait


def mma_loop(fn: Function) -> LoopStats:
    """The innermost loop of ``fn`` that holds an HGMMA, counted without the loops nested in it:
    those that copy apart, per pass, those that wait not at all."""
    stats = LoopStats(fn.name, len(fn.insns))
    mma = [i.addr for i in fn.insns if i.opcode == "HGMMA"]
    loops = fn.loops()
    holding = [(a, b) for a, b in loops if any(a <= x <= b for x in mma)]
    if not holding:
        return stats
    first, last = min(holding, key=lambda ab: ab[1] - ab[0])
    inner = [(a, b) for a, b in loops if first <= a and b <= last and (a, b) != (first, last)]
    outer = [(a, b) for a, b in inner if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in inner)]
    body = [i for i in fn.insns if first <= i.addr <= last]
    copies = []
    for a, b in sorted(outer):
        part = [i for i in body if a <= i.addr <= b]
        if any(i.opcode in COPY_OPS for i in part):
            copies.append((a, b))
            stats.copy_loops.append(len(part))
    nested = [i for i in body if any(a <= i.addr <= b for a, b in inner)]
    kept = [i for i in body if not any(a <= i.addr <= b for a, b in inner)]
    stats.loop = len(kept)
    stats.nested = sum(1 for i in nested if not any(a <= i.addr <= b for a, b in copies))
    stats.ops = Counter(i.opcode for i in kept)
    return stats


def nvdisasm() -> str:
    """The nvdisasm executable: from the nvidia-cuda-nvdisasm wheel, else from PATH."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for cand in Path(root).glob("cu*/bin/nvdisasm"):
                return str(cand)
    except ImportError:
        pass
    found = shutil.which("nvdisasm")
    if not found:
        raise DisassemblerMissing("nvdisasm not found: pip install '.[inspect]' (the nvidia-cuda-nvdisasm wheel)")
    return found


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin, as ``nvdisasm -c`` prints it."""
    tool = nvdisasm()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "-c", f.name], capture_output=True, text=True)
    if done.returncode:
        err = done.stderr.strip().splitlines()
        raise RuntimeError(f"nvdisasm failed: {err[-1] if err else done.returncode}")
    return done.stdout


def mma_loops(cubin: bytes) -> list[LoopStats]:
    """Each kernel of a cubin with the static counts of its MMA loop."""
    return [mma_loop(fn) for fn in parse_sass(disassemble(cubin))]


