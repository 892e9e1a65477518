"""What the compiler makes of the MMA loop, read from the SASS: no GPU needed."""
from __future__ import annotations

import re
import shutil

import pytest

from tuner.chain.workloads import get_workload
from tuner.codegen import compile as tc
from tuner.codegen import sass
from tuner.codegen.render import render
from tuner.paths import home
from tuner.search.cases import coverage

CHAIN = get_workload("gpt3").chain(tokens=64)

try:
    tc.toolkit_version()
    sass.nvdisasm()
    HAVE_TOOLS = True
except (tc.ToolchainMissing, sass.DisassemblerMissing):
    HAVE_TOOLS = False
tools = pytest.mark.skipif(not HAVE_TOOLS, reason="needs NVRTC and nvdisasm (pip install -e '.[compile,inspect]')")

# A ring-slot loop as nvdisasm prints it: a barrier wait whose slow path spins in a loop of its own,
# then two MMAs committed as one group, and a wait that leaves that group in flight.
PIPELINED = """\
//--------------------- .text.stage0_kernel        --------------------------
stage0_kernel:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ+0x38000], R2 ;
        /*0020*/               @P0 BRA `(.L_x_3) ;
.L_x_2:
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ+0x38000], R4 ;
        /*0040*/              @!P0 BRA `(.L_x_2) ;
.L_x_3:
        /*0050*/                   WARPGROUP.ARRIVE ;
        /*0060*/                   HGMMA.64x96x16.F32 R24, gdesc[UR16], R24 ;
        /*0070*/                   HGMMA.64x96x16.F32 R24, gdesc[UR20], R24, gsb0 ;
        /*0080*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0090*/                   ISETP.GE.U32.AND P0, PT, R11, 0xc0, PT ;
        /*00a0*/              @!P0 BRA `(.L_x_1) ;
        /*00b0*/                   EXIT ;
"""


def test_the_mma_loop_is_counted_without_the_spin_of_a_wait_nested_in_it():
    (fn,) = sass.parse_sass(PIPELINED)
    stats = sass.mma_loop(fn)
    assert fn.name == "stage0_kernel" and stats.instructions == 12
    assert (stats.loop, stats.nested, stats.hgmma) == (8, 2, 2)
    assert stats.per_hgmma == 4.0
    assert stats.ops["WARPGROUP.ARRIVE"] == 1 and stats.ops["WARPGROUP.DEPBAR"] == 1
    assert not stats.serialized


def test_a_nested_loop_that_copies_is_counted_apart_per_pass_not_as_a_wait():
    """Where the MMA warps copy operands themselves (cp.async), the compiler may keep a slab's
    copies in a loop of their own: real work a slot, whose passes the SASS does not show."""
    copying = PIPELINED.replace(
        "        /*0090*/                   ISETP.GE.U32.AND P0, PT, R11, 0xc0, PT ;\n",
        ".L_x_9:\n"
        "        /*0084*/                   IMAD R9, R8, 0x80, R6 ;\n"
        "        /*0085*/                   LDGSTS.E.BYPASS.128 [R9], desc[UR8][R12.64], !P1 ;\n"
        "        /*0086*/                   ISETP.GE.AND P1, PT, R8, 0x400, PT ;\n"
        "        /*0087*/              @!P1 BRA `(.L_x_9) ;\n"
        "        /*0090*/                   ISETP.GE.U32.AND P0, PT, R11, 0xc0, PT ;\n")
    stats = sass.mma_loop(sass.parse_sass(copying)[0])
    assert (stats.loop, stats.nested, stats.copy_loops) == (8, 2, [4])


def test_mmas_each_waited_for_before_the_next_are_flagged_serialized():
    serialized = PIPELINED.replace(
        "HGMMA.64x96x16.F32 R24, gdesc[UR16], R24 ;",
        "HGMMA.64x96x16.F32 R24, gdesc[UR16], R24, gsb0 ;\n"
        "        /*0061*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
        "        /*0062*/                   WARPGROUP.ARRIVE ;")
    assert sass.mma_loop(sass.parse_sass(serialized)[0]).serialized


def test_a_kernel_without_mma_has_no_mma_loop():
    (fn,) = sass.parse_sass(PIPELINED.replace("HGMMA.64x96x16.F32", "HMMA.16816.F32"))
    stats = sass.mma_loop(fn)
    assert stats.loop is None and stats.per_hgmma is None and not stats.serialized


def _loops(monkeypatch, mma: str, templates=None) -> list[sass.LoopStats]:
    if templates is not None:
        monkeypatch.setenv("TUNER_HOME", str(templates))
    cfg = coverage(CHAIN, mma)[0]
    return sass.mma_loops(tc.compile_source(render(CHAIN, cfg).source, "sm_90a").cubin)


@tools
@pytest.mark.parametrize("mma", ["wgmma", "wgmma_tma", "wgmma_tma_t"])
def test_the_shipped_mma_loops_keep_a_group_of_mmas_in_flight(mma, monkeypatch):
    """One wgmma.fence and one wait per ring slot, four k16 MMAs of a 64-wide K slab between them."""
    loops = _loops(monkeypatch, mma)
    assert loops and all(s.hgmma == 4 and not s.serialized for s in loops)
    assert all(s.ops["WARPGROUP.ARRIVE"] == 1 and s.ops["WARPGROUP.DEPBAR"] == 1 for s in loops)


@tools
def test_without_the_fence_before_each_slot_ptxas_places_the_same_one(tmp_path, monkeypatch):
    """PTX orders accumulator accesses between MMAs of one shape without a fence, and with the
    descriptors in uniform registers ptxas places one fence a slot by itself: dropping ours
    changes nothing. (With descriptors moved over from per-lane registers, as before, the same
    drop made ptxas wait for each MMA before issuing the next.)"""
    shutil.copytree(home() / "kernel_templates", tmp_path / "kernel_templates")
    header = tmp_path / "kernel_templates" / "wgmma.cuh"
    unfenced, n = re.subn(r"(?m)^  wgmma_fence\(\);.*\n", "", header.read_text())
    assert n == 1  # the call in wgmma_slot
    header.write_text(unfenced)
    shipped = _loops(monkeypatch, "wgmma_tma")
    loops = _loops(monkeypatch, "wgmma_tma", tmp_path)
    assert loops and [(s.loop, s.ops) for s in loops] == [(s.loop, s.ops) for s in shipped]
    assert not any(s.serialized for s in loops)


@tools
def test_the_sass_script_prints_each_kernels_mma_loop_for_the_checkout_and_a_variant(tmp_path, run_benchmark):
    shutil.copytree(home() / "kernel_templates", tmp_path / "variant" / "kernel_templates")
    done = run_benchmark("sass_stats.py", tmp_path / "variant", "--config",
                         "studies/recheck/gpt3-256.measurements.json", "gpt3.gemm2/tokens=256", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if "stage0_kernel" in line]
    assert [r[:2] for r in rows] == [["this", "checkout"], ["variant", "stage0_kernel"]]
    assert rows[0][2:] == rows[1][1:]  # the same templates: the same code


@tools
@pytest.mark.parametrize("mma", ["wgmma_tma", "wgmma_tma_t"])
def test_the_tma_fed_mma_loops_keep_their_descriptors_in_uniform_registers(mma, monkeypatch):
    """The MMA warps build a tile's descriptors once, from a warpgroup index the compiler knows to
    be warp-uniform, and offset them by constants: no register-to-uniform move in the loop, and
    about ten instructions a slot besides its four MMAs (before: 16 moves and 24-27 per MMA)."""
    loops = _loops(monkeypatch, mma)
    assert loops and all(s.ops["R2UR"] == 0 and s.per_hgmma <= 12 for s in loops)


@tools
@pytest.mark.parametrize("workload,size", [("gpt3", dict(tokens=64)), ("resnet38", dict(batch=2, height=28, width=28,
                                                                                       channels=128))])
def test_the_mma_warps_copy_a_slot_in_straight_code_where_they_copy_with_cp_async(workload, size):
    """Each thread copies the same column of the same rows of every slab, so the rows' state (the
    address, the taps inside the image) is computed once per tile: no copy loop is left in the MMA
    loop (before: two, of 120-180 instructions a pass), and the slot's whole work is counted."""
    chain = get_workload(workload).chain(**size)
    cfg = coverage(chain, "wgmma")[0]
    loops = sass.mma_loops(tc.compile_source(render(chain, cfg).source, "sm_90a").cubin)
    assert loops and all(s.hgmma and not s.copy_loops for s in loops)
