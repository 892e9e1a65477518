"""The measurement cache beside Optuna's tables, and opening storage URLs."""
from __future__ import annotations

import optuna
import pytest

from tuner.backends.base import DeviceInfo, Measurement
from tuner.config import Config, StageTiles
from tuner.storage.database import StorageError, check_exists, open_optuna_storage, sqlite_path
from tuner.storage.measurements import MeasurementStore

DEV = DeviceInfo("cache GPU", toolkit="13.0")
CFG = Config((StageTiles(64, 128, 64, 2, 2, 3), StageTiles(64, 128, 64, 2, 2, 3)), "tile", "row", "ticket", "fused")
LABEL = "gpt3/tokens=64,hidden=12288,ffn=6144"


def test_saved_measurement_is_found_again(storage):
    store = MeasurementStore(storage)
    m = Measurement(ok=True, median_us=12.5, times_us=[12.0, 12.5, 13.0], error=1e-3, source_hash="abc")
    store.save(DEV, LABEL, CFG, m)
    assert store.lookup(DEV, LABEL, CFG, replayed=False) == m
    assert store.lookup(DEV, LABEL, CFG, replayed=False, source_hash="abc") == m


def test_key_parts_each_separate_entries(storage):
    store = MeasurementStore(storage)
    store.save(DEV, LABEL, CFG, Measurement(ok=True, median_us=1.0, source_hash="abc"))
    other_cfg = Config(CFG.tiles, "row", "row", "ticket", "fused")
    assert store.lookup(DeviceInfo("other GPU", toolkit="13.0"), LABEL, CFG, replayed=False) is None
    assert store.lookup(DeviceInfo("cache GPU", toolkit="12.8"), LABEL, CFG, replayed=False) is None
    assert store.lookup(DEV, "gpt3/tokens=1,hidden=12288,ffn=6144", CFG, replayed=False) is None
    assert store.lookup(DEV, LABEL, other_cfg, replayed=False) is None
    assert store.lookup(DEV, LABEL, CFG, replayed=False, source_hash="changed template") is None


def test_records_give_the_newest_measured_outcome_per_label_and_config_for_a_recording(storage, tmp_path):
    from tuner.backends.replay import read_recording, write_recording

    store = MeasurementStore(storage)
    store.save(DEV, LABEL, CFG, Measurement(ok=True, median_us=2.0, source_hash="old"))
    store.save(DEV, LABEL, CFG, Measurement(ok=True, median_us=1.5, source_hash="new"))
    store.save(DEV, "gpt3.gemm1/tokens=64", CFG, Measurement(ok=False, reason="compile", message="x"))
    store.save(DEV, "other", CFG, Measurement(ok=True, median_us=9.0))
    store.save(DEV, LABEL, Config(CFG.tiles, "row", "row", "ticket", "fused"),
               Measurement(ok=True, median_us=1.0, replayed=True))  # a replayed row is no measurement
    recs = store.records(DEV, [LABEL, "gpt3.gemm1/tokens=64"])
    assert sorted((r["label"], r["measurement"].get("median_us")) for r in recs) == [
        ("gpt3.gemm1/tokens=64", None), (LABEL, 1.5)]
    write_recording(tmp_path / "r.json", DEV, recs, "test")
    assert len(read_recording(tmp_path / "r.json").records) == 2


def test_replayed_rows_are_never_served_to_a_measuring_backend(storage):
    store = MeasurementStore(storage)
    store.save(DEV, LABEL, CFG, Measurement(ok=True, median_us=1.0, replayed=True))
    assert store.lookup(DEV, LABEL, CFG, replayed=False) is None
    assert store.lookup(DEV, LABEL, CFG, replayed=True).replayed


def test_failures_are_cached_too(storage):
    store = MeasurementStore(storage)
    store.save(DEV, LABEL, CFG, Measurement.failed("compile", "ptxas error"))
    got = store.lookup(DEV, LABEL, CFG, replayed=False)
    assert not got.ok and got.reason == "compile"


def test_optuna_still_reads_a_database_holding_the_cache(storage):
    MeasurementStore(storage).save(DEV, LABEL, CFG, Measurement(ok=True, median_us=1.0))
    optuna.create_study(study_name="beside the cache", storage=storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    assert names == ["beside the cache"]


def test_unusable_urls_are_storage_errors(tmp_path):
    with pytest.raises(StorageError, match="not valid"):
        MeasurementStore("not a url")
    with pytest.raises(StorageError, match="cannot use storage"):
        MeasurementStore(f"sqlite:///{tmp_path}/no/such/dir/t.db")
    with pytest.raises(StorageError, match="driver"):
        MeasurementStore("postgresql+nosuchdriver://localhost/db")


def test_read_only_database_is_refused_before_any_work(tmp_path):
    db = tmp_path / "ro.db"
    MeasurementStore(f"sqlite:///{db}").close()
    with pytest.raises(StorageError, match="readonly|read-only|read only"):
        MeasurementStore(f"sqlite:///file:{db}?mode=ro&uri=true")


def test_missing_sqlite_file_is_reported_not_created(tmp_path):
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    with pytest.raises(StorageError, match="does not exist"):
        check_exists(url)
    assert not (tmp_path / "absent.db").exists()
    assert sqlite_path("sqlite://") is None and sqlite_path("postgresql://h/db") is None


def test_optuna_storage_errors_are_one_line(tmp_path):
    with pytest.raises(StorageError) as err:
        open_optuna_storage(f"sqlite:///{tmp_path}/no/such/dir/t.db")
    assert "\n" not in str(err.value)
