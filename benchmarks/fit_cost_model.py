"""Fit the staged search's ranking of stage tilings to the stage-alone timings the recordings hold.

    python benchmarks/fit_cost_model.py [RECORDING ...] [--ridge L] [--write]

Reads every measured stage-alone record (labels ``workload.stage/...``) of the recordings
(default: ``studies/*.measurements.json`` and ``studies/search/*.measurements.json``), computes
``tuner.search.cost_model.features`` of each tiling, and fits, by ridge regression in logs, the measured
time's deviation from its stage's mean as a linear function of them: the fit learns to order
a stage's tilings, not to predict times. It first reports how well the coarse model and the fit
order the tilings of each size the fit has not seen (leave one size out): the median rank
correlation with the measured order, and how close the best of the four tilings each puts first
comes to the best recorded. With ``--write`` it fits on everything and writes
``tuner/cost_fit.json``, which ``tuner.search.cost_model.rank_seconds`` reads. The figures are replayed from
recordings: the fit can only be judged on tilings that were measured, which the staged search
chose.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.backends.base import DeviceInfo  # noqa: E402
from tuner.chain.workloads import chain_from_label  # noqa: E402
from tuner.config import Config, StageGrid  # noqa: E402
from tuner.search.cost_model import FIT_FILE, features, stage_seconds  # noqa: E402

TOP = 4  # tilings the search times first, per stage, in this report


def load(paths: list[str]) -> tuple[str, dict[str, list[tuple[float, dict[str, float], float]]]]:
    """Per stage-alone label, (measured seconds, features, coarse estimate) of each measured tiling."""
    rows: dict[str, list] = defaultdict(list)
    seen, devices = set(), set()
    dev = DeviceInfo("NVIDIA H200")  # the device whose timings the recordings hold
    for path in paths:
        doc = json.loads(Path(path).read_text())
        if doc.get("synthetic"):
            continue
        for r in doc["records"]:
            m = r["measurement"]
            if not m.get("ok") or m.get("replayed") or "." not in r["label"].split("/")[0]:
                continue
            key = (r["label"], json.dumps(r["config"], sort_keys=True))
            if key in seen:
                continue
            seen.add(key)
            devices.add(doc.get("device", {}).get("name", "?") if isinstance(doc.get("device"), dict)
                        else str(doc.get("device")))
            chain = chain_from_label(r["label"])
            g = StageGrid(chain.stages[0], Config.from_dict(r["config"]).tiles[0])
            rows[r["label"]].append((m["median_us"] * 1e-6, features(g, dev), stage_seconds(g, dev)))
    return ", ".join(sorted(devices)), {k: v for k, v in rows.items() if len(v) >= 6}


def _rank(a: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(a)).astype(float)


def judge(rows: dict[str, list], predict) -> dict[str, float]:
    """Median rank correlation and the best of each size's first TOP tilings against its best."""
    rho, top = [], []
    for label, rs in rows.items():
        meas = np.array([r[0] for r in rs])
        pred = np.asarray(predict(label, rs))
        rho.append(float(np.corrcoef(_rank(meas), _rank(pred))[0, 1]))
        top.append(meas[np.argsort(pred, kind="stable")[:TOP]].min() / meas.min())
    return {"median_rank_correlation": round(float(np.median(rho)), 3),
            "median_top_over_best": round(float(np.median(top)), 4),
            "share_top_within_2pct": round(float(np.mean(np.array(top) <= 1.02)), 3)}


def fit(rows: dict[str, list], names: list[str], ridge: float) -> np.ndarray:
    xs, ys = [], []
    for rs in rows.values():
        x = np.array([[r[1][n] for n in names] for r in rs])
        y = np.log([r[0] for r in rs])
        xs.append(x - x.mean(0))
        ys.append(y - y.mean())
    x, y = np.vstack(xs), np.concatenate(ys)
    return np.linalg.solve(x.T @ x + ridge * np.eye(len(names)), x.T @ y)


def size_of(label: str) -> str:
    """The chain size a stage-alone label belongs to (its stages share it)."""
    head, _, size = label.partition("/")
    return head.split(".")[0] + "/" + size


def workload_of(label: str) -> str:
    return label.split(".")[0]


def held_out_predictor(rows: dict[str, list], names: list[str], ridge: float, group):
    """Predictions for each label by a fit on the labels of every other group."""
    out: dict[str, np.ndarray] = {}
    for key in sorted({group(l) for l in rows}):
        w = fit({l: rs for l, rs in rows.items() if group(l) != key}, names, ridge)
        for label in (l for l in rows if group(l) == key):
            out[label] = np.array([[r[1][n] for n in names] for r in rows[label]]) @ w
    return lambda label, rs: out[label]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recordings", nargs="*")
    ap.add_argument("--ridge", type=float, default=1.0, help="ridge penalty (default 1)")
    ap.add_argument("--write", action="store_true", help=f"fit on everything and write {FIT_FILE.relative_to(ROOT)}")
    args = ap.parse_args()
    paths = args.recordings or sorted(glob.glob(str(ROOT / "studies" / "*.measurements.json"))
                                      + glob.glob(str(ROOT / "studies" / "search" / "*.measurements.json")))
    device, rows = load(paths)
    if not rows:
        raise SystemExit("no stage-alone measurements in the recordings; accepted: *.measurements.json files "
                         "that bench or study wrote on a GPU")
    names = sorted(next(iter(rows.values()))[0][1])
    coarse = judge(rows, lambda label, rs: [r[2] for r in rs])
    fitted = judge(rows, held_out_predictor(rows, names, args.ridge, size_of))
    unseen_model = judge(rows, held_out_predictor(rows, names, args.ridge, workload_of))
    n = sum(len(rs) for rs in rows.values())
    print(f"{n} measured stage-alone tilings of {len(rows)} stages at {len({size_of(l) for l in rows})} sizes "
          f"({device}); replayed from the recordings, each judged by a fit that has not seen its size "
          f"(or its workload at all):")
    print(f"{'ranking':24s} {'rank corr.':>10s} {'best of first ' + str(TOP) + ' / best':>22s} {'within 2%':>10s}")
    for name, j in (("coarse model", coarse), ("fitted, size unseen", fitted), ("fitted, workload unseen", unseen_model)):
        print(f"{name:24s} {j['median_rank_correlation']:10.2f} {j['median_top_over_best']:22.3f} "
              f"{j['share_top_within_2pct']:10.2f}")
    if args.write:
        w = fit(rows, names, args.ridge)
        doc = {"about": "tuner.search.cost_model.rank_seconds: log time = weights . features, fitted to order a stage's "
                        "tilings; written by benchmarks/fit_cost_model.py --write",
               "device": device, "records": n, "stages": len(rows), "ridge": args.ridge,
               "recordings": [str(Path(p).relative_to(ROOT)) for p in paths],
               "held_out": {"coarse model": coarse, "fitted, size unseen": fitted,
                            "fitted, workload unseen": unseen_model},
               "weights": {k: round(float(v), 6) for k, v in zip(names, w)}}
        FIT_FILE.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {FIT_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
