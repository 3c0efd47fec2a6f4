#!/usr/bin/env bash
# Judge every committed run dir (tests/data/**/run.json's directories) with `verify`, text and
# --json, into OUTDIR: one file pair per run, its exit status appended. Run it before and after a
# change of the evidence or criteria code, then `diff -r BEFORE AFTER`: a change meant to keep
# every verdict must print nothing. Absolute paths of this checkout are written relative, so two
# worktrees compare. About 50 s on the 2-core machine.
#   scripts/verify_sweep.sh /tmp/sweep-before   # ... change ...   scripts/verify_sweep.sh /tmp/sweep-after
set -u
out=${1:?usage: scripts/verify_sweep.sh OUTDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo" || exit 1
find tests/data -name run.json | sort | while read -r f; do
    d=$(dirname "$f")
    n=$(echo "$d" | tr / _)
    .venv/bin/python -m pytest_nvrx verify "$d" --json - >"$out/$n.json" 2>"$out/$n.txt"
    echo "rc=$?" >>"$out/$n.txt"
done
sed -i "s#$repo/##g" "$out"/*
