"""File sources: notifications instead of polls, one watcher per process, every rotation style.

The source API (``build_source(...)``: ``read()``, ``changed()``) and the decision trigger against
the emulator. Sources that must not poll get ``poll_interval`` = one hour: a change that arrives
at all arrived by notification.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.sources import FINGERPRINT_BYTES, build_source, file_watch
from airflow_provider_systemzero.sources.file import INLINE_READ_BYTES, FileSource
from tests.helpers import TRIGGER_CONN_ID, first_event, rebuilt, sensor_trigger, until, wait_until
from tests.helpers.sources import (
    HOUR,
    inotify_descriptors,
    poll_timers,
    scheduled_callbacks,
    spec,
    states,
    tailing,
    value_where,
)

# ------------------------------------------------------------------ notifications


def subscriptions() -> int:
    watcher = file_watch.current_watcher()
    return 0 if watcher is None else watcher.stats()["subscriptions"]


def other_threads() -> set[str]:
    """Threads of this process other than the event loop's default executor's (and the short-lived
    thread closing a previous test's watcher descriptor)."""
    return {
        t.name
        for t in threading.enumerate()
        if not t.name.startswith("asyncio_") and t.name != file_watch.CLOSING_THREAD
    }


async def test_a_write_reaches_the_trigger_without_waiting_for_a_poll(
    emulator: Emulator, tmp_path: Path
) -> None:
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    trigger = rebuilt(sensor_trigger(source=spec(log)))
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= 1, timeout=10)
    assert not task.done()
    with log.open("a") as handle:
        handle.write("Job is ready.\n")
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True


@pytest.mark.parametrize("watch", ["notify", "poll"])
async def test_a_read_whose_reader_was_cancelled_meanwhile_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    """A trigger's read of its source is cancelled when the trigger stops it (a stream given up,
    the trigger's end), maybe while the read runs in a thread (polled, or more than the loop reads
    inline): that read still ends, and the next ``read()``, started while it runs, must wait for it
    and return what it read — not the text from before it, nor start after it with text that
    lacks it. On notifications, a wait meanwhile ends at once: the next read is due now."""
    content = "progress\n" * (INLINE_READ_BYTES // 9 + 1) + "Job is ready.\n"
    log = tmp_path / "job.log"
    log.write_text(content)
    source = build_source(spec(log, notifications=watch), "")
    started, release = threading.Event(), threading.Event()
    pread = os.pread

    def held_pread(fd: int, length: int, offset: int) -> bytes:
        if threading.current_thread() is not threading.main_thread():  # the read in a thread
            started.set()
            release.wait(10)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", held_pread)
    first = asyncio.ensure_future(source.read())
    try:
        assert await asyncio.to_thread(started.wait, 10)
        first.cancel()  # the trigger stopped its read
        await asyncio.gather(first, return_exceptions=True)
        assert first.cancelled()
        if watch == "notify":
            assert source.changed().done()  # a read is still under way: read at once
        following = asyncio.ensure_future(source.read())
        await asyncio.wait({following}, timeout=0.05)
        assert not following.done()  # it waits for the read in progress
        release.set()
        assert await asyncio.wait_for(following, 10) == content
        assert await source.read() == content  # read once: nothing doubled, nothing lost
    finally:
        release.set()
        await source.aclose()


async def test_a_wait_given_up_keeps_the_watch_and_the_next_wait_hears_a_write(tmp_path: Path) -> None:
    """A source has one reader (the trigger's driver), which stops waiting on ``changed()`` when it
    stops (a stream given up, a new wait): the watch stays until ``aclose()``, and the next wait
    hears a write by notification (polling is an hour here). A new wait ends the last one."""
    log = tmp_path / "job.log"
    log.write_text("one\n")
    source = build_source(spec(log), "")
    try:
        assert await source.read() == "one\n"
        watcher = file_watch.current_watcher()
        assert watcher is not None and source.mode == "notify" and source.subscribed
        given_up = source.changed()
        given_up.cancel()
        older, waiting = source.changed(), source.changed()
        assert older.cancelled() and not waiting.done()  # one reader: the newer wait is the one
        assert source.subscribed and watcher.stats()["subscriptions"] == 1
        with log.open("a") as handle:
            handle.write("two\n")
        await asyncio.wait_for(waiting, 10)
        assert await source.read() == "one\ntwo\n"
        waiting = source.changed()
        with log.open("a") as handle:
            handle.write("three\n")
        await asyncio.wait_for(waiting, 10)
        assert await source.read() == "one\ntwo\nthree\n"
    finally:
        await source.aclose()
    assert not source.subscribed and watcher.stats()["subscriptions"] == 0


async def test_a_directory_that_appears_later_is_watched_once_it_exists(tmp_path: Path) -> None:
    log = tmp_path / "not-yet" / "job.log"
    # decide_empty: the missing file's empty text is yielded (see test_empty_file.py for the default)
    async with tailing(spec(log, poll_interval=0.02, decide_empty=True)) as (source, successive):
        assert await anext(successive) == ""
        log.parent.mkdir()
        log.write_text("one\n")
        assert await value_where(successive, lambda v: v == "one\n") == "one\n"
        assert source.mode == "notify" and source.subscribed  # watching now, no longer polling


async def test_n_triggers_on_n_files_hold_one_watcher(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_watch, "IDLE_SECONDS", 0.0)  # idle watches go at once
    n = 12
    logs = []
    for index in range(n):
        directory = tmp_path / f"job-{index}"
        directory.mkdir()
        logs.append(directory / "job.log")
        logs[-1].write_text("starting\n")
    # Airflow looks a connection up in a thread pool of its own, started by the first lookup of
    # the process: looked up once here, that pool is in the baseline (the test asks for no thread
    # of the provider's, and does not depend on an earlier test having looked one up)
    await SystemZeroHook(systemzero_conn_id=TRIGGER_CONN_ID).aget_settings()
    file_watch.close_ended()  # earlier tests' loops' watchers, not collected yet, are not counted
    await asyncio.to_thread(
        wait_until, lambda: all(t.name != file_watch.CLOSING_THREAD for t in threading.enumerate())
    )
    descriptors, threads = inotify_descriptors(), other_threads()
    triggers = [
        rebuilt(
            sensor_trigger(
                source=spec(log), key_namespace=task_namespace("d", f"t{i}", "r", -1), lease_after=0.05
            )
        )
        for i, log in enumerate(logs)
    ]
    tasks = [asyncio.ensure_future(first_event(t, within=30)) for t in triggers]
    try:
        await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= n, timeout=20)
        # every trigger is tailing its file (each once its stream opened)
        await emulator.wait_for(lambda _: subscriptions() >= n, timeout=10)
        watcher = file_watch.current_watcher()
        assert watcher is not None
        assert watcher.stats()["directories"] == n and watcher.stats()["subscriptions"] == n
        assert inotify_descriptors() == descriptors + 1  # one descriptor for all of them
        assert other_threads() <= threads  # no watching thread (file reads use the loop's executor)
        for log in logs:
            with log.open("a") as handle:
                handle.write("Job is ready.\n")
        payloads = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(p["status"] == "success" and p["decision"] is True for p in payloads)
    # the last source gone, the watcher stops (off the change path) and its descriptor is closed
    await asyncio.to_thread(
        wait_until,
        lambda: watcher.closed and inotify_descriptors() == descriptors,
        what="the watcher to stop and its descriptor to close",
    )


async def test_one_read_of_the_descriptor_wakes_each_source_once_and_each_reads_its_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes to K files made before the loop runs again reach the watcher as one read of its
    descriptor (two writes each: at least a ``MODIFY`` and a ``CLOSE_WRITE`` apiece): each source
    is called once for all of them — two sources on one file, once each — and reads its file once."""
    woken: collections.Counter[int] = collections.Counter()
    reads: collections.Counter[str] = collections.Counter()
    callback, open_file = FileSource.__call__, os.open

    def counting_callback(self: FileSource, mask: int) -> None:  # a source is the watcher's callback
        woken[id(self)] += 1
        callback(self, mask)

    def counting_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:  # a read opens the file
        reads[os.fspath(path)] += 1
        return open_file(path, flags, *args, **kwargs)

    monkeypatch.setattr(FileSource, "__call__", counting_callback)
    monkeypatch.setattr(os, "open", counting_open)
    k = 6
    logs = []
    for index in range(k):
        (tmp_path / f"job-{index}").mkdir()
        logs.append(tmp_path / f"job-{index}" / "job.log")
        logs[-1].write_text("starting\n")
    sources = [build_source(spec(log), "") for log in [*logs, logs[0]]]
    iterators = [states(source) for source in sources]
    try:
        for successive in iterators:
            assert await anext(successive) == "starting\n"
        watcher = file_watch.current_watcher()
        assert watcher is not None
        events_before = watcher.events_read
        woken.clear()
        reads.clear()
        for log in logs:  # no await in between: the watcher reads every event at once
            for line in ("one\n", "two\n"):
                with log.open("a") as handle:
                    handle.write(line)
        seen = await asyncio.gather(*(value_where(c, lambda v: v.endswith("two\n")) for c in iterators))
        assert seen == ["starting\none\ntwo\n"] * (k + 1)
        assert watcher.events_read - events_before >= 4 * k
        assert woken == {id(source): 1 for source in sources}
        assert reads == collections.Counter(source.path for source in sources)  # one read each
    finally:
        for successive in iterators:
            await successive.aclose()
        for source in sources:
            await source.aclose()


async def test_a_polled_source_keeps_one_timer_per_wait_and_none_once_the_wait_is_over(
    tmp_path: Path,
) -> None:
    """A poll is one timer, armed by a wait (``changed()``) and gone with it: when it ends, and
    when the reader gives it up."""
    log = tmp_path / "job.log"
    log.write_text("0\n")
    source = build_source(spec(log, notifications="poll", poll_interval=0.02), "")
    try:
        assert await source.read() == "0\n"
        assert poll_timers() == 0  # no wait: no timer
        for index in range(1, 4):
            waiting = source.changed()
            assert poll_timers() == 1
            with log.open("a") as handle:
                handle.write(f"{index}\n")
            await asyncio.wait_for(waiting, 10)
            assert poll_timers() == 0
            assert (await source.read()).endswith(f"{index}\n")
        given_up = source.changed()
        assert poll_timers() == 1
        given_up.cancel()
        await until(lambda: poll_timers() == 0, within=10, what="the given-up poll's timer to go")
    finally:
        await source.aclose()


async def test_notified_sources_keep_no_timer_and_share_the_watchers_one_recheck(tmp_path: Path) -> None:
    """On notifications the safety re-check is the watcher's one timer for every source: K sources,
    each read and waited on as a trigger's driver does, add no timer of theirs."""
    k = 5
    logs = []
    for index in range(k):
        (tmp_path / f"job-{index}").mkdir()
        logs.append(tmp_path / f"job-{index}" / "job.log")
        logs[-1].write_text("starting\n")
    sources = [build_source(spec(log), "") for log in logs]
    waits: list[asyncio.Future[Any]] = []
    try:
        for source in sources:
            assert await source.read() == "starting\n"  # the first read subscribes
            waits.append(source.changed())  # as a waiting trigger awaits it
        await asyncio.sleep(0.05)
        watcher = file_watch.current_watcher()
        assert watcher is not None and watcher.stats()["subscriptions"] == k
        assert not any(w.done() for w in waits)  # nothing changed: nothing woke
        callbacks = scheduled_callbacks()
        owners = [getattr(c, "__self__", c) for c in callbacks]
        assert not any(isinstance(o, FileSource) for o in owners)  # no timer of a source's
        assert poll_timers() == 0  # and no poll
        assert [o for o in owners if isinstance(o, file_watch.FileWatcher)] == [watcher]  # the re-check
        assert watcher.stats()["recheck_timers"] == 1
        # the re-check of unchanged files wakes nobody; run early, it takes its timer's place
        watcher.recheck_now()
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits) and watcher.stats()["recheck_timers"] == 1
        owners = [getattr(c, "__self__", c) for c in scheduled_callbacks()]
        assert [o for o in owners if isinstance(o, file_watch.FileWatcher)] == [watcher]  # no second chain
    finally:
        for wait in waits:
            wait.cancel()
        for source in sources:
            await source.aclose()


def append_unreported(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` through a hard link in another directory: inotify reports a
    write to the watches of the directory of the name it was made through, so the watched
    directory never hears of it (what a missed notification looks like)."""
    elsewhere = path.parent.parent / f"{path.parent.name}-link"
    elsewhere.mkdir(exist_ok=True)
    link = elsewhere / path.name
    os.link(path, link)
    try:
        with link.open("a") as handle:
            handle.write(text)
    finally:
        link.unlink()


@pytest.mark.parametrize("when", ["waiting", "between waits"])
async def test_the_watchers_recheck_finds_a_change_no_notification_reported(
    tmp_path: Path, when: str
) -> None:
    """A write whose notification was lost is found by the watcher's re-check: it ends the wait
    under way, or (found while the reader was busy) the next wait ends at once."""
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    source = build_source(spec(log), "")
    try:
        assert await source.read() == "starting\n"
        watcher = file_watch.current_watcher()
        assert watcher is not None
        waiting = source.changed() if when == "waiting" else None
        await asyncio.sleep(0.02)
        append_unreported(log, "Job is ready.\n")
        await asyncio.sleep(0.05)
        assert waiting is None or not waiting.done()  # the write went unreported
        watcher.recheck_now()  # what the re-check timer runs: one stat per watched file
        if waiting is None:
            waiting = source.changed()
            assert waiting.done()  # a change is known already: read at once
        await asyncio.wait_for(waiting, 10)
        assert await source.read() == "starting\nJob is ready.\n"
    finally:
        await source.aclose()


async def test_a_source_that_goes_tears_nothing_down_on_the_change_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # removing a watch and closing the descriptor take the kernel milliseconds: a trigger that fired
    # must not pay them before its event; the next source on the directory finds the watch in place
    monkeypatch.setattr(file_watch, "IDLE_SECONDS", 3600.0)
    watcher = file_watch.shared_watcher()
    first = watcher.subscribe(str(tmp_path / "a.log"), lambda mask: None)
    watcher.unsubscribe(first)
    assert not watcher.closed and watcher.stats()["directories"] == 1
    again = watcher.subscribe(str(tmp_path / "b.log"), lambda mask: None)
    assert again.directory is first.directory and again.active  # the same watch, not a new one
    watcher.unsubscribe(again)
    watcher.remove_idle_now()  # what the idle timer runs: the idle watch goes, then the watcher
    assert watcher.closed and watcher.stats()["directories"] == 0
    assert file_watch.current_watcher() is None


# ------------------------------------------------------------------ rotation and rewrites

OLD = "job 41 started\n" + "still waiting for the input\n" * 4
#: Longer than OLD, decisive line within the part a splice would skip (before ``len(OLD)``).
NEW = "job 42 started\nJob is ready.\n" + "heartbeat\n" * 12


def rewrite_in_place(path: Path) -> None:
    """A job re-run writing with shell ``>``: same inode, truncated, written again at once."""
    with path.open("w") as handle:
        handle.write(NEW)


def copytruncate_then_fast_writer(path: Path) -> None:
    """logrotate ``copytruncate``, and the writer (O_APPEND) goes on before anyone looks."""
    shutil.copyfile(path, path.with_suffix(".log.1"))
    os.truncate(path, 0)
    with path.open("a") as handle:
        handle.write(NEW)


def remove_and_recreate(path: Path) -> None:
    """``rm`` then a new file of the same name (ext4 hands out the same inode number again)."""
    path.unlink()
    path.write_text(NEW)


def rename_rotation(path: Path) -> None:
    """``mv job.log job.log.1`` and a new ``job.log``."""
    path.rename(path.with_suffix(".log.1"))
    path.write_text(NEW)


def truncate_and_rewrite_shorter(path: Path) -> None:
    os.truncate(path, 0)
    path.write_text("Job is ready.\n")


ROTATIONS = {
    "shell-rewrite": (rewrite_in_place, NEW),
    "copytruncate": (copytruncate_then_fast_writer, NEW),
    "rm-recreate": (remove_and_recreate, NEW),
    "rename": (rename_rotation, NEW),
    "truncate": (truncate_and_rewrite_shorter, "Job is ready.\n"),
}


@pytest.mark.parametrize("watch", ["notify", "poll"])
@pytest.mark.parametrize("style", list(ROTATIONS))
async def test_every_rotation_style_is_read_again_from_the_start(
    tmp_path: Path, style: str, watch: str
) -> None:
    rotate, expected = ROTATIONS[style]
    log = tmp_path / "job.log"
    log.write_text(OLD)
    poll = HOUR if watch == "notify" else 0.02
    async with tailing(spec(log, notifications=watch, poll_interval=poll)) as (source, successive):
        assert await anext(successive) == OLD
        assert source.mode == watch
        rotate(log)
        # the source settles on the new file's content: never old text spliced with the new tail
        seen = await value_where(
            successive, lambda v: v == expected or not OLD.startswith(v[: len(OLD)]) or len(v) > len(OLD)
        )
        assert seen == expected


async def test_a_rewrite_is_noticed_beyond_the_fingerprinted_head(tmp_path: Path) -> None:
    """The same first KiB, a different end of what was read: still a rewrite, not an append."""
    head = "header line\n" * (FINGERPRINT_BYTES // 12 + 10)
    log = tmp_path / "job.log"
    log.write_text(head + "old tail of the first run\n")
    async with tailing(spec(log)) as (_, successive):
        await anext(successive)
        with log.open("w") as handle:
            handle.write(head + "second run: Job is ready.\n" + "more output\n" * 20)
        value = await value_where(successive, lambda v: "more output" in v)
        assert value == head + "second run: Job is ready.\n" + "more output\n" * 20


async def test_appends_after_a_rotation_are_followed(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(OLD)
    async with tailing(spec(log)) as (_, successive):
        await anext(successive)
        remove_and_recreate(log)
        await value_where(successive, lambda v: v == NEW)
        with log.open("a") as handle:
            handle.write("appended\n")
        assert await value_where(successive, lambda v: v.endswith("appended\n")) == NEW + "appended\n"


async def test_with_decide_empty_a_deleted_file_counts_as_empty_until_it_returns(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("first\n")
    async with tailing(spec(log, decide_empty=True)) as (_, successive):
        assert await anext(successive) == "first\n"
        log.unlink()
        assert await value_where(successive, lambda v: True) == ""
        log.write_text("second\n")
        assert await value_where(successive, lambda v: True) == "second\n"


async def test_a_directory_removed_and_made_again_is_watched_again(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    log = directory / "job.log"
    log.write_text("first run\n")
    # poll_interval only matters while the directory is missing
    async with tailing(spec(log, poll_interval=0.02, decide_empty=True)) as (source, successive):
        assert await anext(successive) == "first run\n"
        shutil.rmtree(directory)
        assert await value_where(successive, lambda v: True) == ""
        directory.mkdir()
        log.write_text("second run\n")
        assert await value_where(successive, lambda v: v == "second run\n") == "second run\n"
        async with asyncio.timeout(10):
            while not source.subscribed:  # noqa: ASYNC110 - the source resubscribes on its next check
                await asyncio.sleep(0.01)
        with log.open("a") as handle:
            handle.write("Job is ready.\n")
        assert (
            await value_where(successive, lambda v: v.endswith("ready.\n")) == "second run\nJob is ready.\n"
        )


# ------------------------------------------------------------------ how the mode is chosen


@pytest.mark.parametrize(
    ("kind", "mode"),
    [
        ("ext4", "notify"),
        ("xfs", "notify"),
        ("tmpfs", "notify"),
        ("overlay", "notify"),
        ("nfs4", "poll"),
        ("cifs", "poll"),
        ("fuse.sshfs", "poll"),
        ("9p", "poll"),
    ],
)
def test_network_and_fuse_filesystems_are_polled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str, mode: str
) -> None:
    monkeypatch.setattr(file_watch, "filesystem_type", lambda directory: kind)
    assert file_watch.watch_mode(str(tmp_path / "job.log")) == mode
    assert file_watch.watch_mode(str(tmp_path / "job.log"), "notify") == "notify"
    assert file_watch.watch_mode(str(tmp_path / "job.log"), "poll") == "poll"


def test_the_filesystem_type_comes_from_the_mount_table() -> None:
    assert file_watch.filesystem_type("/proc") == "proc"
    assert file_watch.filesystem_type("/proc/self") == "proc"


def test_a_bad_watch_mode_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(
        SystemZeroArgumentError, match=r"source\.notifications .inotify. is not one of"
    ) as info:
        build_source(spec(tmp_path / "x", notifications="inotify"), "")
    assert info.value.field == "source.notifications"
