"""What a decision means for a task, with no Airflow in sight.

The rules that decide whether an answer ends a wait, and what it may cost, live here as plain
Python that imports no Airflow: :mod:`.conditions` (the watched question, its expected answer and
the hysteresis that debounces it), :mod:`.policy` (confidence bands: act, review, fall back or
wait) and :mod:`.budget` (spending caps and the usage record). The Airflow classes (hooks,
triggers, sensors, operators) and their glue (:mod:`airflow_provider_systemzero.tasks.review`,
:mod:`~airflow_provider_systemzero.tasks.usage`) build on this package; nothing here builds on them.
"""
