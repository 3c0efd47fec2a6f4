"""What the tests' pytest sessions share: the arguments of a session over the shipped suite,
the default matrix's scenario ids of one workload, and the MASTER_PORT of a workload run alone."""

from __future__ import annotations

SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]
DEFAULT_IDS = [
    "baseline",
    "kill-save",
    "hang-finalize",
    "term-finalize",
    "segv-step",
    "exception-step",
    "ckpt-worker-finalize",
]

#: MASTER_PORT for the workload run alone (WORLD_SIZE=1, --no-ft): 0 lets its TCPStore bind a port
#: the kernel chooses, so nothing can take the port between a choice and the bind (a port found
#: free and let go was taken under load in CI: EADDRINUSE); no other rank has to know it.
ONE_RANK_STORE_PORT = "0"
