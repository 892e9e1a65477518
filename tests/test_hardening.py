"""What a storage, a bundle or a file hands back is checked before anything uses it; reading
commands never write; a dead worker's claims do not hold a study up; the edges a new user meets.

The tampering tests edit a stored study the way anyone with access to a shared database can
(Optuna's own tables, by SQL) and show that every command that reads the edited value refuses
it in one line naming the study and trial, and writes nothing that carries it.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tuner import cli
from tuner.chain.workloads import WORKLOADS, WorkloadError, flag, get_workload
from tuner.config import Config, ConfigError
from tuner.storage.claims import ClaimBoard
from tuner.storage.database import driver_url

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "data" / "synthetic_measurements.json"

# Values no field accepts: text that would leave a C comment or string, counts out of range or
# of the wrong type. Each is written into a stored study in turn.
EVIL = ["serial\n#error planted", 'row"; asm("trap"); //', "*/ #error planted /*", 10 ** 30, -5, 0, 3.5, True,
        None, "64", [], {"bm": 64}, "x" * 5000]
PLANT = "planted"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make_study(url: str, capsys) -> None:
    code, _, err = run(capsys, "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
                       "--tokens", "64", "--trials", "8", "--strategy", "random", "--seed", "1", "--storage", url)
    assert code == 0, err


def engine(url: str) -> sa.Engine:
    return sa.create_engine(driver_url(url))


def chain_study_id(conn) -> int:
    return conn.execute(sa.text("SELECT study_id FROM studies WHERE study_name NOT LIKE '%/gemm%' "
                                "ORDER BY study_id LIMIT 1")).scalar_one()


def tamper(url: str, kind: str, evil, rnd: random.Random) -> None:
    """One edit of the stored chain study: ``param`` a categorical's stored choices (the value a
    trial's parameter decodes to), ``attr`` a trial's stored config, ``device`` its device record."""
    e = engine(url)
    with e.begin() as conn:
        sid = chain_study_id(conn)
        tids = [r[0] for r in conn.execute(sa.text("SELECT trial_id FROM trials WHERE study_id = :s"), {"s": sid})]
        tid = rnd.choice(tids)
        if kind == "param":
            rows = conn.execute(sa.text("SELECT param_id, param_name, distribution_json FROM trial_params "
                                        "WHERE trial_id = :t"), {"t": tid}).fetchall()
            pid, _, dist = rnd.choice(rows)
            d = json.loads(dist)
            d["attributes"]["choices"] = list(d["attributes"]["choices"]) + [evil]
            conn.execute(sa.text("UPDATE trial_params SET distribution_json = :d, param_value = :v "
                                 "WHERE param_id = :p"),
                         {"d": json.dumps(d), "v": float(len(d["attributes"]["choices"]) - 1), "p": pid})
        elif kind == "attr":
            (cfg,) = conn.execute(sa.text("SELECT value_json FROM trial_user_attributes WHERE trial_id = :t AND "
                                          "key = 'config'"), {"t": tid}).one()
            c = json.loads(cfg)
            if rnd.random() < 0.5:
                c["tiles"][0][rnd.choice(list(c["tiles"][0]))] = evil
            else:
                c[rnd.choice(["policy", "order", "dispatch", "launch"])] = evil
            conn.execute(sa.text("UPDATE trial_user_attributes SET value_json = :v WHERE trial_id = :t AND "
                                 "key = 'config'"), {"v": json.dumps(c), "t": tid})
        elif kind == "device":
            conn.execute(sa.text("UPDATE study_user_attributes SET value_json = :v WHERE study_id = :s AND "
                                 "key = 'device'"), {"v": json.dumps(evil), "s": sid})
    e.dispose()


def assert_refused(code: int, err: str, *, trial: bool) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    assert "study '" in lines[0] and (not trial or "trial" in lines[0]), lines[0]
    assert "\n#error" not in err and "internal error" not in err


def fuzz(reset, capsys, tmp_path: Path, seed: int, rounds: int) -> None:
    """``rounds`` random edits, each of a pristine copy of the study (``reset()`` gives its URL)."""
    rnd = random.Random(seed)
    for i in range(rounds):
        url = reset()
        kind = rnd.choice(["param", "attr"] if i % 3 else ["device"])
        evil = rnd.choice(EVIL if kind != "device" else [e for e in EVIL if not isinstance(e, str)]
                          + ["H200\n#error planted", "H200\x1b[2J planted", "H200\r#error planted"])
        tamper(url, kind, evil, rnd)
        for argv in (["show", "gpt3"], ["export", "gpt3", "--format", "header", "-o", str(tmp_path / "t.h")],
                     ["export", "gpt3", "-o", str(tmp_path / "t.json")]):
            code, out, err = run(capsys, *argv, "--storage", url)
            assert_refused(code, err, trial=kind != "device")
        if kind != "device":  # resuming the study reads every trial back
            code, out, err = run(capsys, "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
                                 "--tokens", "64", "--trials", "9", "--strategy", "random", "--seed", "1",
                                 "--storage", url)
            assert_refused(code, err, trial=True)
        for f in tmp_path.glob("t.*"):
            assert PLANT not in f.read_text(), f"{f} carries the planted text"


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_every_edit_of_a_stored_sqlite_study_is_refused_in_one_line(capsys, tmp_path, seed):
    db = tmp_path / "pristine.db"
    make_study(f"sqlite:///{db}", capsys)
    copies = iter(range(10 ** 6))

    def reset() -> str:
        copy = tmp_path / f"copy{next(copies)}.db"
        with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)  # the study as committed, its write-ahead log included
        return f"sqlite:///{copy}"

    fuzz(reset, capsys, tmp_path, seed=seed, rounds=5)


def test_every_edit_of_a_stored_postgresql_study_is_refused_in_one_line(capsys, tmp_path, postgres):
    make_study(postgres, capsys)
    e = engine(postgres)
    tables = ("trial_params", "trial_user_attributes", "study_user_attributes")
    with e.connect() as conn:
        saved = {t: conn.execute(sa.text(f"SELECT * FROM {t}")).mappings().all() for t in tables}
    e.dispose()

    def reset() -> str:
        e = engine(postgres)
        with e.begin() as conn:
            for t in tables:
                conn.execute(sa.text(f"DELETE FROM {t}"))
                for row in saved[t]:
                    cols = ", ".join(row)
                    conn.execute(sa.text(f"INSERT INTO {t} ({cols}) VALUES ({', '.join(':' + c for c in row)})"),
                                 dict(row))
        e.dispose()
        return postgres

    fuzz(reset, capsys, tmp_path, seed=21, rounds=6)


# ---------------------------------------------------------------------------
# Configs from files and values, checked at the edge


@pytest.mark.parametrize("evil", EVIL)
def test_a_config_file_with_a_bad_value_is_refused_naming_where(evil):
    good = {"tiles": [{"bm": 64, "bn": 64, "bk": 64, "wm": 2, "wn": 2, "stages": 3}], "policy": "stream",
            "order": "row", "dispatch": "block", "launch": "serial"}
    for path in (("tiles", 0, "bm"), ("tiles", 0, "mma"), ("launch",), ("policy",)):
        d = json.loads(json.dumps(good))
        target = d
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = evil
        with pytest.raises(ConfigError, match=r"^bundle\.json: "):
            Config.from_dict(d, "bundle.json")
    assert Config.from_dict(good).check() == Config.from_dict(good)


def test_the_renderer_refuses_a_config_whose_names_are_not_the_templates(tmp_path):
    from dataclasses import replace

    from tuner.codegen.render import render

    chain = get_workload("gpt3").chain(tokens=64)
    good = Config.from_dict({"tiles": [{"bm": 64, "bn": 64, "bk": 64, "wm": 2, "wn": 2, "stages": 3}] * 2,
                             "policy": "stream", "order": "row", "dispatch": "block", "launch": "serial"})
    for bad in (replace(good, launch="serial\n#error planted"), replace(good, policy="tile */"),
                replace(good, tiles=(replace(good.tiles[0], bm="64\n#error"), good.tiles[1]))):
        with pytest.raises(ConfigError):
            render(chain, bad)


def test_a_bundle_manifest_with_a_bad_config_or_file_is_refused(tmp_path):
    from tuner.shipping.runtime import BundleError, read_manifest

    m = {"workload": "gpt3", "size": {"tokens": 64, "hidden": 12288, "ffn": 6144}, "files": {"cubin": "chain.cubin"},
         "config": {"tiles": [{"bm": 64, "bn": 64, "bk": 64, "wm": 2, "wn": 2, "stages": 3}] * 2,
                    "policy": "stream", "order": "row", "dispatch": "block", "launch": "serial"}}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert read_manifest(tmp_path)["config"] == m["config"]
    for edit, error in ((lambda d: d["config"].update(launch="serial\n"), ConfigError),
                        (lambda d: d["files"].update(cubin="../../etc/passwd"), BundleError),
                        (lambda d: d["size"].update(tokens=10 ** 9), WorkloadError)):
        d = json.loads(json.dumps(m))
        edit(d)
        (tmp_path / "manifest.json").write_text(json.dumps(d))
        with pytest.raises(error):
            read_manifest(tmp_path)


def test_a_bench_summary_with_a_bad_pick_is_refused_naming_the_file(tmp_path):
    from tuner.bench.runs import picked_configs

    label = get_workload("gpt3").chain(tokens=64).label
    row = {"label": label, "tile_config": {"tiles": [{"bm": "64; #error", "bn": 64, "bk": 64, "wm": 2, "wn": 2,
                                                      "stages": 3}] * 2,
                                           "policy": "tile", "order": "row", "dispatch": "block", "launch": "serial"}}
    f = tmp_path / "s.bench.json"
    f.write_text(json.dumps({"rows": [row]}))
    with pytest.raises(ConfigError, match=re.escape(f"{f}: rows[0].tile_config")):
        picked_configs(f, label)


# ---------------------------------------------------------------------------
# Reading commands never write


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("content", ["empty", "foreign", "studies"])
def test_reading_commands_leave_an_sqlite_file_and_its_folder_as_they_were(capsys, tmp_path, content):
    db = tmp_path / "db" / "x.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    if content == "empty":
        db.touch()
    elif content == "foreign":
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE notes (text)")
    else:
        make_study(url, capsys)
    before = digest(db.parent)
    for argv in (["show", "gpt3"], ["list"], ["export", "gpt3", "-o", str(tmp_path / "e.json")],
                 ["export", "gpt3", "--format", "recording", "-o", str(tmp_path / "e.rec")]):
        code, out, err = run(capsys, *argv, "--storage", url)
        if content != "studies":
            assert (code == 0 and "none" in out) if argv == ["list"] else code == 2, err
            assert argv == ["list"] or re.fullmatch(r"tuner: error: storage \S+ holds no study[^\n]*\n", err), err
        assert digest(db.parent) == before, f"{argv[0]} changed the storage's folder"


def test_reading_commands_create_no_table_in_an_empty_postgresql_database(capsys, postgres, tmp_path):
    for argv in (["show", "gpt3"], ["export", "gpt3", "-o", str(tmp_path / "e.json")], ["list"]):
        code, _, err = run(capsys, *argv, "--storage", postgres)
        assert code == (0 if argv == ["list"] else 2), err
    e = engine(postgres)
    assert sa.inspect(e).get_table_names() == []
    e.dispose()


def test_the_recording_export_of_a_replayed_study_says_why_there_is_none(capsys, storage, tmp_path):
    make_study(storage, capsys)
    code, _, err = run(capsys, "export", "gpt3", "--format", "recording", "-o", str(tmp_path / "r.json"),
                       "--storage", storage)
    assert code == 2 and "replay recorded measurements" in err and "GPU measurements only" in err


# ---------------------------------------------------------------------------
# Claims of dead workers


def test_a_claim_of_a_process_of_this_host_that_is_gone_is_taken_over_at_once(storage):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    board = ClaimBoard(storage, grace_s=3600)
    try:
        ghost = f"{board.host}:{dead.pid}:deadbeef"
        with board.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tuner_claims (scope, item, owner, beat, done) "
                                 "VALUES ('s', 'a', :o, :b, false)"), {"o": ghost, "b": board._now()})
            conn.execute(sa.text("INSERT INTO tuner_claims (scope, item, owner, beat, done) "
                                 "VALUES ('s', 'b', :o, :b, false)"), {"o": f"{board.host}:{os.getppid()}:live",
                                                                      "b": board._now()})
            conn.execute(sa.text("INSERT INTO tuner_claims (scope, item, owner, beat, done) "
                                 "VALUES ('s', 'c', 'elsewhere:1:x', :b, false)"), {"b": board._now() - 7200})
        assert board.open_items("s", ["a", "b", "c"]) == ["a", "c"]
        assert board.take("s", "a"), "the dead process's claim is ours at once"
        assert not board.take("s", "b"), "a live process's claim is not"
        assert board.take("s", "c"), "another host's silent claim is ours after the grace"
    finally:
        board.close()


def test_the_default_grace_is_about_ten_seconds_and_the_wait_says_what_it_waits_for():
    from tuner.study.loop import CLAIM_GRACE_S, _waiting_note

    assert CLAIM_GRACE_S <= 10
    note = _waiting_note([("h:1:a", False, 4.0), ("h:1:a", False, 1.0), None], CLAIM_GRACE_S)
    assert note == ("waiting for 2 configs that 1 other worker measures (h:1:a, last heartbeat 4 s ago; "
                    "taken over 6 s from now if it stays silent)")


# ---------------------------------------------------------------------------
# The edges a new user meets


@pytest.mark.parametrize("trials", [1, 2, 3])
def test_the_stream_baseline_is_measured_first_at_any_budget(capsys, storage, trials):
    import optuna

    code, out, err = run(capsys, "study", "gpt3", "--backend", "replay", "--replay-file", str(SYNTHETIC),
                         "--tokens", "64", "--trials", str(trials), "--storage", storage)
    assert code == 0, err
    assert "stream baseline" in out
    chain = [s for s in optuna.get_all_study_summaries(storage) if "stage" not in s.user_attrs]
    first = min(optuna.load_study(study_name=chain[0].study_name, storage=storage).trials, key=lambda t: t.number)
    assert first.params["policy"] == "stream"


def test_every_command_that_writes_a_file_takes_o_and_out():
    parser = cli.build_parser()
    for argv in (["export", "gpt3"], ["bench", "gpt3"], ["report", "gpt3"]):
        for option in ("-o", "--out"):
            assert parser.parse_args([*argv, option, "x"]).out == Path("x")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_size_limit_is_checked_and_stated_the_same_everywhere(capsys, name):
    wl = get_workload(name)
    helptext = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["compile"].format_help().split())
    for p in wl.sizes:
        assert p.accepted in helptext, f"--help does not state {p.name}'s range"
        with pytest.raises(WorkloadError, match=re.escape(p.accepted)):
            wl.chain(**{wl.sweep_param: wl.sweep[0], p.name: p.most + p.multiple_of})
    sweep = wl.size_param(wl.sweep_param)
    for command in ("compile", "study"):
        extra = ["--backend", "replay", "--replay-file", str(SYNTHETIC)] if command == "study" else []
        code, _, err = run(capsys, command, name, flag(wl.sweep_param), str(sweep.most + 1), *extra)
        assert code == 2 and sweep.accepted in err, err


def test_the_first_line_of_the_main_job_is_short(capsys, storage):
    code, out, err = run(capsys, "study", "gpt3", "--tokens", "1", "--trials", "2", "--storage", storage)
    assert code == 0, err
    assert len(out.splitlines()[0]) <= 160, out.splitlines()[0]


# ---------------------------------------------------------------------------
# The README says only what the committed results say


def test_the_generated_results_blocks_agree_with_the_committed_results():
    from tuner.shipping import results

    assert results.stale(ROOT) == []


def test_the_readme_quotes_no_figure_outside_its_generated_table_and_links_only_what_exists():
    text = (ROOT / "README.md").read_text()
    begin, end = text.index("<!-- results:summary begin"), text.index("<!-- results:summary end -->")
    prose = text[:begin] + text[end:]
    figures = re.findall(r"\d+(?:\.\d+)?\s*(?:µs|us\b|%|x\b|×)", prose)
    assert figures == [], f"figures in the README outside the generated table: {figures}"
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert link.startswith("http") or (ROOT / link).exists(), link
