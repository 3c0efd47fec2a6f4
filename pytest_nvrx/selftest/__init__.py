"""The self-test: the control run, then every planted recovery bug side by side, each judged
(caught, missed, not applied), and ``python -m pytest_nvrx selftest``. Its catalogue of plants
lives in settings/plants.py (a setting's choices, named by evidence and criteria) and a planted
run's outcome in criteria/selftest_outcome.py (the report shows it). Import rule: everything below
it, session/ included; never the entry points (plugin.py, fixtures.py, cli.py, verify.py).
"""
