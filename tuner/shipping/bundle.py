"""A runnable bundle of tuned chains: ``python -m tuner export WORKLOAD --format bundle -o DIR``.

Per device and size the storage holds a study of, the best config's self-contained CUDA source,
its cubin for that device (NVRTC, on any host) and a manifest saying how to run it: the launch
sequence (kernel, grid, threads, dynamic shared memory, stream), the buffers and their shapes,
the u32 state words to zero once and keep, the split-K workspace, the TMA descriptors, and the
kernels' argument order. ``index.json`` lists the entries. :mod:`tuner.shipping.runtime` runs them.

Every kernel of an entry takes the same arguments, in this order: ``x``, then per stage ``w<i>``
and ``y<i>``, then ``ws`` (float32 workspace), ``state`` (u32, zeroed once, never reset),
``epoch`` (u32, read by no kernel of a bundle) and ``tmaps`` (the TMA descriptors, 128 bytes
each, in device memory); where the manifest has a ``room``, last ``lens``: the cache's length for
this run, one int32 in device memory (at most the room; :mod:`tuner.chain.length`). A bundle's kernels number their runs themselves, in ``state``: a run
captured once in a CUDA graph and replayed many times then waits for the right posts each
time, where an epoch passed by the host would be frozen into the graph at its capture. ``cpp/`` holds a C++ launcher (CUDA driver API) that runs an
entry from its ``entry.txt`` (the manifest, one fact per line) and an example that checks one.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import UsageError
from ..chain.kinds import kind_of
from ..chain.workloads import get_workload
from ..codegen.render import render
from ..config import Config
from ..device import DeviceInfo

BUNDLE_SCHEMA = 1
ARGS = "x, w0, y0, w1, y1, ..., ws, state, epoch, tmaps[, lens]"
CPP_FILES = ("tuner_chain.h", "tuner_chain.cpp", "example.cpp")


CPP_DIR = Path(__file__).parent / "cpp"  # the C++ launcher and its example, which a bundle carries

def _slug(text: str) -> str:
    """A folder name for ``text``: letters, digits and ``_.=-``, never one that starts with a dot
    (``..`` would leave the bundle)."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-").lstrip(".") or "-"


def manifest(chain: Any, config: Config, device: dict[str, Any], time_us: float | None, replayed: bool,
             arch: str, rendered: Any, synthetic: bool = False) -> dict[str, Any]:
    """How to run one tuned chain (see the module docstring for the kernels' arguments)."""
    buffers = {"x": list(chain.stages[0].a_shape)}
    for i, st in enumerate(chain.stages):
        buffers[f"w{i}"] = list(kind_of(st).b_operand(st)[0])  # the weights (an attention stage: its KV cache)
        buffers[f"y{i}"] = [st.m, st.n_out]
    return {
        "schema": BUNDLE_SCHEMA, "label": chain.label, "workload": chain.workload, "size": chain.size_dict,
        "device": device, "arch": arch, "dtype": "fp16", "config": config.to_dict(), "short": config.short(),
        "time_us": time_us, "replayed": replayed, "synthetic": synthetic, "source_hash": rendered.hash,
        "args": ARGS, "device_epoch": rendered.device_epoch, "buffers": buffers, "output": f"y{len(chain.stages) - 1}",
        # Whether fewer rows can run zero-padded to these: each stage kind says (see PADS_ROWS).
        "pads_rows": all(kind_of(st).pads_rows(st) for st in chain.stages),
        "state_words": rendered.state_words, "ws_floats": rendered.ws_floats, "err_word": rendered.err_word,
        "room": rendered.room,  # the kernels read the cache's length (lens) at run time, at most this; or None
        "launches": [asdict(l) for l in rendered.launches],  # read back as render.Launch, TensorMap
        "tensor_maps": [asdict(t) for t in rendered.tensor_maps],
        "files": {"source": "chain.cu", "cubin": "chain.cubin"},
    }


def write_entry(where: Path, chain: Any, config: Config, device: dict[str, Any], time_us: float | None = None,
                replayed: bool = False, synthetic: bool = False) -> Path:
    """One entry: the chain's source, its cubin for ``device`` and its manifest, in ``where``."""
    from ..codegen.compile import compile_source, target_arch  # noqa: PLC0415

    arch = target_arch(device.get("arch", "sm_90"))
    rendered = render(chain, config, device_epoch=True, **({"sms": int(device["sms"])} if device.get("sms") else {}))
    module = compile_source(rendered.source, arch)
    where.mkdir(parents=True, exist_ok=True)
    (where / "chain.cu").write_text(rendered.source)
    (where / "chain.cubin").write_bytes(module.cubin)
    doc = manifest(chain, config, device, time_us, replayed, arch, rendered, synthetic)
    (where / "manifest.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    (where / "entry.txt").write_text(entry_text(doc, [st.epilogue for st in chain.stages]))
    return where


def entry_text(doc: dict[str, Any], epilogues: list[str]) -> str:
    """The manifest one fact per line, for the C++ launcher (``cpp/tuner_chain.cpp``)."""
    lines = [f"# {doc['label']} on {doc['device'].get('name', '?')}: read by tuner_chain.cpp",
             f"label {doc['label']}", f"time_us {doc['time_us'] or 0}", f"state_words {doc['state_words']}",
             f"ws_floats {doc['ws_floats']}", f"err_word {doc['err_word']}"]
    lines += [f"room {doc['room']}"] if doc.get("room") is not None else []
    lines += [f"buffer {name} {rows} {cols}" for name, (rows, cols) in doc["buffers"].items()]
    lines += [f"epilogue {e}" for e in epilogues]
    lines += [f"launch {l['kernel']} {l['grid']} {l['threads']} {l['smem']} {l['stream']} {int(l.get('pdl', False))} "
              f"{l.get('grid_cap', 0)} {l.get('cluster', 1)}" for l in doc["launches"]]
    lines += [f"tensor_map {t['slot']} {t['operand']} {t['rows']} {t['cols']} {t['box_rows']}" for t in doc["tensor_maps"]]
    return "\n".join(lines) + "\n"


def write_bundle(storage: str, workload: str, out: str | Path) -> Path:
    """Write the bundle of ``workload``'s best configs into ``out``; returns its ``index.json``."""
    import optuna  # noqa: PLC0415

    from ..storage.database import open_optuna_storage  # noqa: PLC0415
    from .export import collect, one_per_size  # noqa: PLC0415

    wl = get_workload(workload)
    rows, left = one_per_size([r for r in collect(storage, wl.name) if r["best"] and r["best"].get("config")])
    if not rows:
        raise UsageError(f"no measured study of {wl.name} in {storage}; run python -m tuner study {wl.name} first, "
                         "or pass --storage with the URL the studies were written to")
    out = Path(out)
    rdb = open_optuna_storage(storage, read_only=True)
    entries = []
    for r in rows:
        chain = wl.chain(**r["size"])
        config = Config.from_dict(r["best"]["config"], f"study {r['study']!r}")
        best = optuna.load_study(study_name=r["study"], storage=rdb).best_trial
        stored = best.user_attrs.get("device") or {"name": r["device"], "arch": "sm_90"}
        device = DeviceInfo.from_dict(stored, f"study {r['study']!r}, trial {best.number}: device").to_dict()
        where = out / _slug(r["device"]) / _slug(",".join(f"{k}={v}" for k, v in chain.size_dict.items()))
        try:
            write_entry(where, chain, config, device, r["best"]["median_us"], r["replayed"], r["synthetic"])
        except OSError as exc:
            raise UsageError(f"cannot write the bundle into {out}: {exc.strerror or exc}") from None
        entries.append({"label": chain.label, "device": r["device"], "size": chain.size_dict,
                        "path": str(where.relative_to(out)), "time_us": r["best"]["median_us"],
                        "replayed": r["replayed"], "synthetic": r["synthetic"]})
    cpp = out / "cpp"  # the C++ launcher and its example, beside the entries they run
    cpp.mkdir(exist_ok=True)
    for name in CPP_FILES:
        (cpp / name).write_text((CPP_DIR / name).read_text())
    index = out / "index.json"
    index.write_text(json.dumps({"schema": BUNDLE_SCHEMA, "workload": wl.name, "sweep": wl.sweep_param,
                                 "entries": entries, "left_out": left}, indent=1, sort_keys=True) + "\n")
    return index
