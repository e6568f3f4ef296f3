"""Callable sources: a hung call stays its own problem, a transient failure is retried, a value
changed in place is seen to change.

Through the source API (``build_source(...).read()``, ``changed()``) and the decision trigger
against the emulator.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources.spec import build_source
from tests.helpers import first_event, rebuilt, sensor_trigger
from tests.helpers import source_callables as callables
from tests.helpers import trigger_callables as trigger_callables

ROOT = Path(__file__).resolve().parents[2]


def callable_spec(function: str, **extra: Any) -> dict[str, Any]:
    return {"type": "callable", "path": f"tests.helpers.source_callables.{function}", **extra}


@pytest.fixture(autouse=True)
def hung_calls_return() -> Iterator[None]:
    callables.RELEASE.clear()
    callables.CALLS.clear()
    callables.MOST_RUNNING.clear()
    yield
    callables.RELEASE.set()  # let the hung threads finish


# ------------------------------------------------------------------ hung sync calls


async def test_hung_sources_do_not_starve_other_triggers(tmp_path: Path) -> None:
    # more hung sources than the loop's default executor has threads (at most 32)
    hung = [build_source(callable_spec("hang", kwargs={"name": f"h{i}"}), "") for i in range(40)]
    calls = [asyncio.ensure_future(source.read()) for source in hung]
    try:
        await asyncio.sleep(0.1)
        assert not any(call.done() for call in calls)
        quick = build_source(callable_spec("quick", kwargs={"name": "other"}), "")
        log = tmp_path / "job.log"
        log.write_text("file read too\n")
        tail = build_source({"type": "file", "path": str(log)}, "")
        async with asyncio.timeout(10):
            assert await quick.read() == "other is fine\n"
            assert await tail.read() == "file read too\n"  # the loop's executor is free
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


async def test_a_hung_call_times_out_and_is_never_run_twice_at_once(caplog: pytest.LogCaptureFixture) -> None:
    source = build_source(
        callable_spec("hang", kwargs={"name": "stuck"}, timeout=0.05, retries=3, retry_delay=0.01), ""
    )
    caplog.set_level(logging.WARNING, logger="airflow_provider_systemzero.sources.callable")
    with pytest.raises(
        Exception,
        match=r"failed 4 time\(s\) in a row; last: CallTimedOut: the source "
        r"tests\.helpers\.source_callables\.hang\(\) did not return within 0\.05 s",
    ) as info:
        async with asyncio.timeout(10):
            await source.read()
    assert type(info.value).__name__ == "SourceFailed"
    assert (
        callables.CALLS["stuck"] == 1 and callables.MOST_RUNNING["stuck"] == 1
    )  # waited for, not called again
    assert (
        sum(
            "tests.helpers.source_callables.hang failed (CallTimedOut" in r.getMessage()
            for r in caplog.records
        )
        == 3
    )


def test_a_process_whose_trigger_ended_does_not_wait_for_a_hung_call() -> None:
    script = textwrap.dedent("""
        import asyncio
        from airflow_provider_systemzero.sources.spec import build_source

        async def main():
            source = build_source({"type": "callable", "path": "tests.helpers.source_callables.sleep_for",
                                   "kwargs": {"seconds": 600}}, "")
            try:
                await asyncio.wait_for(source.read(), 0.5)
            except TimeoutError:
                print("gave up on the source")

        asyncio.run(main())
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "gave up on the source" in done.stdout


# ------------------------------------------------------------------ transient failures


async def test_a_transient_failure_is_retried_and_the_trigger_fires(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="airflow_provider_systemzero.sources.callable")
    trigger = rebuilt(
        sensor_trigger(
            source=callable_spec("flaky", kwargs={"name": "blip", "failures": 2}, poll_interval=0.02)
        )
    )
    payload = await first_event(trigger)
    assert payload["status"] == "success" and payload["decision"] is True
    assert callables.CALLS["blip"] >= 3  # two failures, then answers (and is polled on)
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2 and "ConnectionError: network blip number 1" in retries[0]


async def test_a_source_that_keeps_failing_fails_the_trigger_naming_the_cause(emulator: Emulator) -> None:
    trigger = rebuilt(
        sensor_trigger(
            source=callable_spec(
                "flaky", kwargs={"name": "down", "failures": 99}, retries=2, retry_delay=0.01
            )
        )
    )
    payload = await first_event(trigger)
    assert payload["status"] == "error"
    assert "failed 3 time(s) in a row; last: ConnectionError: network blip number 3" in payload["message"]
    assert callables.CALLS["down"] == 3


async def test_a_failing_async_generator_is_called_again(emulator: Emulator) -> None:
    trigger = rebuilt(sensor_trigger(source=callable_spec("flaky_generator", kwargs={"name": "feed"})))
    payload = await first_event(trigger)
    assert payload["status"] == "success" and payload["decision"] is True
    assert callables.CALLS["feed"] == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("retries", -1, "source.retries -1 must be a whole number from 0 to 100"),
        ("retries", 1.5, "source.retries 1.5 must be a whole number"),
        ("retry_delay", 0, "source.retry_delay 0 must be a positive number of seconds"),
        ("timeout", "5", "source.timeout '5' must be a positive number of seconds"),
    ],
)
def test_bad_retry_settings_are_refused_naming_the_field(field: str, value: Any, message: str) -> None:
    with pytest.raises(SystemZeroArgumentError) as info:
        build_source(callable_spec("quick", kwargs={"name": "x"}, **{field: value}), "")
    assert message in str(info.value) and info.value.field == f"source.{field}"


async def test_a_generator_that_ends_leaves_the_state_as_it_was_last_yielded() -> None:
    """A push source's generator that returns leaves the state as it last yielded, for the rest of
    the trigger's life: a wait on it never ends (nothing will change), and a read gives that state
    without calling the function again."""
    source = build_source(callable_spec("two_then_end", kwargs={"name": "ends"}), "")
    try:
        assert await source.read() == "waiting\n"
        await asyncio.wait_for(source.changed(), 10)
        assert await source.read() == "still waiting\n"
        await asyncio.wait_for(source.changed(), 10)  # the generator returned: one more look
        assert await source.read() == "still waiting\n"
        waiting = source.changed()
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the state stays
        waiting.cancel()
        assert await source.read() == "still waiting\n"
        assert callables.CALLS["ends"] == 1  # never called again
    finally:
        await source.aclose()


async def test_a_list_changed_in_place_is_seen_to_change() -> None:
    """A function that returns the same list each time, appended to in place: each read is a state
    of its own (a copy), so the next one differs from it, and what the author's code does later
    changes no state already read."""
    growing = trigger_callables.GROWING
    growing[:] = ["line 0"]
    try:
        source = build_source(
            {"type": "callable", "path": "tests.helpers.trigger_callables.growing_list"}, []
        )
        first = await source.read()
        growing.append("line 1")
        second = await source.read()
        assert first == ["line 0"] and second == ["line 0", "line 1"]
        growing.append("written later")
        assert second == ["line 0", "line 1"]  # a state already read stays as it was read
    finally:
        growing.clear()


def test_each_source_says_where_its_state_comes_from() -> None:
    polled = build_source(callable_spec("quick", poll_interval=2.5), "")
    assert polled.describe() == "tests.helpers.source_callables.quick(), every 2.5 s"
    pushed = build_source(callable_spec("two_then_end"), "")
    assert pushed.describe() == "tests.helpers.source_callables.two_then_end(), as its generator yields"
    assert build_source(None, "Job started.").describe() == "the task (it never changes)"
