"""What the compiler made of a kernel change, without a GPU: the static SASS of recorded configs'
MMA loops, rendered from this checkout's kernel templates and from each variant's.

    python benchmarks/sass_stats.py [VARIANT ...] --config RECORDING LABEL [RANK] [--config ...] [--dump DIR]
    python benchmarks/sass_stats.py /tmp/fence \\
        --config studies/recheck/gpt3-256.measurements.json 'gpt3.gemm1/tokens=256' 6

Variants, ``--config`` and ``--also`` as in ``template_ab.py``. Each source is compiled with NVRTC (on the
CPU, through the kernel cache) and disassembled with ``nvdisasm`` (``pip install
'.[inspect]'``); for each kernel it prints the static counts of its MMA loop (``tuner/codegen/sass.py``
says which loop and what is counted): instructions per ``HGMMA``, the register-to-uniform moves,
the ``wgmma`` fences and waits, whether ptxas serialized the MMAs, and the copy loops (per pass)
where the MMA warps copy operands themselves. Counts of the code, not measurements of its time:
``template_ab.py`` times a change on the GPU.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from template_ab import also_arguments, config_arguments, picked_configs, tile_variant, variant_homes  # noqa: E402

from tuner.codegen.sass import DisassemblerMissing, disassemble, mma_loop, nvdisasm, parse_sass  # noqa: E402

SHOWN = ("HGMMA", "R2UR", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "SYNCS", "BAR")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help="folders each holding a kernel_templates/ to compare")
    config_arguments(ap)
    also_arguments(ap)
    ap.add_argument("--dump", metavar="DIR", help="also write each source and its SASS into DIR")
    args = ap.parse_args()
    homes = variant_homes(args.variants)
    targets = picked_configs(args.config)
    try:
        nvdisasm()
    except DisassemblerMissing as exc:
        raise SystemExit(str(exc)) from None

    from tuner.chain.workloads import chain_from_label
    from tuner.codegen.compile import CompileError, compile_source
    from tuner.codegen.render import render
    from tuner.device import DeviceInfo

    dump = Path(args.dump) if args.dump else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    for n, rec in enumerate(targets):
        chain = chain_from_label(rec.label)
        print(f"{rec.label}: {rec.config.short()}")
        print(f"  {'templates':>16} {'kernel':>14} {'regs':>5} {'insns':>6} {'loop':>5} {'HGMMA':>5} "
              f"{'per HGMMA':>9}  " + " ".join(f"{op.split('.')[-1]:>6}" for op in SHOWN[1:]))
        runs = [(name, root, rec.config) for name, root in homes.items()]
        for change in args.also:
            notes: list[str] = []
            cfg = tile_variant(chain, rec.config, change, DeviceInfo("H200"), notes)
            for note in notes:
                print(f"  --also {change}: {note}")
            if cfg is not None:
                runs.append((f"{change}", homes["this checkout"], cfg))
        for name, root, cfg in runs:
            os.environ["TUNER_HOME"] = str(root)  # the renderer reads its templates from here
            rendered = render(chain, cfg)
            try:
                mod = compile_source(rendered.source, "sm_90a")
            except CompileError as exc:
                print(f"  {name:>16}: compile failed: {exc.message}")
                continue
            sass = disassemble(mod.cubin)
            if dump:
                stem = f"{n}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
                (dump / f"{stem}.cu").write_text(rendered.source)
                (dump / f"{stem}.sass").write_text(sass)
            for fn in parse_sass(sass):
                s = mma_loop(fn)
                regs = mod.kernels.get(fn.name, {}).get("registers", "")
                if s.loop is None:
                    print(f"  {name:>16} {fn.name:>14} {regs:>5} {s.instructions:>6}   (no MMA loop)")
                    continue
                print(f"  {name:>16} {fn.name:>14} {regs:>5} {s.instructions:>6} {s.loop:>5} {s.hgmma:>5} "
                      f"{s.per_hgmma:>9.1f}  " + " ".join(f"{s.ops[op]:>6}" for op in SHOWN[1:])
                      + (f"  + copy loops of {', '.join(map(str, s.copy_loops))} a pass" if s.copy_loops else "")
                      + ("  SERIALIZED: each MMA waits for the last" if s.serialized else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
