"""Every committed recording replays to the same stored study as when its digest was made.

A restructuring must not change what a study does: each recording's replay (see
tests/data/make_replay_digests.py) is compared with its digest. The first recording of each
workload runs in the default suite; the rest with ``-m slow``.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
_spec = importlib.util.spec_from_file_location("make_replay_digests", DATA / "make_replay_digests.py")
maker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(maker)
DIGESTS: dict[str, str] = json.loads(maker.DIGESTS.read_text())


def _workload(path: str) -> str:
    records = json.loads((ROOT / path).read_text()).get("records", [])
    return records[0]["label"].split("/", 1)[0].split(".", 1)[0] if records else ""


def _cases() -> list:
    first: dict[str, str] = {}
    for path in sorted(DIGESTS):
        first.setdefault(_workload(path), path)
    return [pytest.param(p, marks=() if p in first.values() else pytest.mark.slow, id=p) for p in sorted(DIGESTS)]


def test_every_committed_recording_has_a_digest():
    assert sorted(str(p.relative_to(ROOT)) for p in maker.recordings()) == sorted(DIGESTS)


@pytest.mark.parametrize("path", _cases())
def test_a_recording_replays_to_the_study_its_digest_was_made_from(path):
    assert maker.digest(ROOT / path) == DIGESTS[path], (
        f"replaying {path} stores another study than before; if the change means to alter what a study does, "
        "rewrite the digests with python tests/data/make_replay_digests.py and say so")
