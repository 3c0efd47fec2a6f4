#!/usr/bin/env bash
# Shrink or restore what the device run tool sends: it sends this checkout's tracked and
# untracked-not-ignored files plus `carry`, counted in disk blocks, at most 64 MiB. The committed
# runs under tests/data (thousands of small files) are most of that and the device never reads
# them, so before a device call they leave the working tree (a git sparse checkout of this
# worktree only: other worktrees and the index keep them); afterwards they come back.
#
#   scripts/device_tree.sh slim    tests/data out of this worktree (nothing is deleted from git)
#   scripts/device_tree.sh full    everything back
#   scripts/device_tree.sh size    what would travel now, with .whl and .megatron.tgz, in MiB
#
# Run no tests in a slim worktree: they need tests/data. See docs/device.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

size() {
    local tracked carried=0 p
    tracked=$(git ls-files -z | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
        | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    for p in .whl .megatron.tgz; do
        [[ -e "$p" ]] && carried=$((carried + $(du -sk "$p" | cut -f1)))
    done
    echo "device_tree: tree $((tracked / 1024)) MiB + carried $((carried / 1024)) MiB" \
        "= $(((tracked + carried) / 1024)) MiB of 64 MiB"
}

case "${1:-}" in
    slim)
        git sparse-checkout set --no-cone '/*' '!/tests/data/'
        size ;;
    full)
        git sparse-checkout disable
        size ;;
    size) size ;;
    *) echo "usage: $0 slim|full|size" >&2; exit 2 ;;
esac
