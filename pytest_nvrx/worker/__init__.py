"""What runs inside the training processes: the injector (run as a script by ft_launcher in
front of the workload) and the self-test's plant hook (a directory put on a planted run's
``PYTHONPATH``). Import rule: the stdlib only, nothing of pytest_nvrx, so a worker's start-up
stays cheap and sees only what its own interpreter gives it; this ``__init__`` imports nothing.
"""
