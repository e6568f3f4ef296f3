"""A sensor that starts from the triggerer defers with a templated ``key_namespace``, which the
triggerer renders by setting the trigger's attribute before the run: the streams the run opens
take the rendered namespace (their keys and cache key), never the template's text, for the real
trigger against the real emulator."""

from __future__ import annotations

from airflow_provider_systemzero.emulator.server import Emulator
from tests import helpers
from tests.helpers import channel_trigger, running_trigger

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes

TEMPLATE = "sz-sft-{{ ti.dag_id }}.{{ ti.task_id }}.{{ ti.run_id }}.{{ ti.map_index }}"
RENDERED = "sz-sft-rendered.wait.manual__1.-1"


async def _cache_key(emulator: Emulator, trigger: object) -> str | None:
    async with running_trigger(trigger):
        await emulator.wait_for(lambda _: trigger.open_stream is not None, timeout=20)  # type: ignore[attr-defined]
        return trigger.open_stream.request.prompt_cache_key  # type: ignore[attr-defined]


async def test_the_streams_take_the_namespace_the_triggerer_rendered(emulator: Emulator) -> None:
    rendered_here = channel_trigger("rendered", "rendered-a", key_namespace=TEMPLATE)
    rendered_here.key_namespace = RENDERED  # what the triggerer's render_template_fields does
    assert rendered_here.key_namespace == RENDERED
    built_rendered = channel_trigger("rendered", "rendered-b", key_namespace=RENDERED)
    assert await _cache_key(emulator, rendered_here) == await _cache_key(emulator, built_rendered)
