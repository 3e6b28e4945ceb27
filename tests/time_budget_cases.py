"""A test that outlasts a short --time-budget, run by tests/test_run_report.py between properties, in a pytest of
its own (not collected here): the properties after it find the budget spent."""

import os
import time


def test_outlasts_the_time_budget():
    time.sleep(float(os.environ["TIME_BUDGET_SLEEP_S"]))
