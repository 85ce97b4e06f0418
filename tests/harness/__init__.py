"""The real-Airflow test harness (see ``airflow_harness``); fixtures in ``fixtures``."""
