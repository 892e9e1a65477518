"""Workloads: chains of tiled stages, their index maps, and the sizes to sweep.

A workload is a recipe; :meth:`Workload.chain` turns it into a :class:`Chain` at
one size. Each stage is a GEMM ``C[M,N] = epilogue(A[M,K] @ B[N,K]^T)`` whose B
operand (the weights) is stored N-major with K contiguous, like ``nn.Linear``.
A stage whose ``a_from`` names an earlier stage reads that stage's output as its
A operand with the identity index map: element ``A[r, c]`` of the consumer is
element ``C[r, c]`` of the producer. Which producer tiles a consumer tile
depends on is derived from this map (see :mod:`tuner.checker.checks`), never written
by hand.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from .. import shown
from .attention import AttentionStage
from .conv import ConvStage
from .gemm import GemmStage
from . import length, residual
from .kinds import Stage, WorkloadError
from .rope import Rope

DTYPES = ("fp16",)


def edges(stages: Sequence[Stage]) -> list[tuple[int, int]]:
    """(producer, consumer) stage indices, one per stage that reads an earlier stage's output as its A
    operand: the one definition of which stage reads which, that the checker, the constraints and
    the search pair stages by."""
    return [(st.a_from, i) for i, st in enumerate(stages) if st.a_from is not None]


@dataclass(frozen=True)
class Chain:
    """A workload at one size: the stages the kernels compute."""

    workload: str
    size: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    dtype: str = "fp16"

    @property
    def label(self) -> str:
        """Human-readable name of this workload at this size, e.g. ``gpt3/tokens=64``."""
        return self.workload + "/" + ",".join(f"{k}={v}" for k, v in self.size)

    @property
    def size_dict(self) -> dict[str, int]:
        return dict(self.size)

    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.stages)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """The stages' names, which prefix their knobs in a config's parameters (``attn.bm``)."""
        return tuple(s.name for s in self.stages)

    def __post_init__(self) -> None:
        residual.check(self)
        length.of(self)  # one room for every stage that reads the run-time cache length

    def alone(self, j: int) -> "Chain":
        """Stage ``j`` as a chain of its own (its A operand an external input), to time it alone; a
        residual add is left out (the chain's input is no longer there), which costs a stage that
        has one a read of its output's size in the chain."""
        st = self.stages[j]
        alone = replace(st, a_from=None, **({"residual": None} if residual.has(st) else {}))
        return Chain(f"{self.workload}.{st.name}", self.size, (alone,), self.dtype)

    @property
    def min_bytes(self) -> int:
        """Fewest bytes the chain must move: external inputs, weights and final output once."""
        total = sum(s.weight_bytes + (s.input_bytes if s.a_from is None else 0) for s in self.stages)
        return total + self.stages[-1].output_bytes


@dataclass(frozen=True)
class SizeParam:
    """One size of a workload, which the command line takes as ``--<name> LIST``."""

    name: str
    doc: str
    multiple_of: int = 1  # e.g. 8 for a width read in 16-byte pieces of halves
    least: int = 1  # the smallest accepted value (0 for a KV cache that may be empty)
    most: int = 65536  # the largest accepted value

    @property
    def accepted(self) -> str:
        """The values it accepts, in words, the same in every error, ``--help`` and the README."""
        step = f" multiple of {self.multiple_of}" if self.multiple_of > 1 else "n integer"
        return f"a{step} from {max(self.least, self.multiple_of if self.least else 0)} to {self.most}"

    def check(self, value: Any, workload: str) -> int:
        """``value`` if this size accepts it, else a :class:`WorkloadError` saying what it accepts."""
        if not isinstance(value, int) or isinstance(value, bool) or not self.least <= value <= self.most \
                or value % self.multiple_of:
            near = ""
            if isinstance(value, int) and self.least <= value <= self.most and self.multiple_of > 1:
                m = self.multiple_of
                near = " (nearest: " + " or ".join(str(v) for v in (value // m * m, value // m * m + m) if v) + ")"
            raise WorkloadError(f"workload {workload}: {flag(self.name)} {shown(value)}: accepted: {self.accepted}{near}")
        return value


# The kernels index each operand with 32-bit integers: no operand may hold this many elements.
MAX_ELEMENTS = 2 ** 31


@dataclass(frozen=True)
class Workload:
    """A named family of chains; ``defaults`` holds the fixed sizes, ``sweep`` the swept one, and
    ``sizes`` says what each size means (the command line's size flags come from it)."""

    name: str
    description: str
    sweep_param: str
    sweep: tuple[int, ...]
    defaults: Mapping[str, int]
    build: Callable[[Mapping[str, int]], tuple[Stage, ...]] = field(repr=False)
    sizes: tuple[SizeParam, ...] = ()
    # The layers of the whole network this chain repeats in: (fixed sizes, how many times), for the
    # multiplicity-weighted whole-network figure (bench --network).
    network: tuple[tuple[Mapping[str, int], int], ...] = ()
    # The built-in sizes where one sweep does not say them all (an attention layer's prompts and
    # decodes): a union of products of sizes, each over ``defaults``. Empty: the sweep alone.
    builtin: tuple[Mapping[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if {p.name for p in self.sizes} != set(self.params):
            raise ValueError(f"workload {self.name}: sizes must describe exactly {', '.join(self.params)}")

    def network_sizes(self, sweep: tuple[int, ...]) -> list[dict[str, int]]:
        """Every layer of the network at every value of the swept size."""
        return [{self.sweep_param: v, **layer} for v in sweep for layer, _ in self.network]

    def requested_sizes(self, flags: Mapping[str, Any], base: Mapping[str, tuple[int, ...]] | None = None
                        ) -> list[dict[str, int]]:
        """Every size the command line asks for: the size flags given (each a value or a list; any
        other key of ``flags`` is ignored) over ``base`` (a study file's sizes, else the built-in sizes)."""
        given: dict[str, tuple[int, ...]] = {}
        for key in size_flags():
            value = flags.get(key)
            if value is None:
                continue
            if key not in self.params:
                raise WorkloadError(f"workload {self.name} has no size {flag(key)}; accepted: "
                                    f"{', '.join(flag(p) for p in self.params)}")
            given[key] = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        bases = [base] if base else list(self.builtin) or [{self.sweep_param: self.sweep}]
        out: list[dict[str, int]] = []
        for b in bases:
            sizes = {**b, **given}
            keys = list(sizes)
            for values in itertools.product(*(sizes[k] for k in keys)):
                size = dict(zip(keys, values))
                if size not in out:
                    out.append(size)
        return out

    def size_param(self, name: str) -> SizeParam:
        return next(p for p in self.sizes if p.name == name)

    @property
    def params(self) -> tuple[str, ...]:
        return (self.sweep_param, *self.defaults)

    def chain(self, **size: int) -> Chain:
        """The chain at one size; unknown or non-positive size parameters are rejected."""
        unknown = set(size) - set(self.params)
        if unknown:
            raise WorkloadError(f"workload {self.name}: unknown size parameter {', '.join(sorted(unknown))}; "
                                f"accepted: {', '.join(self.params)}")
        full = {**self.defaults, **size}
        if self.sweep_param not in full:
            raise WorkloadError(f"workload {self.name}: {flag(self.sweep_param)} is required")
        for key, val in full.items():
            self.size_param(key).check(val, self.name)
        ordered = tuple((k, full[k]) for k in self.params)
        chain = Chain(self.name, ordered, self.build(full))
        for st in chain.stages:
            for what, elements in (("input", st.a_shape[0] * st.a_shape[1]), ("weight", st.n * st.k),
                                   ("output", st.m * st.n)):
                if elements >= MAX_ELEMENTS:
                    sizes = ", ".join(f"{flag(k)} {v}" for k, v in ordered)
                    raise WorkloadError(f"workload {self.name} at {sizes}: stage {st.name}'s {what} would hold "
                                        f"{elements} elements; accepted: fewer than 2^31 (smaller sizes)")
        return chain


def _gpt3_mlp(p: Mapping[str, int]) -> tuple[GemmStage, ...]:
    m, h, f = p["tokens"], p["hidden"], p["ffn"]
    return (GemmStage("gemm1", m, f, h, "gelu"), GemmStage("gemm2", m, h, f, "none", a_from=0))


def _llama_mlp(p: Mapping[str, int]) -> tuple[GemmStage, ...]:
    # Gate and up projections are interleaved in one weight of 2*ffn rows so that a
    # tile holds matching gate/up columns; the epilogue writes silu(gate) * up.
    m, h, f = p["tokens"], p["hidden"], p["ffn"]
    return (GemmStage("gemm1", m, 2 * f, h, "silu_mul"), GemmStage("gemm2", m, h, f, "none", a_from=0))


def _conv_chain(p: Mapping[str, int]) -> tuple[ConvStage, ...]:
    """``depth`` dependent 3x3 convolutions + ReLU at one resolution and channel count."""
    size = (p["batch"], p["height"], p["width"], p["channels"], p["channels"])
    return tuple(ConvStage(f"conv{i + 1}", *size, "relu", a_from=None if i == 0 else i - 1) for i in range(p["depth"]))


def _attention_layer(p: Mapping[str, int]) -> tuple[GemmStage | AttentionStage, ...]:
    """QKV projection, causal attention over the cache and the new tokens, output projection."""
    m, h, heads, kv, d = p["tokens"], p["hidden"], p["heads"], p["kv_heads"], p["head_dim"]
    attn = AttentionStage("attn", m, p["cache"], heads, kv, d, a_from=0)
    return (GemmStage("qkv", m, attn.qkv_cols, h, "none"), attn, GemmStage("out", m, h, heads * d, "none", a_from=1))


def _decoder_layer(norm: str, epilogue: str, up: int, rotary: bool) -> Callable[[Mapping[str, int]], tuple[Stage, ...]]:
    """A pre-norm decoder layer: the norm folded into the QKV GEMM (with rotary embeddings of the queries and
    keys in its epilogue where ``rotary``), causal attention over the cache and the new tokens (which it
    appends to the cache), the output GEMM plus the layer's input, the norm folded into the MLP's first GEMM (``up``
    projections of ``ffn`` interleaved, then ``epilogue``), the second GEMM plus the attention block's
    output (stage 2's). At decode sizes the cache's length is read at run time, up to ``cache``."""
    def build(p: Mapping[str, int]) -> tuple[Stage, ...]:
        m, h, heads, kv, d, f = p["tokens"], p["hidden"], p["heads"], p["kv_heads"], p["head_dim"], p["ffn"]
        # Decode reads the cache's length at run time (tuner.chain.length): ``cache`` is its room.
        dyn = p["cache"] > 0
        attn = AttentionStage("attn", m, p["cache"], heads, kv, d, a_from=0, append=True, dynamic=dyn)
        rot = Rope(d, heads // kv, p["cache"], dynamic=dyn) if rotary else None
        return (GemmStage("qkv", m, attn.qkv_cols, h, "none", norm=norm, rope=rot), attn,
                GemmStage("out", m, h, heads * d, "none", a_from=1, residual=residual.INPUT),
                GemmStage("up", m, up * f, h, epilogue, a_from=2, norm=norm),
                GemmStage("down", m, h, f, "none", a_from=3, residual=2))
    return build


def _layer(name: str, model: str, heads_doc: str, norm: str, mlp: str, defaults: Mapping[str, int],
           build: Callable[[Mapping[str, int]], tuple[Stage, ...]], rotary: bool) -> "Workload":
    return Workload(name, f"{model} decoder layer, 8-way tensor parallel ({heads_doc}): {norm} folded into the QKV "
                    f"GEMM{' (rotary embeddings in its epilogue)' if rotary else ''}, causal attention over a KV cache, output GEMM plus the input, {norm} folded into the "
                    f"{mlp}, down GEMM plus the attention block's output, fp16; attention appends the new "
                    f"keys and values to the cache; at decode the cache's length is read at run time, up to --cache", "tokens", (1, 4, 16), {"cache": 1024, **defaults, "head_dim": 128},
                    build, _LAYER_SIZES, builtin=_ATTN_REGIMES)


_POW2_TOKENS = tuple(2 ** i for i in range(13))

# The model widths are the GEMMs' K, read in 16-byte pieces (8 halves) along each row.
_MLP_SIZES = (SizeParam("tokens", "token counts (the GEMMs' M)", most=16384),
              SizeParam("hidden", "model widths", 8), SizeParam("ffn", "MLP widths (per GPU)", 8))


_ATTN_SIZES = (SizeParam("tokens", "new tokens (the queries)", most=16384),
               SizeParam("cache", "tokens already in the KV cache (0: a prompt)", least=0, most=131072),
               SizeParam("hidden", "model widths", 8), SizeParam("heads", "query heads (per GPU)", most=256),
               SizeParam("kv_heads", "key/value heads (per GPU)", most=256),
               SizeParam("head_dim", "head sizes", most=256))


_LAYER_SIZES = (*_ATTN_SIZES, SizeParam("ffn", "MLP widths (per GPU)", 8))

# Decode: a few new tokens on a long cache; prompt: the tokens attend to themselves.
_ATTN_REGIMES = ({"tokens": (1, 4), "cache": (1024,)}, {"tokens": (16,), "cache": (2048,)},
                 {"tokens": (512, 1024, 2048), "cache": (0,)})


def _attention(name: str, model: str, heads_doc: str, hidden: int, heads: int, kv_heads: int) -> "Workload":
    return Workload(name, f"{model} attention layer, 8-way tensor parallel ({heads_doc}): QKV GEMM, causal "
                    "attention over a KV cache, output GEMM, fp16; decode (a few tokens on a cache) and prompts (cache 0)",
                    "tokens", (1, 4, 16), {"cache": 1024, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
                                           "head_dim": 128}, _attention_layer, _ATTN_SIZES, builtin=_ATTN_REGIMES)


def _layers(*layers: tuple[int, int, int, int]) -> tuple[tuple[Mapping[str, int], int], ...]:
    """(square resolution, channels, chain depth, multiplicity) per layer."""
    return tuple(({"height": r, "width": r, "channels": c, "depth": d}, n) for r, c, d, n in layers)


# Input channels are read in 16-byte pieces (8 halves) per pixel.
_CONV_SIZES = (SizeParam("batch", "images per batch", most=1024), SizeParam("height", "image heights", most=4096),
               SizeParam("width", "image widths", most=4096),
               SizeParam("channels", "channels (in and out)", 8, most=8192),
               SizeParam("depth", "dependent convolutions in the chain", most=32))

WORKLOADS: dict[str, Workload] = {
    "gpt3": Workload("gpt3", "GPT-3 175B MLP, 8-way tensor parallel: GEMM1+GeLU then GEMM2, fp16",
                     "tokens", _POW2_TOKENS, {"hidden": 12288, "ffn": 6144}, _gpt3_mlp, _MLP_SIZES),
    "llama": Workload("llama", "LLaMA-2 70B MLP, 8-way tensor parallel: gate/up GEMM+SiLU*gate then down GEMM, fp16",
                      "tokens", _POW2_TOKENS, {"hidden": 8192, "ffn": 3584}, _llama_mlp, _MLP_SIZES),
    "resnet38": Workload("resnet38", "ResNet-38 basic block: two dependent 3x3 convolutions + ReLU, NHWC fp16 "
                         "(layers 56x56x64, 28x28x128, 14x14x256, 7x7x512)",
                         "batch", (1, 4, 8, 16, 32), {"height": 14, "width": 14, "channels": 256, "depth": 2},
                         _conv_chain, _CONV_SIZES,
                         _layers((56, 64, 2, 3), (28, 128, 2, 4), (14, 256, 2, 6), (7, 512, 2, 3))),
    "vgg19": Workload("vgg19", "VGG-19 block: four dependent 3x3 convolutions + ReLU, NHWC fp16 "
                      "(layers 28x28x256, 14x14x512, and the 56x56x128 pair)",
                      "batch", (1, 4, 8, 16, 32), {"height": 28, "width": 28, "channels": 256, "depth": 4},
                      _conv_chain, _CONV_SIZES, _layers((56, 128, 2, 1), (28, 256, 4, 1), (14, 512, 4, 1))),
    "gpt3-attn": _attention("gpt3-attn", "GPT-3 175B", "12 heads of 128 per GPU", 12288, 12, 12),
    "llama-attn": _attention("llama-attn", "LLaMA-2 70B", "8 query heads sharing 1 KV head per GPU", 8192, 8, 1),
    "gpt3-layer": _layer("gpt3-layer", "GPT-3 175B", "12 heads of 128 per GPU", "LayerNorm", "up GEMM with GeLU",
                         {"hidden": 12288, "heads": 12, "kv_heads": 12, "ffn": 6144}, _decoder_layer("layer", "gelu", 1, False), False),
    "llama-layer": _layer("llama-layer", "LLaMA-2 70B", "8 query heads sharing 1 KV head per GPU", "RMSNorm",
                          "gate/up GEMM with SwiGLU", {"hidden": 8192, "heads": 8, "kv_heads": 1, "ffn": 3584},
                          _decoder_layer("rms", "silu_mul", 2, True), True),
}


def integer_from(least: int) -> str:
    """What a size accepts, in words: a positive integer, or one of at least ``least``."""
    return "a positive integer" if least == 1 else f"an integer of at least {least}"


def flag(size: str) -> str:
    """A size's command-line flag: ``kv_heads`` is ``--kv-heads``."""
    return "--" + size.replace("_", "-")


def size_flags() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every size any workload has: its meaning and the workloads that have it, in first-seen order."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for wl in WORKLOADS.values():
        for p in wl.sizes:
            doc, names = out.get(p.name, (p.doc, ()))
            out[p.name] = (doc, (*names, wl.name))
    return out


def get_workload(name: str) -> Workload:
    """Look a workload up by name, with an error that lists the accepted names."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r}; accepted: {', '.join(WORKLOADS)}") from None


def chain_from_label(label: str) -> Chain:
    """The chain a label names (``Chain.label``): ``gpt3/tokens=64,...``, or a stage timed alone,
    ``gpt3.gemm1/tokens=64,...`` (``Chain.alone``)."""
    head, _, sizes = label.partition("/")
    workload, _, stage = head.partition(".")
    try:
        size = {k: int(v) for k, v in (kv.split("=") for kv in sizes.split(","))}
    except ValueError:
        raise WorkloadError(f"{label!r} is no chain label; accepted: WORKLOAD[.STAGE]/SIZE=N,...") from None
    chain = get_workload(workload).chain(**size)
    if not stage:
        return chain
    names = [s.name for s in chain.stages]
    if stage not in names:
        raise WorkloadError(f"{label!r}: {workload} has no stage {stage!r}; stages: {', '.join(names)}")
    return chain.alone(names.index(stage))
