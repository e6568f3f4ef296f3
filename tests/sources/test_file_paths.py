"""File sources whose path or watch can end up in the wrong place: symbolic links on the path, the
watcher across event loops, a read cancelled before it started, a watch that cannot be placed, a
path that is not a regular file (a FIFO, a directory, a device).

Sources get ``poll_interval`` = one hour: a change that arrives at all arrived by notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import shutil
import stat
import threading
import time
from collections.abc import Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources import file_watch
from airflow_provider_systemzero.sources.file import INLINE_READ_BYTES
from airflow_provider_systemzero.sources.spec import build_source
from tests.helpers import until, wait_until
from tests.helpers.sources import inotify_descriptors, poll_timers, spec, tailing, value_where


def releases(tmp_path: Path) -> Path:
    """``release-1`` and ``release-2``, each with a started job log, and ``current -> release-1``."""
    for release in ("release-1", "release-2"):
        (tmp_path / release).mkdir()
        (tmp_path / release / "job.log").write_text(f"{release} started\n")
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "release-1")
    return current


async def ready_is_heard(source: Any, waiting: Awaitable[Any], log: Path, before: str) -> None:
    """Append the ready line to ``log``: the wait ``waiting`` (the source's ``changed()``) must end
    (bounded), and the source's text be ``before`` and that line."""
    with log.open("a") as handle:
        handle.write("Job is ready.\n")
    await asyncio.wait_for(waiting, 10)
    assert await source.read() == before + "Job is ready.\n"


def switch_link(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` atomically (a new link renamed over the old, as deploy tools do)."""
    fresh = link.with_name(link.name + ".new")
    fresh.symlink_to(target)
    fresh.rename(link)


async def test_a_directory_link_switched_to_another_directory_is_followed(tmp_path: Path) -> None:
    """``current -> release-1`` switched to ``release-2``: the file behind the path is another one,
    and every later write to it must reach the trigger (not only the once-a-minute re-check)."""
    current = releases(tmp_path)
    async with tailing(spec(current / "job.log")) as (_, successive):
        assert await anext(successive) == "release-1 started\n"
        switch_link(current, tmp_path / "release-2")
        assert await value_where(successive, lambda v: v.startswith("release-2")) == "release-2 started\n"
        with (tmp_path / "release-2" / "job.log").open("a") as handle:
            handle.write("Job is ready.\n")
        ready = await value_where(successive, lambda v: v.endswith("ready.\n"))
        assert ready == "release-2 started\nJob is ready.\n"


async def test_a_directory_link_switched_while_dormant_wakes_the_wait(tmp_path: Path) -> None:
    current = releases(tmp_path)
    source = build_source(spec(current / "job.log"), "")
    try:
        assert await source.read() == "release-1 started\n"
        waiting = source.changed()  # as a trigger with no stream waits
        switch_link(current, tmp_path / "release-2")
        await asyncio.wait_for(waiting, 10)
        assert await source.read() == "release-2 started\n"
        waiting = source.changed()
        await ready_is_heard(source, waiting, tmp_path / "release-2" / "job.log", "release-2 started\n")
    finally:
        await source.aclose()


async def test_a_file_replaced_by_a_link_follows_the_links_target(tmp_path: Path) -> None:
    """A plain file replaced by a link to a file elsewhere: writes to the target must be heard."""
    log = tmp_path / "job.log"
    log.write_text("first\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "job.log").write_text("second\n")
    async with tailing(spec(log)) as (_, successive):
        assert await anext(successive) == "first\n"
        switch_link(log, elsewhere / "job.log")
        assert await value_where(successive, lambda v: v == "second\n") == "second\n"
        with (elsewhere / "job.log").open("a") as handle:
            handle.write("Job is ready.\n")
        assert await value_where(successive, lambda v: v.endswith("ready.\n")) == "second\nJob is ready.\n"


class CountingExecutor(ThreadPoolExecutor):
    """A pool of one worker that counts the calls submitted to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_a_loop_that_ends_leaves_no_inotify_descriptor_behind(tmp_path: Path) -> None:
    """``asyncio.run`` per trigger (``dag.test()``, a test suite) ends each loop before the idle
    watch is removed: the loop's watcher must not outlive it, or every loop costs an inotify
    instance until ``fs.inotify.max_user_instances`` (128 by default) is reached."""
    log = tmp_path / "job.log"
    log.write_text("one\n")

    async def tail_once() -> None:
        source = build_source(spec(log), "")
        assert await source.read() == "one\n"
        assert file_watch.current_watcher() is not None
        await source.aclose()

    before = inotify_descriptors()
    for _ in range(3):
        asyncio.run(tail_once())
    # each loop's first watch closes the watchers of the loops that ended: one is left at most
    wait_until(lambda: inotify_descriptors() <= before + 1, what="the ended loops' descriptors to close")
    gc.collect()  # and the last goes with its loop (a watcher's timers make it a reference cycle)
    wait_until(lambda: inotify_descriptors() <= before, what="the last loop's descriptor to close")


async def test_a_read_cancelled_before_its_thread_started_is_done_by_the_next_wait(tmp_path: Path) -> None:
    """A large read goes to the loop's executor; when every worker is busy it waits in the queue,
    and a trigger that stops its read meanwhile (a stream given up) cancels it before it ran: the
    write it was for must still end the next wait at once, not only at the once-a-minute
    re-check, and the next read return it."""
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    loop = asyncio.get_running_loop()
    executor = CountingExecutor()
    loop.set_default_executor(executor)
    busy = threading.Event()
    source = build_source(spec(log), "")
    try:
        assert await source.read() == "starting\n"
        waiting = source.changed()
        blocker = loop.run_in_executor(None, busy.wait, 10)  # the one worker is taken
        big = "progress\n" * (INLINE_READ_BYTES // 9 + 1) + "Job is ready.\n"
        with log.open("a") as handle:
            handle.write(big)
        await asyncio.wait_for(waiting, 10)
        following = asyncio.ensure_future(source.read())
        # the worker is busy with the blocker: the read's call is the second one, and waits
        await until(lambda: executor.submitted == 2, what="the read to wait for a worker")
        following.cancel()  # the trigger stopped its read, with the queued read
        await asyncio.gather(following, return_exceptions=True)
        busy.set()
        await blocker
        assert source.changed().done()  # the change is still to be read: the next wait ends at once
        assert await asyncio.wait_for(source.read(), 10) == "starting\n" + big
    finally:
        busy.set()
        await source.aclose()
        executor.shutdown(wait=False)


async def test_a_parent_directory_renamed_away_is_followed_after_the_recheck(tmp_path: Path) -> None:
    """``mv data data.old; mkdir -p data/run``: the watch moved with the old directory and no event
    names the new file. The watcher's re-check finds the new file; from then on its writes must
    arrive by notification again (not at each once-a-minute re-check)."""
    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    (run / "job.log").write_text("old run\n")
    source = build_source(spec(run / "job.log"), "")
    try:
        assert await source.read() == "old run\n"
        (tmp_path / "data").rename(tmp_path / "data.old")
        run.mkdir(parents=True)
        (run / "job.log").write_text("new run\n")
        waiting = source.changed()  # as a trigger with no stream waits
        watcher = file_watch.current_watcher()
        assert watcher is not None
        watcher.recheck_now()  # what the re-check timer runs
        await asyncio.wait_for(waiting, 10)
        assert await source.read() == "new run\n"
        waiting = source.changed()
        if waiting.done():  # subscribed again: it looks once at once
            assert await source.read() == "new run\n"
            waiting = source.changed()
        assert not waiting.done()  # from here on, by notification (polling is an hour)
        assert source.subscribed and not poll_timers()
        await ready_is_heard(source, waiting, run / "job.log", "new run\n")
    finally:
        await source.aclose()


async def test_a_subscriber_of_a_directory_renamed_away_is_removed_from_that_one(tmp_path: Path) -> None:
    """After the path leads to a new directory, removing an earlier subscriber by its path must
    drop it from the directory it was watched in (else that watch and its wakes stay for good)."""
    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    watcher = file_watch.shared_watcher()
    path = str(run / "job.log")
    earlier, later = (lambda mask: None), (lambda mask: None)
    old = watcher.subscribe(path, earlier)
    (tmp_path / "data").rename(tmp_path / "data.old")
    run.mkdir(parents=True)
    new = watcher.subscribe(path, later)
    assert new.directory is not old.directory  # the kernel's answer, not the path's last watch
    try:
        watcher.remove(path, earlier)
        assert old.directory.names == {} and new.directory.names == {"job.log": (later,)}
    finally:
        watcher.remove(path, later)


@pytest.mark.parametrize("how", ["never-there", "removed"])
async def test_a_watcher_left_without_a_watch_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A watcher made for a directory that is not there (yet), or whose only directory was removed,
    holds no watch: it must still close once its last source is gone, like any idle watcher."""
    monkeypatch.setattr(file_watch, "IDLE_SECONDS", 0.05)
    directory = tmp_path / "run"
    if how == "removed":
        directory.mkdir()
        (directory / "job.log").write_text("one\n")
    async with tailing(spec(directory / "job.log", poll_interval=0.02, decide_empty=True)) as (
        source,
        successive,
    ):
        first = await anext(successive)
        if how == "removed":
            assert first == "one\n" and source.subscribed
            shutil.rmtree(directory)
            assert await value_where(successive, lambda v: v == "") == ""
        watcher = file_watch.current_watcher()
        assert watcher is not None and watcher.stats()["directories"] == 0
    await until(lambda: file_watch.current_watcher() is None, what="the watcher without a watch to close")


# ------------------------------------------------------------------ paths that are not regular files

#: What the refusal calls each kind of path.
NOT_REGULAR = {"FIFO": "a FIFO (named pipe)", "directory": "a directory", "device": "a character device"}
#: Seconds a read may stay stuck opening a FIFO before a writer lets it go (and the test fails).
LET_GO_AFTER = 10.0


def not_regular(tmp_path: Path, kind: str) -> Path:
    """A path of ``kind`` (:data:`NOT_REGULAR`) where a log file was meant."""
    if kind == "device":
        return Path("/dev/null")
    path = tmp_path / "job.log"
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


@contextlib.contextmanager
def fails_if_stuck_opening(path: Path) -> Iterator[None]:
    """Fail when a read inside gets stuck opening the FIFO ``path`` (an open for reading waits for
    a writer). From :data:`LET_GO_AFTER` seconds on, and once more on the way out, a writer opens
    it and closes it at once: a stuck read goes on (to the FIFO's end), so the test ends, failing
    with this cause, and no thread is left stuck for the loop's executor to wait on. (Nothing is
    done for a path that is not a FIFO: opening it does not wait.)"""
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        yield
        return
    done, let_go = threading.Event(), threading.Event()

    def let_go_of_readers() -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # fails unless a reader has it open
        except OSError:
            return
        let_go.set()
        os.close(fd)

    def writer() -> None:
        if done.wait(LET_GO_AFTER):
            return
        while not done.wait(0.05):
            let_go_of_readers()

    thread = threading.Thread(target=writer, name="fifo-writer", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)
        let_go_of_readers()
        assert not let_go.is_set(), f"a read got stuck opening {path} (let go after {LET_GO_AFTER:g} s)"


def assert_refused(error: SystemZeroArgumentError, path: Path, kind: str) -> None:
    """``error`` refuses ``path`` as ``kind``, naming the path, the field and the fix."""
    message = str(error)
    assert error.code == "not_a_regular_file" and error.field == "source.path", message
    assert f"source.path {str(path)!r}" in message and f"is {NOT_REGULAR[kind]}" in message, message
    assert "point source.path at the log file itself" in message, message


@pytest.mark.parametrize("watch", ["notify", "poll"])
@pytest.mark.parametrize("kind", list(NOT_REGULAR))
async def test_a_path_that_is_not_a_regular_file_is_refused_naming_it(
    tmp_path: Path, kind: str, watch: str
) -> None:
    """A trigger's read refuses it, and never blocks the event loop meanwhile (a FIFO's open waits
    for a writer): a heartbeat on the loop keeps beating while the read is attempted — notified,
    the read runs on the loop; polled, in a thread."""
    path = not_regular(tmp_path, kind)
    source = build_source(spec(path, notifications=watch), "")
    beats: list[float] = []

    async def heartbeat() -> None:
        while True:
            beats.append(time.monotonic())
            await asyncio.sleep(0.005)

    beating = asyncio.ensure_future(heartbeat())
    try:
        with fails_if_stuck_opening(path):
            await until(lambda: beats, what="the heartbeat to start")
            before = len(beats)
            reading = asyncio.ensure_future(source.read())
            await until(
                lambda: reading.done() and len(beats) >= before + 3,
                within=2 * LET_GO_AFTER,  # a read stuck opening a FIFO is let go before
                what="the read to end with the loop beating",
            )
        gaps = [later - earlier for earlier, later in itertools.pairwise(beats[before - 1 :])]
        assert max(gaps) < LET_GO_AFTER  # the loop never stood still waiting for the open
        with pytest.raises(SystemZeroArgumentError) as info:
            reading.result()
        assert_refused(info.value, path, kind)
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await source.aclose()


@pytest.mark.parametrize("kind", list(NOT_REGULAR))
def test_a_poke_refuses_a_path_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = not_regular(tmp_path, kind)
    with fails_if_stuck_opening(path), pytest.raises(SystemZeroArgumentError) as info:
        build_source(spec(path), "").read_now()
    assert_refused(info.value, path, kind)
