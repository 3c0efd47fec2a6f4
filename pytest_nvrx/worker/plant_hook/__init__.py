"""The self-test's plants (stdlib only): :mod:`nvrx_plants` and the ``sitecustomize`` that loads
it into a planted Megatron run's workers. This directory itself goes on their ``PYTHONPATH``."""
