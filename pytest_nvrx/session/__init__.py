"""The pytest session's scenarios, without pytest itself: the scenario matrix, one scenario's run
(plan, launch, judge: ScenarioRun and its outcome under the session's limits), the pool that runs
launches side by side on their GPU slots and the scenarios submitted to it, the xdist
scheduling, the header, the session's outputs and its summary (the verdict table that ends
the console, the report written, the comparison). Import rule: everything below it
(layout.py, outputs.py, worker/, settings/, evidence/, megatron/, launch/, criteria/, report/,
compare/); never selftest/ or the entry points (plugin.py, fixtures.py, cli.py, verify.py).
"""
