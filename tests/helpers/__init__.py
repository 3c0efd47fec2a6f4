"""What several test modules share: doctored copies of committed runs (doctor.py) and the memo
that parses their unchanged files once (parse_once.py), the adversarial reviews' harness
(adversarial.py), real runs
through the real launcher (reference_runs.py, recipe_runs.py, selftest_runs.py), marked process
trees (processes.py), stand-in Megatron checkouts (megatron_checkouts.py), the injector's test
launcher (injector_launcher.py), what a committed run records (recorded_runs.py), the sessions'
shared arguments (sessions.py), a tree's snapshot (files.py), the real-run guard that fails an
unmarked test that launches (launch_guard.py, a plugin tests/conftest.py loads), the CLI's
entries into each module measured (spine_trace.py); and the scripts tests run as workloads
(injector_trainer.py, tree_spawner.py). Test modules import from here, not from one another
(tests/test_install_as_written.py shares tests/test_packaging.py's wheel tooling)."""
