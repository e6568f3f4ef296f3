"""Airflow hooks of the System Zero provider."""
