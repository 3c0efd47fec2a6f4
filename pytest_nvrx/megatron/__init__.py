"""What a Megatron checkout and the workers' interpreter say about themselves, probed without
running training: the checkout's options and the environment checks of its argument validation,
read as source; what it builds at first use, read from its Makefile; the versions of the stack
the workers import (stack.py, also run as a script by that interpreter). Import rule: the stdlib
and megatron/ itself only, so every stage above may ask these probes.
"""
