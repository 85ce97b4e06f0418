"""What the bridge runs in Airflow's processes: the operator, the router, the trigger, the report.

A task process imports these without loading ``temporalio``: the handover itself runs in a
short-lived child process (``handoff``) and the wait runs in the triggerer (``workflow_trigger``).
"""
