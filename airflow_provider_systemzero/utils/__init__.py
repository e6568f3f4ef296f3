"""Airflow glue used by the operators and the sensor (human review of a decision)."""
