"""python -m tuner report: plots and a page from recorded bench summaries, without a GPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.chain.workloads import get_workload
from tuner.cli import main
from tuner.paths import home
from tuner.shipping.report import LATER_RUNS, collect_series, default_summaries, write_report

pytest.importorskip("matplotlib")


def summary(tmp_path: Path, name: str, rows: list[dict], graphs: bool = False) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"kind": "tuner-bench", "workload": "gpt3", "device": {"name": "NVIDIA H200"},
                             "rows": rows, "graphs": graphs}))
    return p


def row(tokens: int, tuned: float, hidden: int = 12288, ffn: int = 6144) -> dict:
    return {"label": f"gpt3/tokens={tokens},hidden={hidden},ffn={ffn}",
            "size": {"tokens": tokens, "hidden": hidden, "ffn": ffn}, "tuned_us": tuned, "tuned": "tile",
            "stream_us": tuned * 1.02, "tile_us": tuned, "floor_us": tuned / 2,
            "baselines_us": {"torch graph": tuned * 1.1, "cupy cublas": tuned * 1.3}}


def test_the_shipped_summaries_draw_every_shape(tmp_path):
    page = write_report("gpt3", out_dir=tmp_path)
    text = page.read_text()
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 2 * len(collect_series("gpt3", default_summaries("gpt3")))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all(f"]({p.name})" in text for p in pngs)
    # The summary written before rows carried their size still reads, at the default sizes.
    old = collect_series("gpt3", [home() / "studies" / "gpt3.bench.json"])
    assert (64, 80.016) in [(r["size"]["tokens"], r["tuned_us"]) for s in old for r in s.rows]
    assert "not a replay" in text


def test_a_later_summary_wins_for_the_same_size_and_shapes_are_kept_apart(tmp_path):
    old = summary(tmp_path, "a.bench.json", [row(1, 90.0), row(256, 130.0)])
    new = summary(tmp_path, "b.bench.json", [row(256, 120.0), row(200, 100.0, hidden=4096, ffn=16384)])
    series = collect_series("gpt3", [old, new])
    assert [s.name for s in series] == ["hidden=12288,ffn=6144", "hidden=4096,ffn=16384"]
    assert [(r["size"]["tokens"], r["tuned_us"]) for r in series[0].rows] == [(1, 90.0), (256, 120.0)]
    page = write_report("gpt3", [old, new], tmp_path / "out").read_text()
    assert "| 256 | 120.0 (tile) | 122.4 | - | 132.0 (torch graph) | 1.100 | 60.0 | - | 1.020 |" in page  # no PDL chain


def test_a_file_that_is_not_a_bench_summary_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"kind": "tuner-measurements"}))
    assert main(["report", "gpt3", "--summary", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a bench summary of gpt3" in err


def test_the_whole_network_figures_get_their_table(tmp_path):
    p = tmp_path / "resnet38-net.bench.json"
    rows = [{"label": "resnet38/batch=1,height=14,width=14,channels=256,depth=2",
             "size": {"batch": 1, "height": 14, "width": 14, "channels": 256, "depth": 2}, "tuned_us": 20.0,
             "tuned": "tile", "stream_us": 22.0, "tile_us": 20.0, "floor_us": 2.0, "baselines_us": {"torch graph": 25.0}}]
    p.write_text(json.dumps({"kind": "tuner-bench", "workload": "resnet38", "device": {"name": "NVIDIA H200"},
                             "graphs": True, "rows": rows,
                             "network": [{"batch": 1, "us": {"tuned": 300.0, "stream": 330.0, "floor": 30.0,
                                                             "torch graph": 375.0},
                                          "formula": "3 x 56x56x64 + 4 x 28x28x128"}]}))
    text = write_report("resnet38", [p], tmp_path / "out").read_text()
    assert "| 1 | 300.0 | 330.0 | 375.0 | 1.250 | 30.0 | 3 x 56x56x64 + 4 x 28x28x128 | `resnet38-net.bench.json` " \
           "(in CUDA graphs) |" in text
    assert "(in CUDA graphs) |" in text.split("## Whole network")[0]


def test_a_workloads_default_summaries_are_its_own_even_where_a_name_starts_like_another():
    gpt3 = default_summaries("gpt3")
    attn = default_summaries("gpt3-attn")
    assert gpt3 and attn
    assert all(json.loads(p.read_text())["workload"] == "gpt3" for p in gpt3)  # no gpt3-attn-*.bench.json
    assert {p.name for p in attn} >= {"gpt3-attn-decode.bench.json", "gpt3-attn-prompt.bench.json"}


def test_a_row_timed_in_graphs_outranks_one_timed_as_launches_and_a_run_outranks_a_search(tmp_path):
    """PyTorch's best is a graph: a row timed as launches must not hide one timed on equal terms,
    whichever file comes later, and a search from scratch must not hide a bench run's row."""
    graphed = summary(tmp_path, "a.bench.json", [row(320, 95.0)], graphs=True)
    launched = summary(tmp_path, "b.bench.json", [row(320, 108.0), row(1, 50.0)])
    series = collect_series("gpt3", [graphed, launched])
    assert [(r["size"]["tokens"], r["tuned_us"]) for r in series[0].rows] == [(1, 50.0), (320, 95.0)]
    shipped = default_summaries("llama")
    searches = [i for i, p in enumerate(shipped) if p.parent.name == "search"]
    assert searches and max(searches) < min(i for i, p in enumerate(shipped) if p.parent.name != "search")
    (s,) = [s for s in collect_series("llama", shipped) if s.name == "hidden=8192,ffn=3584"]
    assert s.sources[get_workload("llama").chain(tokens=320).label].endswith("llama-1-64-320.bench.json")
    # A run made after a kernel change (realloc/) outranks the earlier runs of the same size.
    later = [i for i, p in enumerate(shipped) if p.parent.name in LATER_RUNS]
    assert later and min(later) > max(i for i, p in enumerate(shipped) if p.parent.name == "studies")
    assert s.sources[get_workload("llama").chain(tokens=1024).label].endswith("realloc/llama-1024.bench.json")


def test_a_summary_timed_under_sustained_load_says_so_beside_its_source(tmp_path):
    p = summary(tmp_path, "hot.bench.json", [row(2048, 800.0)], graphs=True)
    doc = json.loads(p.read_text())
    p.write_text(json.dumps({**doc, "sustained_s": 2.0}))
    text = write_report("gpt3", [p], tmp_path / "out").read_text()
    assert "hot.bench.json` (in CUDA graphs, each after 2 s of its own runs) |" in text
