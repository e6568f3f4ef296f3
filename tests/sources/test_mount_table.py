"""The mount table behind ``watch_mode``: parsed once, parsed again only when the kernel changed it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from airflow_provider_systemzero.sources import file_watch
from airflow_provider_systemzero.sources.file_watch import MountTable, MountTableWatch

#: Two mounts on /data (the later is on top), one on a longer path, one with a space in its name.
TABLE = textwrap.dedent(
    """\
    22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
    30 22 0:40 / /data rw - xfs /dev/sdb1 rw
    31 30 0:41 / /data rw - tmpfs tmpfs rw
    32 22 0:42 / /data2 rw - ext4 /dev/sdc1 rw
    33 22 0:43 / /my\\040share rw - cifs //server/share rw
    """
)
NFS_LINE = "40 31 0:50 / /data/remote rw - nfs4 server:/export rw\n"


def reference_filesystem_type(directory: str, text: str) -> str | None:
    """The lookup as it was before the cache: the last longest mount point holding the directory."""
    target = os.path.realpath(directory)
    best, kind = "", None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


class DrivenWatch:
    """A mount table watch whose table and change reports the test sets."""

    def __init__(self, path: str) -> None:
        self.text = TABLE
        self.pending = False
        self.closed = False

    def changed(self) -> bool:
        pending, self.pending = self.pending, False
        return pending

    def read(self) -> str:
        return self.text

    def close(self) -> None:
        self.closed = True


def driven_table() -> tuple[MountTable, list[DrivenWatch]]:
    watches: list[DrivenWatch] = []

    def make(path: str) -> DrivenWatch:
        watches.append(DrivenWatch(path))
        return watches[-1]

    return MountTable(watch=make), watches  # type: ignore[arg-type]


DIRECTORIES = [
    "/",
    "/data",
    "/data/x",
    "/data2",
    "/data2/y",
    "/datax",
    "/my share",
    "/my share/z",
    "/data/remote/a",
]


def test_the_table_is_parsed_once_for_many_lookups_and_answers_as_before() -> None:
    table, watches = driven_table()
    for _ in range(50):
        for directory in DIRECTORIES:
            assert table.filesystem_type(directory) == reference_filesystem_type(directory, TABLE), directory
    assert table.filesystem_type("/data") == "tmpfs"  # the mount on top
    assert table.filesystem_type("/my share/z") == "cifs"
    assert len(watches) == 1
    assert table.parses == 1


def test_a_change_reported_by_the_kernel_makes_it_read_the_table_again() -> None:
    table, watches = driven_table()
    assert table.filesystem_type("/data/remote/a") == "tmpfs"
    watch = watches[0]
    watch.text = TABLE + NFS_LINE
    assert table.filesystem_type("/data/remote/a") == "tmpfs"  # not reported yet: the cache holds
    watch.pending = True
    assert table.filesystem_type("/data/remote/a") == "nfs4"
    assert table.parses == 2
    for directory in DIRECTORIES:
        assert table.filesystem_type(directory) == reference_filesystem_type(directory, watch.text), directory
    assert table.parses == 2


def test_a_forked_child_opens_its_own_descriptor_and_reads_the_table_again() -> None:
    table, watches = driven_table()
    assert table.filesystem_type("/data") == "tmpfs"
    table.after_fork()
    assert watches[0].closed
    assert table.filesystem_type("/data") == "tmpfs"
    assert len(watches) == 2
    assert table.parses == 2


def test_without_a_descriptor_the_table_is_read_on_every_lookup(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(TABLE)

    def unavailable(path: str) -> MountTableWatch:
        raise OSError("no poll here")

    table = MountTable(str(mountinfo), watch=unavailable)
    for directory in DIRECTORIES:
        assert table.filesystem_type(directory) == reference_filesystem_type(directory, TABLE), directory
    mountinfo.write_text(TABLE + NFS_LINE)
    assert table.filesystem_type("/data/remote/a") == "nfs4"
    assert table.parses == len(DIRECTORIES) + 1


def test_the_real_descriptor_reports_no_change_and_the_table_is_read_once(tmp_path: Path) -> None:
    table = MountTable()
    real = Path(file_watch.MOUNTINFO).read_text()
    directories = ["/", "/proc", "/proc/self", "/dev", "/sys", str(tmp_path), os.getcwd(), sys.prefix]
    for _ in range(20):
        for directory in directories:
            assert table.filesystem_type(directory) == reference_filesystem_type(directory, real), directory
    assert table.filesystem_type("/proc") == "proc"
    assert table.parses == 1


def test_lookups_from_many_threads_share_one_parse() -> None:
    table = MountTable()
    answers: list[str | None] = []

    def look() -> None:
        for _ in range(200):
            answers.append(table.filesystem_type("/proc"))

    threads = [threading.Thread(target=look) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == ["proc"] * 1600
    assert table.parses == 1


MOUNTING = """
import os, subprocess, sys
from airflow_provider_systemzero.sources.file_watch import MountTable
point = sys.argv[1]
table = MountTable()
before = table.filesystem_type(point)
again = table.filesystem_type(point)
parses_before = table.parses
subprocess.run(["mount", "-t", "ramfs", "probe", point], check=True)
after = table.filesystem_type(point)
print(before, again, parses_before, after, table.parses)
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or not sys.platform.startswith("linux"), reason="no unshare"
)
def test_a_real_mount_is_seen_without_reading_the_table_per_lookup(tmp_path: Path) -> None:
    point = tmp_path / "point"
    point.mkdir()
    # a private mount namespace: the mount is gone with the process
    command = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", MOUNTING, str(point)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0 and ("unshare" in result.stderr or "mount" in result.stderr):
        pytest.skip(f"cannot mount here: {result.stderr.strip()[-200:]}")
    assert result.returncode == 0, result.stderr
    before, again, parses_before, after, parses = result.stdout.split()
    assert before == again != "ramfs"
    assert parses_before == "1"
    assert after == "ramfs"
    assert parses == "2"
