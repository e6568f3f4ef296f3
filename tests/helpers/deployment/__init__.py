"""The throwaway deployment of real Airflow components that ``tests/deployment``, ``tests/ui`` and
``tests/conformance`` run against (:mod:`.harness`), and what it needs to run and report."""
