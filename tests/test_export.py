"""Exports: schema, determinism, and the C++ header."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tuner import UsageError
from tuner.backends.base import FAIL_REASONS
from tuner.backends.replay import ReplayBackend
from tuner.chain.workloads import get_workload
from tuner.config import Config
from tuner.paths import home
from tuner.search.space import load_space
from tuner.shipping.export import SCHEMA_VERSION, export, to_header
from tuner.study.loop import run_study

SPACE = home() / "search_spaces" / "gpt3.toml"


def tune(url: str, synthetic_file, tokens=(1, 64), trials=6) -> None:
    backend = ReplayBackend([synthetic_file])
    space = load_space(SPACE)
    for t in tokens:
        run_study(get_workload("gpt3").chain(tokens=t), space, backend, url, strategy="random", seed=4, trials=trials,
                  check=None)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, synthetic_file):
    d = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{d / 'a.db'}"
    tune(url, synthetic_file)
    return url, d


def test_json_export_schema(tuned):
    url, d = tuned
    doc = json.loads(export(url, "gpt3", d / "gpt3.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION and doc["workload"] == "gpt3"
    assert [r["size"]["tokens"] for r in doc["results"]] == [1, 64]
    for r in doc["results"]:
        assert r["replayed"] is True and r["synthetic"] is True
        assert r["trials"] == 6 and set(r["failures"]) == set(FAIL_REASONS)
        best = r["best"]
        assert Config.from_dict(best["config"]).params(("gemm1", "gemm2")) == best["params"]
        assert best["median_us"] <= r["baseline_us"]
        assert r["speedup"] == pytest.approx(r["baseline_us"] / best["median_us"])
        assert best["error"] is not None


def test_identical_studies_export_identical_bytes(tuned, tmp_path, synthetic_file):
    url, d = tuned
    other = f"sqlite:///{tmp_path / 'b.db'}"
    tune(other, synthetic_file)
    for fmt in ("json", "header"):
        a = export(url, "gpt3", d / f"a.{fmt}", fmt).read_bytes()
        b = export(other, "gpt3", tmp_path / f"b.{fmt}", fmt).read_bytes()
        assert a == b


def test_default_output_path(tuned, tmp_path, monkeypatch):
    url, _ = tuned
    monkeypatch.chdir(tmp_path)
    assert export(url, "gpt3").as_posix() == "tuned/gpt3.json"
    assert export(url, "gpt3", fmt="header").as_posix() == "tuned/gpt3.h"
    assert (tmp_path / "tuned" / "gpt3.h").exists()


def test_header_holds_one_entry_per_size(tuned, tmp_path):
    url, _ = tuned
    text = export(url, "gpt3", tmp_path / "gpt3.h", "header").read_text()
    assert "struct Gpt3Entry" in text and "constexpr Gpt3Entry kGpt3[]" in text
    assert "constexpr int kGpt3Count = 2;" in text
    assert text.count("Synthetic H200 model") == 2


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_header_compiles(tuned, tmp_path):
    url, _ = tuned
    header = export(url, "gpt3", tmp_path / "gpt3.h", "header")
    main = tmp_path / "main.cpp"
    main.write_text('#include "gpt3.h"\nstatic_assert(tuner_tuned::kGpt3Count == 2, "");\n'
                    "int main() { return tuner_tuned::kGpt3[0].tokens == 1 ? 0 : 1; }\n")
    subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{header.parent}", str(main)], check=True)


def test_nothing_to_export_is_a_usage_error(tuned, tmp_path):
    url, _ = tuned
    with pytest.raises(UsageError, match="no study of llama"):
        export(url, "llama", tmp_path / "x.json")
    with pytest.raises(UsageError, match="does not exist"):
        export(f"sqlite:///{tmp_path / 'none.db'}", "gpt3", tmp_path / "x.json")


def test_header_needs_a_successful_trial():
    doc = {"schema_version": 1, "workload": "gpt3", "tuner_version": "0", "results": [{"best": None}]}
    with pytest.raises(UsageError, match="no study has a successful trial"):
        to_header(doc)


def test_a_size_studied_both_ways_exports_one_runnable_entry_the_graph_timed_one(synthetic_file, tmp_path):
    """The JSON lists every study; a header (and a bundle) is looked up by size, so it holds one
    entry a size and names the study it left out."""
    url = f"sqlite:///{tmp_path / 'both.db'}"
    tune(url, synthetic_file, tokens=(1, 64))
    graphed = ReplayBackend([synthetic_file])
    graphed.graphs = True  # a study timed from graph replays, as --graphs on a GPU makes
    run_study(get_workload("gpt3").chain(tokens=64), load_space(SPACE), graphed, url, strategy="random", seed=5,
              trials=4, check=None)
    doc = json.loads(export(url, "gpt3", tmp_path / "all.json").read_text())
    assert [(r["size"]["tokens"], r["graphs"]) for r in doc["results"]] == [(1, False), (64, False), (64, True)]
    text = export(url, "gpt3", tmp_path / "gpt3.h", "header").read_text()
    assert "constexpr int kGpt3Count = 2;" in text
    plain_64 = next(r["study"] for r in doc["results"] if r["size"]["tokens"] == 64 and not r["graphs"])
    assert f"left out for a study of the same size timed from CUDA graphs (or with more trials): {plain_64}." in text
    graph_best = next(r["best"]["median_us"] for r in doc["results"] if r["graphs"])
    assert repr(float(graph_best)) in text


def test_one_entry_a_size_prefers_the_graph_timed_study_then_the_one_with_more_trials():
    from tuner.shipping.export import one_per_size

    def row(study, tokens, graphs, trials, device="H200"):
        return {"study": study, "device": device, "size": {"tokens": tokens}, "graphs": graphs, "trials": trials}

    rows = [row("a", 1, False, 50), row("b", 1, True, 10), row("c", 2, False, 5), row("d", 2, False, 9),
            row("e", 2, False, 9, device="H100")]
    kept, left = one_per_size(rows)
    assert [r["study"] for r in kept] == ["b", "d", "e"] and sorted(left) == ["a", "c"]
