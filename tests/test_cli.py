"""The command line: help, one-line errors with exit status 2, and the commands end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import optuna
import pytest

import tuner.backends
import tuner.cli
from tuner.backends.replay import ReplayBackend
from tuner.cli import main
from tuner.paths import home
from tuner.storage.measurements import MeasurementStore

COMMANDS = ("study", "bench", "export", "show", "list", "compile")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(tuner.backends, "gpu_visible", lambda: False)


@pytest.fixture
def replay_args(synthetic_file, storage):
    return ["--backend", "replay", "--replay-file", str(synthetic_file), "--storage", storage]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0 and out.startswith(f"usage: tuner {command}")


@pytest.mark.parametrize("command", COMMANDS)
def test_only_commands_that_use_the_study_database_offer_storage(capsys, command):
    _, out, _ = run(capsys, command, "--help")
    # bench searches through the study's loop and storage, so a size tuned there costs no new trial.
    assert ("--storage" in out) == (command in ("study", "bench", "export", "show", "list"))


def test_top_level_help_and_version(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and all(c in out for c in COMMANDS)
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == "tuner 0.1.0"


def assert_one_line_error(rc, err, *needles):
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


BAD_SPACE = "[stage]\nbm = [16]\nbn = [64]\nbk = [32]\nwm = [1]\nwn = [1]\nstagez = [2]\n"


@pytest.mark.parametrize("argv, needles", [
    (["study", "gpt4"], ["unknown workload 'gpt4'", "gpt3, llama"]),
    (["study", "gpt3", "--strategy", "bayes"], ["--strategy", "staged", "tpe", "random", "grid"]),
    (["study", "gpt3", "--tokens", "0"], ["--tokens", "positive integers"]),
    (["study", "gpt3", "--tokens", "abc"], ["--tokens", "'abc'"]),
    (["study", "gpt3", "--trials", "-3"], ["--trials", "positive integer"]),
    (["study", "gpt3", "--tokens", "3"], ["recordings hold no size", "tokens=64"]),
    (["study", "gpt3", "--tokens", "1", "--hidden", "7"], ["--hidden 7", "multiple of 8", "nearest: 8"]),
    (["study", "llama", "--tokens", "1", "--ffn", "3588"], ["--ffn 3588", "multiple of 8", "3584 or 3592"]),
    (["study", "gpt3", "--replay-file", "/nonexistent/rec.json"], ["cannot read recording", "/nonexistent/rec.json"]),
    (["study", "gpt3", "--graphs"], ["--graphs", "on a GPU", "without --graphs"]),
    (["bench", "gpt3", "--sustained", "0"], ["--sustained", "positive number of seconds"]),
    (["frobnicate"], ["invalid choice", "study"]),
    (["export", "gpt4"], ["unknown workload"]),
])
def test_user_errors_are_one_line_and_exit_2(capsys, no_gpu, storage, synthetic_file, argv, needles):
    if argv[0] == "study":
        argv = [*argv, "--backend", "replay", "--storage", storage]
        if "--replay-file" not in argv:
            argv += ["--replay-file", str(synthetic_file)]
    rc, _, err = run(capsys, *argv)
    assert_one_line_error(rc, err, *needles)


@pytest.mark.parametrize("url, needle", [
    ("nosuchdb://x", "storage"),
    ("sqlite:////nonexistent/dir/t.db", "cannot use storage"),
])
def test_unusable_storage_is_a_user_error(capsys, no_gpu, synthetic_file, url, needle):
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "64", "--backend", "replay", "--replay-file",
                     str(synthetic_file), "--storage", url)
    assert_one_line_error(rc, err, needle, "accepted")


def test_read_only_storage_is_a_user_error(capsys, tmp_path, synthetic_file):
    db = tmp_path / "ro.db"
    MeasurementStore(f"sqlite:///{db}").close()
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "64", "--backend", "replay", "--replay-file",
                     str(synthetic_file), "--storage", f"sqlite:///file:{db}?mode=ro&uri=true")
    assert_one_line_error(rc, err, "readonly")


def test_bad_space_file_names_the_key(capsys, tmp_path, replay_args):
    space = tmp_path / "space.toml"
    space.write_text(BAD_SPACE)
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "64", "--space", str(space), *replay_args)
    assert_one_line_error(rc, err, str(space), "stage.stagez", "'stages'")


def test_bad_study_file_names_the_key(capsys, tmp_path, replay_args):
    f = tmp_path / "mine.toml"
    f.write_text('workload = "gpt3"\nstratgy = "tpe"\n')
    rc, _, err = run(capsys, "study", "gpt3", "--study-file", str(f), *replay_args)
    assert_one_line_error(rc, err, str(f), "'strategy'")


def test_study_file_of_another_workload_is_refused(capsys, tmp_path, replay_args):
    f = tmp_path / "mine.toml"
    f.write_text('workload = "llama"\n')
    rc, _, err = run(capsys, "study", "gpt3", "--study-file", str(f), *replay_args)
    assert_one_line_error(rc, err, "tunes llama, not gpt3")


def test_empty_feasible_set_says_why(capsys, tmp_path, replay_args):
    space = tmp_path / "tall.toml"
    space.write_text(BAD_SPACE.replace("stagez", "stages").replace("bm = [16]", "bm = [128]").replace("wm = [1]",
                                                                                                     "wm = [2]"))
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "1", "--space", str(space), *replay_args)
    assert_one_line_error(rc, err, "no feasible config", "tile_height")


def test_a_missing_warm_start_file_is_refused(capsys, tmp_path, replay_args):
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "64", "--warm-start", str(tmp_path / "no.json"), *replay_args)
    assert_one_line_error(rc, err, "no.json", "no such file", "bench summary")


def test_gpu_backend_without_gpu(capsys, no_gpu, storage):
    rc, _, err = run(capsys, "study", "gpt3", "--tokens", "64", "--backend", "gpu", "--storage", storage)
    assert_one_line_error(rc, err, "no CUDA device", "--backend replay")


def test_bench_without_gpu(capsys, no_gpu):
    rc, _, err = run(capsys, "bench", "gpt3")
    assert_one_line_error(rc, err, "no CUDA device")


def test_compile_without_toolchain(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    rc, _, err = run(capsys, "compile", "gpt3")
    assert_one_line_error(rc, err, "NVRTC", ".[compile]")


@pytest.mark.parametrize("command", ["export", "show"])
def test_reading_commands_need_existing_storage(capsys, tmp_path, command):
    rc, _, err = run(capsys, command, "gpt3", "--storage", f"sqlite:///{tmp_path / 'none.db'}")
    assert_one_line_error(rc, err, "does not exist")
    assert not (tmp_path / "none.db").exists()


def test_debug_shows_the_traceback(capsys):
    rc, _, err = run(capsys, "study", "gpt4", "--debug")
    assert rc == 2 and "Traceback" in err and err.strip().endswith("accepted: gpt3, llama, resnet38, vgg19, gpt3-attn, llama-attn, gpt3-layer, llama-layer")


@pytest.mark.parametrize("command", ["bench", "compile"])
def test_bench_and_compile_hand_their_arguments_over(capsys, monkeypatch, command):
    seen = {}
    module = f"tuner.{tuner.cli._DELEGATED[command]}"
    fake = types.ModuleType(module)
    fake.main = lambda args: seen.setdefault("args", args) and 0
    monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(tuner.backends, "gpu_visible", lambda: True)
    rc, _, _ = run(capsys, command, "gpt3", "--tokens", "1,64")
    assert rc == 0 and seen["args"].workload == "gpt3" and seen["args"].tokens == (1, 64)


def test_study_show_export_list_end_to_end(capsys, tmp_path, monkeypatch, replay_args, storage):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "study", "gpt3", "--tokens", "1,64,2", "--trials", "3", "--strategy", "random",
                       *replay_args)
    assert rc == 0, err
    assert "gpt3/tokens=2,hidden=12288,ffn=6144: skipped" in out
    assert "synthetic figures, not measurements" in out
    summaries = [l for l in out.splitlines() if l.startswith("gpt3/tokens=") and " on " in l]
    assert len(summaries) == 2 and all("(replayed, synthetic)" in l for l in summaries)
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == ["gpt3/tokens=1,hidden=12288,ffn=6144/Synthetic H200 model (not a device)",
                     "gpt3/tokens=64,hidden=12288,ffn=6144/Synthetic H200 model (not a device)"]

    rc, out, _ = run(capsys, "show", "gpt3", "--storage", storage)
    assert rc == 0 and "tokens=1,hidden=12288,ffn=6144" in out and "replayed, synthetic" in out
    rc, out, _ = run(capsys, "show", "gpt3", "--storage", storage, "--format", "json")
    assert rc == 0 and [r["trials"] for r in json.loads(out)] == [3, 3]

    rc, out, _ = run(capsys, "export", "gpt3", "--storage", storage)
    assert rc == 0 and out.strip() == "wrote tuned/gpt3.json"
    assert json.loads((tmp_path / "tuned" / "gpt3.json").read_text())["schema_version"] == 1

    rc, out, _ = run(capsys, "list", "--storage", storage)
    assert rc == 0 and "gpt3: GPT-3" in out
    # The same count as show (measured trials), sizes in numeric order.
    listed = [l.strip() for l in out.splitlines() if l.strip().startswith("gpt3/tokens=")]
    assert [l.split(":")[0] for l in listed] == names and all("3 trials measured" in l for l in listed)


def test_size_order_is_numeric_and_long_lists_are_cut_with_a_count():
    from tuner import shortlist
    from tuner.cli import _size_key

    labels = [f"gpt3/tokens={t},hidden=12288,ffn=6144" for t in (256, 1, 2048, 128)]
    assert [lb.split(",")[0] for lb in sorted(labels, key=_size_key)] == [
        "gpt3/tokens=1", "gpt3/tokens=128", "gpt3/tokens=256", "gpt3/tokens=2048"]
    assert shortlist(range(3)) == "0, 1, 2" and shortlist(range(20), most=4) == "0, 1, 2, 3 and 16 more"


def test_auto_backend_without_gpu_replays_and_says_so(capsys, no_gpu, monkeypatch, storage):
    monkeypatch.setattr(tuner.backends, "default_recordings", lambda: [])
    rc, out, err = run(capsys, "study", "gpt3", "--tokens", "64", "--trials", "2", "--strategy", "random",
                       "--storage", storage)
    assert rc == 0, err
    first = out.splitlines()[0]
    assert first.startswith("no CUDA device visible: replaying recorded measurements from ")
    assert "synthetic_measurements.json" in first


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(capsys, monkeypatch, replay_args):
    calls = []

    def interrupt(self, chain, cfg):
        calls.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(ReplayBackend, "measure", interrupt)
    argv = ["study", "gpt3", "--tokens", "64", "--trials", "3", *replay_args]
    rc, _, err = run(capsys, *argv)
    assert rc == 130 and calls
    assert "resume with: python -m tuner study gpt3 --tokens 64 --trials 3" in err
    assert "Traceback" not in err


def test_module_entry_point_runs_as_a_program(tmp_path, synthetic_file):
    env = {**os.environ, "PYTHONPATH": str(home())}
    url = f"sqlite:///{tmp_path / 't.db'}"
    ok = subprocess.run([sys.executable, "-m", "tuner", "study", "gpt3", "--tokens", "64", "--trials", "2",
                         "--strategy", "random", "--backend", "replay", "--replay-file", str(synthetic_file),
                         "--storage", url], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "tuner", "study", "gpt3", "--tokens", "0"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("tuner: error:")
