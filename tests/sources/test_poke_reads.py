"""A poking sensor reads its file as a trigger tails it: the same source object
(``StateSource.read_now``), so the state — and with it the state hash, the idempotency keys and
what ``decide_when`` sees — does not depend on ``deferrable``.

Each test reads a real file both ways, or pokes it several times with one source as a poking
sensor does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources.spec import build_source
from tests.helpers.sources import spec


async def _tailed(path: Path, initial: str) -> Any:
    """The first state a trigger's source reads for ``path``."""
    source = build_source(spec(path), initial)
    try:
        async with asyncio.timeout(10):
            return await source.read()
    finally:
        await source.aclose()


def test_line_endings_are_the_triggers(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"started\r\nJob is ready.\r\nlast\rline\n")
    poked = build_source(spec(log), "log:\n").read_now()
    assert poked == "log:\nstarted\r\nJob is ready.\r\nlast\rline\n"  # as written: no newline folding
    assert poked == asyncio.run(_tailed(log, "log:\n"))


def test_a_character_cut_between_two_pokes_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    text = "état: prêt\n".encode()
    log.write_bytes(text[:1])  # the first byte of 'é'
    source = build_source(spec(log), "")
    assert source.read_now() == ""
    with log.open("ab") as handle:
        handle.write(text[1:])
    assert source.read_now() == "état: prêt\n"


def test_a_missing_file_is_said_once_however_many_pokes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = build_source(spec(tmp_path / "never.log"), "")
    with caplog.at_level(logging.INFO, logger="airflow_provider_systemzero"):
        for _ in range(3):
            assert source.withheld(source.read_now())
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "does not exist" in r.getMessage()
    ]
    assert len(warnings) == 1


def test_must_exist_is_checked_at_the_first_read_only(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    with pytest.raises(SystemZeroArgumentError, match="does not exist on host"):
        build_source(spec(log, must_exist=True), "").read_now()
    log.write_text("started\n")
    source = build_source(spec(log, must_exist=True), "")
    assert source.read_now() == "started\n"
    log.unlink()  # mid-rotation: the trigger reads it as without content, and so does a poke
    assert source.withheld(source.read_now())
    log.write_text("Job is ready.\n")
    assert source.read_now() == "Job is ready.\n"


def test_a_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("a long first run of the job\n")
    source = build_source(spec(log), "")
    assert source.read_now() == "a long first run of the job\n"
    log.write_text("re-run\n")  # shorter: truncated and rewritten
    assert source.read_now() == "re-run\n"
    with log.open("a") as handle:
        handle.write("Job is ready.\n")
    assert source.read_now() == "re-run\nJob is ready.\n"  # appended to, not re-read


def test_a_callable_and_a_static_state_read_now() -> None:
    from tests.helpers.flag_sources import STATES

    assert build_source(None, {"status": "ready"}).read_now() == {"status": "ready"}
    STATES["poked"] = "Job is ready.\n"
    try:
        for path in ("flag_state", "sync_flag_state"):  # async def and def
            source = build_source(
                {
                    "type": "callable",
                    "path": f"tests.helpers.flag_sources.{path}",
                    "kwargs": {"name": "poked"},
                },
                "",
            )
            assert source.read_now() == "Job is ready.\n"
    finally:
        del STATES["poked"]
    generator = build_source({"type": "callable", "path": "tests.helpers.flag_sources.pushed_states"}, "")
    with pytest.raises(SystemZeroArgumentError, match="an async generator source needs deferrable=True"):
        generator.read_now()


@pytest.mark.parametrize(
    "path",
    ["tests.helpers.flag_sources.sync_flag_state", "tests.helpers.flag_sources:sync_flag_state"],
)
def test_a_source_path_and_decide_when_read_a_dotted_path_alike(path: str) -> None:
    """One rule for both (``dotted``): what one accepts the other imports the same way."""
    from airflow_provider_systemzero.decisions.relevance import DecisionFilter

    assert (
        build_source({"type": "callable", "path": path, "kwargs": {"name": "x"}}, "").read_now()
        == "waiting\n"
    )
    relevance = DecisionFilter(decide_when={"callable": path}).relevance()
    assert relevance is not None and relevance.is_callable


@pytest.mark.parametrize("path", ["nomodule", "pkg.1bad.func", "pkg:mod:func", ""])
def test_a_malformed_dotted_path_is_refused_alike(path: str) -> None:
    from airflow_provider_systemzero.decisions.relevance import DecisionFilter
    from airflow_provider_systemzero.sources.spec import validate_source_spec

    with pytest.raises(SystemZeroArgumentError, match=r"is not a dotted path 'package\.module\.function'"):
        DecisionFilter(decide_when={"callable": path})
    if path:  # an empty path is refused as missing
        with pytest.raises(
            SystemZeroArgumentError, match=r"is not a dotted path 'package\.module\.function'"
        ):
            validate_source_spec({"type": "callable", "path": path}, "")
