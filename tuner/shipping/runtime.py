"""Run tuned chains from a bundle (:mod:`tuner.shipping.bundle`) on CuPy arrays or PyTorch tensors.

    import tuner.shipping.runtime
    mlp = tuner.shipping.runtime.load("tuned/gpt3-bundle")       # index.json of a bundle, or one entry's folder
    y = mlp(x, w1, w2)                                   # x [tokens, hidden], w1 [ffn, hidden], w2 [hidden, ffn]
    block = tuner.shipping.runtime.load("tuned/resnet38-bundle")
    y = block(images, w1, w2)                            # NHWC images [N, H, W, C]; weights [C_out, 3, 3, C_in]

Inputs are taken as they are (``__cuda_array_interface__``: CuPy, PyTorch, Numba; no copies)
and checked first: each argument's device residency, dtype (fp16), shape and C-contiguity, with
one clear line when one is wrong. The chain runs on the caller's current stream (PyTorch's when
the input is a tensor, else CuPy's), so it can be captured in a CUDA graph. The entry is the one
tuned for the input's size, or, for a GEMM chain's token count with no entry of its own, the nearest
larger one whose other sizes match: the input is then copied into a zero-padded buffer
of that size first, which costs a copy. The result is the chain's own output buffer (as with a
CUDA graph's outputs): the next call with the same entry overwrites it, so copy what you keep.

A decode layer's entry reads the cache's length at run time (its manifest's ``room``: the most
cached tokens a run serves, the cache buffer's rows less the new tokens)::

    layer = tuner.shipping.runtime.load("tuned/llama-layer-bundle")
    pos = torch.tensor([prompt_len], dtype=torch.int32, device="cuda")     # like cache_position
    h = layer(x, *weights, cache_len=pos)        # appends the tokens' keys and values at row pos
    pos += tokens                                # in place: a captured graph replays the next step

``cache_len`` is one int32 on the GPU (read by the kernels, clamped to the room), or a Python int,
which costs a copy to the GPU per call (and is frozen into a graph that captures it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import UsageError, shown
from ..chain.workloads import get_workload


class RuntimeArgumentError(UsageError):
    """An argument a tuned chain cannot take."""


class BundleError(UsageError):
    """A bundle's files are not what :mod:`tuner.shipping.bundle` writes."""


def read_manifest(folder: Path) -> dict[str, Any]:
    """One entry's manifest, checked before anything of it is used: its config and chain are ones
    this version can run, and the files it names are plain names inside ``folder``."""
    from ..config import Config  # noqa: PLC0415

    path = folder / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: cannot be read as JSON: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict) or not isinstance(m.get("size"), dict):
        raise BundleError(f"{path}: not a bundle manifest (python -m tuner export WORKLOAD --format bundle writes them)")
    chain = get_workload(str(m.get("workload"))).chain(**m["size"])
    config = Config.from_dict(m.get("config"), str(path))
    if len(config.tiles) != len(chain.stages):
        raise BundleError(f"{path}: its config tiles {len(config.tiles)} stages, its chain has {len(chain.stages)}")
    for key, name in m["files"].items():
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            raise BundleError(f"{path}: files.{key} = {shown(name)}: accepted: a file name inside {folder}")
    return m


@dataclass(frozen=True)
class ArrayInfo:
    """What the checks read from an argument, without touching the GPU."""

    shape: tuple[int, ...]
    typestr: str
    contiguous: bool


def plain(a: Any) -> Any:
    """A PyTorch tensor that requires grad (a module's weight) as the same memory without autograd,
    which is what hands out ``__cuda_array_interface__``; anything else as it is."""
    return a.detach() if getattr(a, "requires_grad", False) else a


def describe(name: str, a: Any) -> ArrayInfo:
    """Shape, dtype and layout of a device array, or a one-line error saying what it is instead."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is None:
        kind = type(a).__module__.split(".")[0] + "." + type(a).__name__
        raise RuntimeArgumentError(f"{name}: a CUDA array is expected (CuPy, PyTorch on cuda), got {kind}"
                                   + (" on the host" if hasattr(a, "__array_interface__") else ""))
    shape = tuple(int(s) for s in iface["shape"])
    typestr = str(iface["typestr"])
    strides = iface.get("strides")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    contiguous = strides is None
    if strides is not None:
        expect, step = [], itemsize
        for dim in reversed(shape):
            expect.append(step)
            step *= dim
        contiguous = tuple(strides) == tuple(reversed(expect))
    return ArrayInfo(shape, typestr, contiguous)


def signature(x: Any, weights: Sequence[Any]) -> tuple | None:
    """What the argument checks depend on (type, shape, dtype, strides of each argument), read
    from the arrays' own attributes, which is cheaper than their ``__cuda_array_interface__``;
    None where an argument lacks them (the checks then run in full and explain)."""
    key = []
    for a in (x, *weights):
        try:
            stride = getattr(a, "stride", None)  # PyTorch: a method, in elements; CuPy: bytes
            strides = stride() if callable(stride) else a.strides
            key.append((type(a), tuple(a.shape), str(a.dtype), tuple(strides)))
        except (AttributeError, TypeError):
            return None
    return tuple(key)


def check_args(entry: dict[str, Any], x: ArrayInfo, weights: Sequence[ArrayInfo], padded_rows: int | None = None) -> None:
    """Refuse arguments that do not fit ``entry``'s buffers, one line each."""
    bufs = entry["buffers"]
    n_stages = sum(1 for k in bufs if k.startswith("w"))
    if len(weights) != n_stages:
        raise RuntimeArgumentError(f"{entry['label']}: {n_stages} weights are expected (one per stage), "
                                   f"got {len(weights)}")
    named = [("x", x, bufs["x"]), *((f"w{i}", w, bufs[f"w{i}"]) for i, w in enumerate(weights))]
    for name, info, want in named:
        if info.typestr not in ("<f2", "|f2"):
            raise RuntimeArgumentError(f"{name}: fp16 is expected (typestr <f2), got {info.typestr}")
        if not info.contiguous:
            raise RuntimeArgumentError(f"{name}: a C-contiguous (row-major) array is expected; pass .contiguous() "
                                       "or cupy.ascontiguousarray(...)")
        shape = list(info.shape)
        if name == "x" and padded_rows is not None:
            want = [shape[0], want[1]]  # fewer rows than the entry's: padded before the run
        if shape != list(want):
            raise RuntimeArgumentError(f"{name}: shape {tuple(shape)} does not fit {entry['label']}, which takes "
                                       f"{tuple(want)}")


def check_length(entry: dict[str, Any], cache_len: Any) -> None:
    """Refuse a cache length an entry cannot take, one line: one is needed exactly where the entry
    has a room, as a Python int in 0..room or one int32 in device memory."""
    room = entry.get("room")
    if room is None:
        if cache_len is not None:
            raise RuntimeArgumentError(f"{entry['label']}: its cache length is compiled in; pass no cache_len")
        return
    if cache_len is None:
        raise RuntimeArgumentError(f"{entry['label']}: reads the cache's length at run time: pass cache_len= "
                                   f"(an int32 tensor of one element on the GPU, or an int, at most {room})")
    if isinstance(cache_len, bool) or (isinstance(cache_len, int) and not 0 <= cache_len <= room):
        raise RuntimeArgumentError(f"cache_len: {cache_len!r}; accepted: 0..{room} tokens (the entry's room)")
    if isinstance(cache_len, int):
        return
    info = describe("cache_len", plain(cache_len))
    if info.typestr != "<i4" or int(np.prod(info.shape)) != 1:
        raise RuntimeArgumentError(f"cache_len: one int32 is expected (typestr <i4), got {info.typestr} of shape "
                                   f"{info.shape}")


def select(index: dict[str, Any], entries: list[dict[str, Any]], rows: int, fixed: dict[str, int] | None = None
           ) -> tuple[dict[str, Any], bool]:
    """The entry for an input of ``rows`` rows: the exact one, else the nearest larger one with the
    same fixed sizes (then True: the input must be padded). ``fixed`` narrows to those sizes."""
    sweep = index["sweep"]

    def rows_of(e: dict[str, Any]) -> int:
        return int(e["buffers"]["x"][0])

    ok = [e for e in entries if fixed is None or all(e["size"].get(k) == v for k, v in fixed.items())]
    exact = [e for e in ok if rows_of(e) == rows]
    if exact:
        return exact[0], False
    larger = sorted((e for e in ok if rows_of(e) > rows and e.get("pads_rows")), key=rows_of)
    if larger:
        return larger[0], True
    have = sorted({rows_of(e) for e in ok})
    padded = [rows_of(e) for e in ok if e.get("pads_rows")]
    accepted = f"at most {max(padded)} rows" if padded else "exactly one of those"
    raise RuntimeArgumentError(f"no tuned entry takes {rows} rows of input (the {sweep} size); the bundle has "
                               f"{', '.join(map(str, have)) or 'none'}; accepted: {accepted}, or tune that size")


class TunedChain:
    """One bundle entry, loaded on the current CUDA device; call it to run the chain."""

    def __init__(self, folder: Path):
        import cupy as cp  # noqa: PLC0415 - a GPU host

        from ..backends.gpu import load_functions  # noqa: PLC0415
        from ..codegen.render import Launch, device_grid  # noqa: PLC0415

        self.folder = folder
        self.entry = read_manifest(folder)
        self.module = cp.RawModule(path=str(folder / self.entry["files"]["cubin"]))
        # A persistent stage's grid follows this device's SMs, not those of the device it was tuned on.
        sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["multiProcessorCount"]
        self.launches = [replace(l, grid=device_grid(l, sms)) for l in (Launch(**d) for d in self.entry["launches"])]
        self.funcs = load_functions(self.module, self.launches)
        self.state = cp.zeros(self.entry["state_words"], dtype=cp.uint32)  # zeroed once, never reset
        self.ws = cp.empty(self.entry["ws_floats"], dtype=cp.float32)
        bufs = self.entry["buffers"]
        self.ys = [cp.empty(tuple(bufs[f"y{i}"]), dtype=cp.float16) for i in range(sum(k.startswith("y") for k in bufs))]
        self.side = cp.cuda.Stream(non_blocking=True)
        self.fork, self.join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
        self.epoch = 0
        self.room = self.entry.get("room")  # the cache's run-time length, at most this (None: compiled in)
        self.own_length = cp.zeros(1, dtype=cp.int32)  # where a caller passes the length as a Python int
        self._tmaps: dict[tuple[int, ...], Any] = {}
        self._no_maps = cp.zeros(1, dtype=cp.uint64)  # made once: a run allocates nothing, so it can be captured
        cp.cuda.Device().synchronize()  # the zeroed state lands before the first run

    def _tensor_maps(self, buffers: dict[str, Any]) -> Any:
        from ..backends import tensormap  # noqa: PLC0415
        from ..codegen.render import TensorMap  # noqa: PLC0415

        if not self.entry["tensor_maps"]:
            return self._no_maps
        key = tuple(int(b.data.ptr) for b in buffers.values())
        if key not in self._tmaps:
            maps = tuple(TensorMap(**t) for t in self.entry["tensor_maps"])
            self._tmaps[key] = tensormap.pack(maps, buffers)
        return self._tmaps[key]

    def run(self, x: Any, weights: Sequence[Any], stream: Any, cache_len: Any = None) -> Any:
        """Enqueue one run on ``stream`` (checked arguments, CuPy views; ``cache_len`` an int32 [1] CuPy
        array where the entry has a room); returns the output buffer."""
        import cupy as cp  # noqa: PLC0415

        from ..backends.gpu import enqueue_launches  # noqa: PLC0415

        buffers = {"x": x}
        for i, (w, y) in enumerate(zip(weights, self.ys)):
            buffers[f"w{i}"], buffers[f"y{i}"] = w, y
        self.epoch += 1
        args = [x]
        for i, w in enumerate(weights):
            args += [w, self.ys[i]]
        args = (*args, self.ws, self.state, cp.uint32(self.epoch), self._tensor_maps(buffers),
                *(() if self.room is None else (cache_len,)))
        enqueue_launches(self.funcs, self.launches, args, stream, self.side, self.fork, self.join)
        return self.ys[-1]


def _inside(rel: Any, root: Path) -> str:
    """An entry's folder, relative to the bundle: refused where it would lead out of it."""
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise BundleError(f"{root / 'index.json'}: entry path {shown(rel)}: accepted: a folder inside {root}")
    return rel


class Runtime:
    """The entries of a bundle; ``runtime(x, *weights)`` runs the one tuned for ``x``."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if (path / "index.json").is_file():
            self.root = path
            try:
                self.index = json.loads((path / "index.json").read_text())
                folders = [path / _inside(e["path"], path) for e in self.index["entries"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise BundleError(f"{path / 'index.json'}: not a bundle index: {exc}") from None
        elif (path / "manifest.json").is_file():
            self.root = path
            m = read_manifest(path)
            self.index = {"workload": m["workload"], "sweep": get_workload(m["workload"]).sweep_param, "entries": []}
            folders = [path]
        else:
            raise UsageError(f"{path}: no index.json or manifest.json; accepted: a folder written by "
                             "python -m tuner export WORKLOAD --format bundle")
        self.manifests = [read_manifest(f) | {"_folder": str(f)} for f in folders]
        self._loaded: dict[str, TunedChain] = {}
        self._answers: dict[tuple, tuple[dict[str, Any], bool]] = {}  # see entry_for

    def entry_for(self, x: Any, weights: Sequence[Any]) -> tuple[dict[str, Any], bool]:
        """The entry an input goes to, after checking every argument (no GPU work). The checks
        read only shapes, dtypes and strides, so their answer is kept per signature of those: a
        call like an earlier one costs a dictionary lookup, not the checks again (a chain of
        short kernels is otherwise shorter than the host's work on its arguments)."""
        key = signature(x, weights)
        if key is not None and key in self._answers:
            return self._answers[key]
        answer = self._check(x, weights)
        if key is not None:
            if len(self._answers) >= 256:  # callers with ever-new shapes: keep the memory bounded
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def _check(self, x: Any, weights: Sequence[Any]) -> tuple[dict[str, Any], bool]:
        xi = describe("x", plain(x))
        ws = [describe(f"w{i}", plain(w)) for i, w in enumerate(weights)]
        image = None
        if len(xi.shape) == 4:  # NHWC images, for a convolution chain: its size names the entry
            n, h, w, c = xi.shape
            image = {"batch": n, "height": h, "width": w, "channels": c}
            xi = ArrayInfo((n * h * w, c), xi.typestr, xi.contiguous)
        elif len(xi.shape) != 2:
            raise RuntimeArgumentError(f"x: a 2-d array [rows, features] (or NHWC images [N, H, W, C]) is expected, "
                                       f"got shape {xi.shape}")
        # The weights fix every size but the swept one: keep the entries whose weights they fit.
        fits = [m for m in self.manifests if [list(w.shape) for w in ws] ==
                [m["buffers"][f"w{i}"] for i in range(len(ws))]] or self.manifests
        if image is not None:
            exact = [m for m in fits if all(m["size"].get(k) == v for k, v in image.items())]
            if not exact:
                have = sorted({"x".join(str(m["size"].get(k)) for k in image) for m in self.manifests})
                raise RuntimeArgumentError(f"no tuned entry takes NHWC images {'x'.join(map(str, image.values()))}; "
                                           f"the bundle has {', '.join(have)}")
            fits = exact
        entry, pad = select(self.index, fits, xi.shape[0])
        check_args(entry, xi, ws, padded_rows=xi.shape[0] if pad else None)
        return entry, pad

    def __call__(self, x: Any, *weights: Any, cache_len: Any = None) -> Any:
        x, weights = plain(x), [plain(w) for w in weights]
        entry, pad = self.entry_for(x, weights)
        check_length(entry, cache_len)
        chain = self._loaded.get(entry["_folder"])
        if chain is None:
            chain = self._loaded[entry["_folder"]] = TunedChain(Path(entry["_folder"]))
        return run_on_caller_stream(chain, entry, pad, x, weights, cache_len)

    def instance(self, x: Any, *weights: Any) -> tuple[TunedChain, dict[str, Any], bool]:
        """A loaded chain of its own for arguments like these (checked), with its entry and whether the
        input is padded: for callers whose outputs must outlive another call of the same entry (the
        layers of one model, each feeding the next), where ``runtime(...)`` shares one per entry."""
        x, weights = plain(x), [plain(w) for w in weights]
        entry, pad = self.entry_for(x, weights)
        return TunedChain(Path(entry["_folder"])), entry, pad


def run_on_caller_stream(chain: TunedChain, entry: dict[str, Any], pad: bool, x: Any, weights: Sequence[Any],
                         cache_len: Any = None) -> Any:
    """One run of ``chain`` (``entry``'s, arguments checked) on the caller's current stream: PyTorch's
    where ``x`` is a tensor (and a tensor back), else CuPy's; ``pad``: ``x`` is copied into the
    entry's zero-padded input first."""
    import cupy as cp  # noqa: PLC0415

    torch_in = type(x).__module__.startswith("torch")
    if torch_in:
        import torch  # noqa: PLC0415

        current = torch.cuda.current_stream()
        if hasattr(cp.cuda.Stream, "from_external"):  # CuPy 14 deprecates ExternalStream
            stream = cp.cuda.Stream.from_external(current)
        else:
            stream = cp.cuda.ExternalStream(current.cuda_stream)
    else:
        stream = cp.cuda.get_current_stream()
    with stream:
        xs = cp.asarray(x)
        images = xs.ndim == 4
        if images:  # a view: NHWC is [pixels, channels] row-major
            xs = xs.reshape(-1, xs.shape[-1])
        rows = xs.shape[0]
        if pad:
            full = cp.zeros(tuple(entry["buffers"]["x"]), dtype=cp.float16)
            full[:rows] = xs
            xs = full
        lens = None
        if entry.get("room") is not None:
            if isinstance(cache_len, int):
                chain.own_length.fill(cache_len)
                lens = chain.own_length
            else:
                lens = cp.asarray(cache_len).reshape(1)
        out = chain.run(xs, [cp.asarray(w) for w in weights], stream, lens)[:rows]
        if images:
            out = out.reshape(*cp.asarray(x).shape[:3], -1)
    if torch_in:
        import torch  # noqa: PLC0415

        return torch.as_tensor(out, device="cuda")
    return out


def load(path: str | Path) -> Runtime:
    """The bundle at ``path`` (its folder, or one entry's folder), ready to call."""
    return Runtime(path)
