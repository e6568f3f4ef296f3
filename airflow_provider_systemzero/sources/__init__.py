"""Where a trigger's state comes from: a file, an author's function, or a state that never changes.

Every source has one read interface (:class:`~airflow_provider_systemzero.sources.base.StateSource`:
``read()``, ``changed()``, ``withheld()``), used the same way by a trigger in the triggerer and
by a poking sensor on its worker. A source is described by plain JSON (it travels in trigger
kwargs) and built where it is read (:func:`build_source`).

* :mod:`~airflow_provider_systemzero.sources.spec` — describing, checking and building a source;
* :mod:`~airflow_provider_systemzero.sources.base` — the read interface and the static source;
* :mod:`~airflow_provider_systemzero.sources.file` — a tailed regular file, and
  :mod:`~airflow_provider_systemzero.sources.file_watch` (with
  :mod:`~airflow_provider_systemzero.sources.mount_table`), the process's one file watcher;
* :mod:`~airflow_provider_systemzero.sources.callable` — an author's function, and
  :mod:`~airflow_provider_systemzero.sources.threads`, where authors' sync functions run.
"""

from airflow_provider_systemzero.sources.base import StateSource, StaticSource
from airflow_provider_systemzero.sources.callable import CallableSource, SourceFailed
from airflow_provider_systemzero.sources.file import FINGERPRINT_BYTES, FileSource
from airflow_provider_systemzero.sources.spec import (
    build_source,
    plain_source,
    refuse_rendered_state,
    state_templates,
    validate_source_spec,
)

__all__ = [
    "FINGERPRINT_BYTES",
    "CallableSource",
    "FileSource",
    "SourceFailed",
    "StateSource",
    "StaticSource",
    "build_source",
    "plain_source",
    "refuse_rendered_state",
    "state_templates",
    "validate_source_spec",
]
