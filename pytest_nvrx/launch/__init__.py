"""The launch stage: a planned run started as ft_launcher's process tree and stopped whole.

The recipe (launcher, injector and workload argv, run.json), the plan that builds it, the run
directory made fresh and claimed with its checkpoint directory, the launcher as a process tree
(one node, or one per node through Slurm), its watchdog, the stop signals, the ports, the GPU
slots, what of a run dir is kept, and a Megatron checkout's first-use build. No pytest, no
judging. Import rule: the stdlib, layout.py, outputs.py, worker/, settings/, evidence/ (the live
progress and the readers it shares), megatron/ and launch/ itself; never criteria/, report/,
session/, selftest/ or the entry points. watchdog.py and ports.py also run as programs (``-m``
and a script path), so this ``__init__`` imports nothing.
"""
