"""Another local account on the same host cannot read, plant, redirect or swap what sparktrain
keeps there: kept results, the private folder, the data cache, rank logs, the examples' log4j
file. Each test acts as the other account (a real one, through runuser) in a stand-in for
``/tmp`` and asserts what the victim (this process) sees."""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sparktrain
from sparktrain import private_dir
from sparktrain.data import integrity
from sparktrain.data.converter import _load_manifest, default_cache_dir
from sparktrain.data.dataset import MANIFEST_NAME, SparkDatasetConverter, filesystem
from sparktrain.errors import ConfigurationError, PayloadError
from sparktrain.examples import _common
from sparktrain.shipping.kept import LIFETIME
from sparktrain.shipping.payload import keep_and_say, keep_result
from sparktrain.task.logs import RankFiles
from tests.accounts import Account, account, need_python


def _mine() -> str:
    return f"sparktrain-{os.getuid()}"


class _Hostile:
    """Unpickling it creates a file: the stand-in for an attacker's code running."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (str(self.marker), "w"))


def _plant_pickle(other: Account, tmp: Path, target: Path, marker: Path) -> None:
    """The other account writes a pickle that would run its code into ``target``."""
    source = tmp / f"hostile-{os.getpid()}.pkl"
    source.write_bytes(pickle.dumps(_Hostile(marker)))
    source.chmod(0o644)
    other.run("cp", str(source), str(target))
    source.unlink()


# -- 1. kept results ------------------------------------------------------------------------


def test_a_private_folder_another_account_made_first_is_not_used_and_the_result_is_kept(
    tmp: Path, other: Account
) -> None:
    precious = tmp / "precious"
    precious.write_text("the victim's file")
    precious.chmod(0o600)
    # The other account takes the victim's folder name, with the kept result's name in it
    # pointing at a file of the victim's.
    hijacked = tmp / _mine()
    other.run("mkdir", "-m", "0777", str(hijacked), str(hijacked / "results"))
    other.run("ln", "-s", str(precious), str(hijacked / "results" / "r1-attempt1-rank0.pkl"))
    before = sorted(p.name for p in (hijacked / "results").iterdir())

    message = keep_and_say(pickle.dumps({"weights": [1, 2]}), "r1-attempt1-rank0")

    assert f"the private folder could not be used: {hijacked} is not yours" in message
    assert f"owner {other.name} (uid {other.uid})" in message and "0o777" in message
    assert "set TMPDIR" in message
    kept = Path(message.split("it is kept in ")[1].split(" (")[0])
    fallback = kept.parent.parent
    assert kept.parent.name == "results" and fallback.parent == tmp
    assert fallback.name.startswith(f"{_mine()}{private_dir.FALLBACK_INFIX}")
    assert sparktrain.load_kept(kept) == {"weights": [1, 2]}
    assert precious.read_text() == "the victim's file"
    assert sorted(p.name for p in (hijacked / "results").iterdir()) == before


def test_planted_temp_files_and_links_in_the_shared_folder_are_never_touched(
    tmp: Path, other: Account
) -> None:
    # What the attacker planted for the old predictable names: a 0777 results folder, the
    # temporary file's name as a link to a victim's file, the result's name as its pickle.
    precious = tmp / "precious"
    precious.write_text("the victim's file")
    old = tmp / "sparktrain-results"
    other.run("mkdir", "-m", "0777", str(old))
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        other.run("ln", "-s", str(precious), str(old / f".r2-attempt1-rank0.{pid}.tmp"))
    marker = tmp / "attacker-code-ran"
    _plant_pickle(other, tmp, old / "r2-attempt1-rank0.pkl", marker)

    message = keep_and_say(pickle.dumps([3, 4]), "r2-attempt1-rank0")

    kept = tmp / _mine() / "results" / "r2-attempt1-rank0.pkl"
    assert message == f"it is kept in {kept} (sparktrain.load_kept(path) reads it back; {LIFETIME})"
    assert stat.S_IMODE(os.lstat(kept.parent.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(kept).st_mode) == 0o600
    assert sparktrain.load_kept(kept) == [3, 4]
    assert precious.read_text() == "the victim's file" and not marker.exists()
    assert os.listdir(kept.parent) == [kept.name]  # no temporary file left


def test_load_kept_refuses_what_another_account_could_have_written(
    tmp: Path, other: Account
) -> None:
    marker = tmp / "attacker-code-ran"
    # A file the other account wrote in the shared folder.
    _plant_pickle(other, tmp, tmp / "evil.pkl", marker)
    with pytest.raises(PayloadError, match=r"its folder .* can be written by .* or others"):
        sparktrain.load_kept(tmp / "evil.pkl")
    # ... in a folder of its own that no one else can write.
    theirs = tmp / "theirs"
    other.run("mkdir", "-m", "0755", str(theirs))
    _plant_pickle(other, tmp, theirs / "evil.pkl", marker)
    with pytest.raises(PayloadError, match=f"can be written by {other.name}"):
        sparktrain.load_kept(theirs / "evil.pkl")
    # ... copied into the victim's own results folder, keeping its owner.
    results = private_dir.folder("results")
    (results / "evil.pkl").write_bytes((theirs / "evil.pkl").read_bytes())
    os.chown(results / "evil.pkl", other.uid, -1)
    with pytest.raises(PayloadError, match=f"it is owned by {other.name} \\(uid {other.uid}\\)"):
        sparktrain.load_kept(results / "evil.pkl")
    # ... or reached through a link in it.
    (results / "link.pkl").symlink_to(theirs / "evil.pkl")
    with pytest.raises(PayloadError, match="it is a symbolic link"):
        sparktrain.load_kept(results / "link.pkl")
    assert not marker.exists()
    # The victim's own kept result loads.
    assert sparktrain.load_kept(keep_result(pickle.dumps("mine"), "own")) == "mine"


def test_two_accounts_each_keep_a_result_on_one_host(tmp: Path) -> None:
    keep = (
        "import pickle, sparktrain\n"
        "from sparktrain.shipping.payload import keep_and_say\n"
        "m = keep_and_say(pickle.dumps({'who': __import__('os').getuid()}), 'run1-attempt1-rank0')\n"
        "path = m.split('it is kept in ')[1].split(' (')[0]\n"
        "print(path, sparktrain.load_kept(path)['who'])\n"
    )
    with account() as first, account() as second:
        need_python(first)
        seen = [a.python(keep, env={"TMPDIR": str(tmp)}).stdout.split() for a in (first, second)]
    # The same result name on the same host: each is kept, in each account's own folder.
    assert seen == [
        [str(tmp / f"sparktrain-{a.uid}" / "results" / "run1-attempt1-rank0.pkl"), str(a.uid)]
        for a in (first, second)
    ]
    for account_, (path, _) in zip((first, second), seen, strict=True):
        folder = os.lstat(Path(path).parents[1])
        assert folder.st_uid == account_.uid and stat.S_IMODE(folder.st_mode) == 0o700


# -- 5. the data cache ----------------------------------------------------------------------


def test_the_default_data_cache_is_in_the_private_folder(tmp: Path) -> None:
    url = default_cache_dir()
    assert url == f"file://{tmp / _mine() / 'cache'}"
    assert stat.S_IMODE(os.lstat(tmp / _mine() / "cache").st_mode) == 0o700


def _write_cache(root: Path, labels: list[int]) -> tuple[SparkDatasetConverter, dict[str, Any]]:
    root.mkdir()
    table = pa.table({"x": [float(i) for i in range(len(labels))], "label": labels})
    pq.write_table(table, root / "part-00000.parquet")
    converter = SparkDatasetConverter.from_parquet(f"file://{root}", files=["part-00000.parquet"])
    fs, path = filesystem(converter.url)
    manifest = {
        **converter.to_manifest(),
        integrity.KEY: integrity.record(fs, path, ["part-00000.parquet"]),
    }
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    return converter, manifest


def test_a_cache_file_swapped_by_another_account_is_refused_naming_it(
    tmp: Path, other: Account
) -> None:
    # The other account makes the shared cache folder first; the victim writes its cache in it.
    shared = tmp / "cache"
    other.run("mkdir", "-m", "0777", str(shared))
    key = shared / "df-0123"
    converter, _ = _write_cache(key, [0, 1, 0, 1])
    fs, path = filesystem(converter.url)
    assert _load_manifest(fs, path, converter.url, None) is not None  # reused while intact
    # It moves the victim's folder away (its own folder) and puts one with the same manifest
    # and flipped labels in its place.
    flipped = tmp / "flipped"
    _write_cache(flipped, [1, 0, 1, 0])
    flipped.chmod(0o755)
    other.run("mv", str(key), str(shared / "old"))
    other.run("mkdir", str(key))
    other.run("cp", str(shared / "old" / MANIFEST_NAME), str(key / MANIFEST_NAME))
    other.run("cp", str(flipped / "part-00000.parquet"), str(key / "part-00000.parquet"))
    assert (key / "part-00000.parquet").stat().st_size == (
        shared / "old" / "part-00000.parquet"
    ).stat().st_size  # the same size: only the hash tells

    with pytest.raises(ConfigurationError) as info:
        _load_manifest(fs, path, converter.url, None)
    message = str(info.value)
    assert f"the data cache {converter.url} was changed after it was written" in message
    assert "part-00000.parquet: its SHA-256 differs" in message
    assert f"Delete {converter.url}" in message


def test_the_tasks_writer_records_what_it_wrote(tmp: Path) -> None:
    from sparktrain.data.task_writer import _partition_writer

    out = tmp / "cache"
    out.mkdir()
    write = _partition_writer(f"file://{out}", {}, 1 << 10)
    batches = [pa.record_batch({"x": list(range(i, i + 500))}) for i in (0, 500)]
    (row,) = list(write(iter(batches)))
    name, size, sha = row["file"][0].as_py(), row["size"][0].as_py(), row["sha256"][0].as_py()
    fs, root = filesystem(f"file://{out}")
    assert [size, sha] == integrity.record(fs, root, [name])[name]
    assert pq.read_table(out / name).num_rows == 1000


# -- 6. rank logs and the examples' log4j file ----------------------------------------------


def test_a_rank_log_link_planted_in_a_shared_log_dir_is_not_followed(
    tmp: Path, other: Account
) -> None:
    precious = tmp / "precious"
    precious.write_text("the victim's file")
    folder = tmp / "logs" / "run1" / "attempt-0"
    other.run("mkdir", "-m", "0777", "-p", str(folder))
    other.run("ln", "-s", str(precious), str(folder / "rank-0.log"))

    files = RankFiles(folder)
    files.write(0, "not for the victim's file")  # refused, with a warning: nothing written
    files.write(1, "line")
    files.close()
    assert precious.read_text() == "the victim's file"
    assert (folder / "rank-1.log").read_text() == "line\n"
    assert stat.S_IMODE(os.lstat(folder / "rank-1.log").st_mode) == 0o600


def test_the_examples_log4j_file_is_the_users_own(tmp: Path, other: Account) -> None:
    # The other account's configuration under the old name is not used.
    hostile = tmp / f"sparktrain-log4j2-{os.getuid()}.properties"
    other.run("sh", "-c", f"echo 'rootLogger.level = trace' > {hostile}")
    path = _common._log4j2_file()
    assert path == str(tmp / _mine() / "log4j2.properties")
    assert Path(path).read_text() == _common._LOG4J2
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_the_examples_log4j_file_is_not_read_from_a_folder_another_account_made(
    tmp: Path, other: Account
) -> None:
    other.run("mkdir", "-m", "0777", str(tmp / _mine()))
    other.run("sh", "-c", f"echo 'rootLogger.level = trace' > {tmp / _mine()}/log4j2.properties")
    assert _common._log4j2_file() is None  # the JVM logs as it would without one


def test_an_unusable_private_folder_says_whose_it_is_and_the_way_out(
    tmp: Path, other: Account
) -> None:
    other.run("ln", "-s", str(tmp), str(tmp / _mine()))
    with pytest.raises(private_dir.NotPrivateError) as info:
        private_dir.root()
    message = str(info.value)
    assert f"{tmp / _mine()} is a symbolic link (owner {other.name} (uid {other.uid})" in message
    assert "set TMPDIR" in message
