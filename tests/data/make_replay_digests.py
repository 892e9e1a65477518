"""Replays every committed recording once and keeps a digest of what the study stored.

    python tests/data/make_replay_digests.py           # rewrite tests/data/replay_digests.json
    python tests/data/make_replay_digests.py --check   # exit 1 where a replay stores something else

A change meant to keep behaviour as it is (a restructuring, a rename) must leave every digest
as it was: each is the SHA-256 of the export (``tuner.shipping.export.document``) of a study that replays
one recording's first chain with the default strategy and a small budget, so it covers the
parameter names, the configs, the trial order and the figures. ``tests/test_replay_digests.py``
runs the check. Rewrite the file only with a change that means to alter what a study does, and
say so in its commit.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "tests" / "data" / "replay_digests.json"
TRIALS = 12  # the stage pass's first batch and the baseline: what every study does first


def recordings() -> list[Path]:
    return sorted((ROOT / "studies").rglob("*.measurements.json"))


def digest(path: Path) -> str | None:
    """The digest of one recording's replay; None where it holds no whole chain of a built-in space."""
    from tuner.backends.replay import ReplayBackend
    from tuner.chain.workloads import chain_from_label
    from tuner.paths import home
    from tuner.search.space import load_space
    from tuner.shipping.export import document, to_json
    from tuner.study.loop import run_study

    backend = ReplayBackend([path])
    chains = sorted((chain_from_label(lb) for lb in backend.labels() if "." not in lb.split("/", 1)[0]),
                    key=lambda c: (c.workload, tuple(v for _, v in c.size)))
    if not chains:
        return None
    chain = chains[0]
    space = load_space(home() / "search_spaces" / f"{chain.workload}.toml")
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/d.db"
        run_study(chain, space, backend, storage, trials=TRIALS, seed=0, final=False, transfer=False)
        text = to_json(document(storage, chain.workload))
    return hashlib.sha256(text.encode()).hexdigest()


def all_digests() -> dict[str, str]:
    out = {}
    for path in recordings():
        d = digest(path)
        if d is not None:
            out[str(path.relative_to(ROOT))] = d
    return out


def main() -> int:
    got = all_digests()
    if "--check" in sys.argv[1:]:
        want = json.loads(DIGESTS.read_text())
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        for k in bad:
            print(f"{k}: the replay stores something else than before", file=sys.stderr)
        return 1 if bad else 0
    DIGESTS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(got)} digests to {DIGESTS}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
