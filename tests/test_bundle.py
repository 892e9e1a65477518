"""export --format bundle and tuner.shipping.runtime: what runs without a GPU (writing, compiling, checking
arguments, choosing the entry); running the chains is in tests/test_gpu.py."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.shipping.runtime import RuntimeArgumentError, load

ROOT = Path(__file__).resolve().parent.parent


class FakeDeviceArray:
    """Just the CUDA array interface, as CuPy and PyTorch expose it."""

    def __init__(self, shape, typestr="<f2", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides, "data": (0, False),
                                         "version": 3}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("cuda.bindings.nvrtc")
    from tuner.codegen import compile as tc

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    work = tmp_path_factory.mktemp("bundle")
    url = f"sqlite:///{work / 's.db'}"
    study = [sys.executable, "-m", "tuner", "study", "gpt3", "--tokens", "1,256", "--trials", "12", "--strategy",
             "random", "--backend", "replay", "--storage", url]
    subprocess.run(study, cwd=ROOT, check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "tuner", "export", "gpt3", "--format", "bundle", "-o",
                           str(work / "out"), "--storage", url], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return work / "out"


def test_the_bundle_holds_source_cubin_and_manifest_per_size(bundle):
    index = json.loads((bundle / "index.json").read_text())
    assert index["workload"] == "gpt3" and index["sweep"] == "tokens"
    assert sorted(e["size"]["tokens"] for e in index["entries"]) == [1, 256]
    for e in index["entries"]:
        entry = bundle / e["path"]
        m = json.loads((entry / "manifest.json").read_text())
        assert (entry / "chain.cubin").read_bytes()[:4] == b"\x7fELF"
        assert m["source_hash"] == hashlib.sha256((entry / "chain.cu").read_bytes()).hexdigest()
        assert m["buffers"] == {"x": [e["size"]["tokens"], 12288], "w0": [6144, 12288], "y0": [e["size"]["tokens"], 6144],
                                "w1": [12288, 6144], "y1": [e["size"]["tokens"], 12288]}
        assert m["replayed"] and m["arch"] == "sm_90a" and m["launches"]
        assert all(set(l) == {"kernel", "grid", "threads", "smem", "stream", "pdl", "grid_cap", "cluster"}
                       for l in m["launches"])


def test_the_runtime_takes_the_exact_entry_or_pads_to_the_next_larger(bundle):
    rt = load(bundle)
    w = [FakeDeviceArray((6144, 12288)), FakeDeviceArray((12288, 6144))]
    entry, pad = rt.entry_for(FakeDeviceArray((256, 12288)), w)
    assert entry["size"]["tokens"] == 256 and not pad
    entry, pad = rt.entry_for(FakeDeviceArray((100, 12288)), w)
    assert entry["size"]["tokens"] == 256 and pad
    with pytest.raises(RuntimeArgumentError, match="no tuned entry takes 300 rows .* the bundle has 1, 256"):
        rt.entry_for(FakeDeviceArray((300, 12288)), w)


@pytest.mark.parametrize("x, w, message", [
    (FakeDeviceArray((1, 12288), "<f4"), None, "x: fp16 is expected"),
    (FakeDeviceArray((1, 12288), strides=(2, 4)), None, "x: a C-contiguous"),
    (FakeDeviceArray((1, 4096)), None, r"x: shape \(1, 4096\) does not fit gpt3/tokens=1"),
    (FakeDeviceArray((1, 12288)), [FakeDeviceArray((6144, 12288))], "2 weights are expected"),
    (FakeDeviceArray((12288,)), None, "a 2-d array"),
])
def test_the_runtime_refuses_arguments_that_do_not_fit_in_one_line(bundle, x, w, message):
    rt = load(bundle)
    w = w if w is not None else [FakeDeviceArray((6144, 12288)), FakeDeviceArray((12288, 6144))]
    with pytest.raises(RuntimeArgumentError, match=message) as exc:
        rt.entry_for(x, w)
    assert "\n" not in str(exc.value)


def test_a_host_array_is_refused(bundle):
    np = pytest.importorskip("numpy")
    with pytest.raises(RuntimeArgumentError, match="x: a CUDA array is expected .* numpy.ndarray on the host"):
        load(bundle).entry_for(np.zeros((1, 12288), np.float16), [])


def test_a_folder_that_is_no_bundle_is_refused(tmp_path):
    with pytest.raises(Exception, match="no index.json or manifest.json"):
        load(tmp_path)


def test_the_bundle_carries_the_cpp_launcher_and_entry_facts_it_reads(bundle):
    for name in ("tuner_chain.h", "tuner_chain.cpp", "example.cpp"):
        assert (bundle / "cpp" / name).is_file()
    for e in json.loads((bundle / "index.json").read_text())["entries"]:
        m = json.loads((bundle / e["path"] / "manifest.json").read_text())
        facts = (bundle / e["path"] / "entry.txt").read_text().splitlines()
        assert f"state_words {m['state_words']}" in facts and "epilogue gelu" in facts and "epilogue none" in facts
        assert [f.split()[1] for f in facts if f.startswith("launch ")] == [l["kernel"] for l in m["launches"]]
        # kernel, grid, threads, shared memory, stream, pdl, a persistent stage's grid cap, cluster
        assert [f.split()[7:] for f in facts if f.startswith("launch ")] == [
            [str(l["grid_cap"]), str(l["cluster"])] for l in m["launches"]]


def test_the_cpp_launcher_and_example_compile_against_the_cuda_headers(bundle, tmp_path):
    import shutil

    include = next((p for p in (Path("/usr/local/cuda/include"), *sorted(Path("/usr/local").glob("cuda-*/include")))
                    if (p / "cuda.h").is_file()), None)
    compiler = shutil.which("g++") or shutil.which("c++")
    if include is None or compiler is None:
        pytest.skip("no CUDA headers or C++ compiler here")
    for src in ("tuner_chain.cpp", "example.cpp"):
        done = subprocess.run([compiler, "-std=c++17", "-Wall", "-Werror", "-c", f"-I{include}",
                               str(bundle / "cpp" / src), "-o", str(tmp_path / (src + ".o"))],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_a_bundle_without_nvrtc_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    import tuner.codegen.compile
    from tuner.cli import main

    def missing():
        raise tuner.codegen.compile.ToolchainMissing("NVRTC is not available (libnvrtc.so: cannot open shared object file)")

    monkeypatch.setattr(tuner.codegen.compile, "toolkit_version", missing)
    assert main(["export", "gpt3", "--format", "bundle", "--storage", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVRTC" in err and ".[compile]" in err


def test_convolution_entries_take_nhwc_images_of_their_exact_size(tmp_path):
    """A convolution bundle's entry is named by the images' size; no padding across sizes."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from tuner.chain.workloads import get_workload
    from tuner.codegen import compile as tc
    from tuner.search.cases import coverage
    from tuner.shipping.bundle import write_entry

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    chain = get_workload("resnet38").chain(batch=2, height=14, width=14, channels=64)
    entry = write_entry(tmp_path / "e", chain, coverage(chain)[0], {"name": "NVIDIA H200", "arch": "sm_90"})
    rt = load(entry)
    w = [FakeDeviceArray((64, 576)), FakeDeviceArray((64, 576))]
    got, pad = rt.entry_for(FakeDeviceArray((2, 14, 14, 64)), w)
    assert got["size"]["batch"] == 2 and not pad
    with pytest.raises(RuntimeArgumentError, match="no tuned entry takes NHWC images 1x14x14x64"):
        rt.entry_for(FakeDeviceArray((1, 14, 14, 64)), w)
    with pytest.raises(RuntimeArgumentError, match="no tuned entry takes 196 rows"):
        rt.entry_for(FakeDeviceArray((196, 64)), w)  # fewer pixels as a matrix: not padded for a convolution


def test_attention_entries_take_the_kv_cache_in_the_weights_place(tmp_path):
    """An attention layer's entry: x [tokens, hidden], then the QKV weight, the cache
    [kv_heads * 2 * cache, head_dim] and the output weight; a cache of another length has no entry."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from tuner.chain.workloads import get_workload
    from tuner.codegen import compile as tc
    from tuner.search.cases import coverage
    from tuner.shipping.bundle import write_entry

    try:
        tc.toolkit_version()
    except tc.ToolchainMissing:
        pytest.skip("NVRTC is not installed (pip install -e '.[compile]')")
    chain = get_workload("llama-attn").chain(tokens=4, cache=1024)
    entry = write_entry(tmp_path / "e", chain, coverage(chain)[0], {"name": "NVIDIA H200", "arch": "sm_90"})
    m = json.loads((entry / "manifest.json").read_text())
    assert m["buffers"]["w1"] == [2 * 1024, 128] and m["buffers"]["y1"] == [4, 1024] and m["pads_rows"]
    rt = load(entry)
    w = [FakeDeviceArray((1280, 8192)), FakeDeviceArray((2048, 128)), FakeDeviceArray((8192, 1024))]
    got, pad = rt.entry_for(FakeDeviceArray((4, 8192)), w)
    assert got["size"]["cache"] == 1024 and not pad
    with pytest.raises(RuntimeArgumentError, match=r"w1: shape \(4096, 128\) does not fit llama-attn/tokens=4,cache=1024"):
        rt.entry_for(FakeDeviceArray((4, 8192)), [w[0], FakeDeviceArray((4096, 128)), w[2]])
    # Tokens appended after the last are never attended by it (causal): 3 tokens run padded to 4.
    got, pad = rt.entry_for(FakeDeviceArray((3, 8192)), w)
    assert got["size"]["tokens"] == 4 and pad
    with pytest.raises(RuntimeArgumentError, match="no tuned entry takes 5 rows of input .the tokens size.; the bundle "
                                                   "has 4; accepted: at most 4 rows, or tune that size"):
        rt.entry_for(FakeDeviceArray((5, 8192)), w)


class FakeCupyArray:
    """Shape, dtype and strides as attributes too, as CuPy arrays have them; counts interface reads."""

    def __init__(self, shape, dtype="float16"):
        self._iface = {"shape": shape, "typestr": "<f2" if dtype == "float16" else "<f4", "strides": None,
                       "data": (0, False), "version": 3}
        self.shape, self.dtype, self.reads = shape, dtype, 0
        self.strides = tuple(2 * n for n in (shape[1], 1)) if len(shape) == 2 else (2,)

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        return self._iface


def test_a_call_like_an_earlier_one_skips_the_checks_and_a_new_signature_is_checked(bundle):
    rt = load(bundle)
    x, w = FakeCupyArray((256, 12288)), [FakeCupyArray((6144, 12288)), FakeCupyArray((12288, 6144))]
    first = rt.entry_for(x, w)
    reads = x.reads
    assert reads > 0 and rt.entry_for(x, w) == first and x.reads == reads  # answered from the signature
    with pytest.raises(RuntimeArgumentError, match="x: fp16 is expected"):
        rt.entry_for(FakeCupyArray((256, 12288), "float32"), w)
    with pytest.raises(RuntimeArgumentError, match="no tuned entry takes 300 rows"):
        rt.entry_for(FakeCupyArray((300, 12288)), w)
