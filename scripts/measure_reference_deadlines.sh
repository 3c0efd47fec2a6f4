#!/usr/bin/env bash
# The reference workload's section deadlines against its slowest realistic sections (#23 item 2):
# a wheel built from this tree, installed into a new venv *without* bytecode (uv's default; and
# PYTHONDONTWRITEBYTECODE=1, as in many containers, so no .pyc is ever written), then N pytest
# sessions of the default CPU matrix at once on this machine (each also runs its scenarios side
# by side): a machine loaded by a parallel matrix. Every rank's last line gives the longest
# time each section was open (the reference workload's "longest sections" line); this prints
# the maximum per section over all of them, each session's outcome, and writes it as JSON.
#
#   scripts/measure_reference_deadlines.sh [SESSIONS (3)] [OUT.json]
#
# Measured results: benchmarks/results/reference-sections-loaded-nobytecode.json, docs/options.md
# ("Section deadlines of the reference workload").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sessions=${1:-3}
out=${2:-benchmarks/results/reference-sections-loaded-nobytecode.json}
scripts/bootstrap.sh >/dev/null
work=$(mktemp -d /tmp/nvrx-deadlines-XXXXXX)
trap 'rm -rf "$work"' EXIT
py=$(.venv/bin/python -c 'import sys; print(sys.executable)')
# uv as bootstrap.sh found it: on PATH, else beside the interpreter the venv was made from
uv=(uv)
uv --version >/dev/null 2>&1 || uv=("$(readlink -f "$py")" -m uv)
"${uv[@]}" build --quiet --wheel --out-dir "$work/dist" . >/dev/null
export UV_PYTHON_DOWNLOADS=never PYTHONDONTWRITEBYTECODE=1
"${uv[@]}" venv --quiet --python "$(readlink -f "$py")" "$work/venv"
"${uv[@]}" pip install --quiet --python "$work/venv/bin/python" \
    --python-platform x86_64-manylinux_2_39 "$work"/dist/*.whl
pycs=$(find "$work/venv" -name '*.pyc' | wc -l)
echo "measure: wheel installed without bytecode ($pycs .pyc files); $sessions sessions at once"
t0=$SECONDS
pids=()
for ((i = 1; i <= sessions; i++)); do
    mkdir -p "$work/s$i"
    (cd "$work/s$i" && exec "$work/venv/bin/python" -m pytest --pyargs pytest_nvrx.suite \
        -m "not gpu" -p no:cacheprovider -q --nvrx-work-dir "$work/s$i/w" --nvrx-keep \
        --junitxml "$work/s$i/junit.xml" >"$work/s$i/pytest.log" 2>&1) &
    pids+=($!)
done
codes=()
for pid in "${pids[@]}"; do
    code=0
    wait "$pid" || code=$?
    codes+=("$code")
done
wall=$((SECONDS - t0))
pycs_after=$(find "$work/venv" -name '*.pyc' | wc -l)
"$py" - "$work" "$sessions" "$wall" "$pycs_after" "$out" "${codes[@]}" <<'EOF'
import json, re, sys
from pathlib import Path

work, sessions, wall, pycs, out = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
codes = [int(c) for c in sys.argv[6:]]
line = re.compile(r"longest sections \(s\) (.+)$")
longest: dict[str, float] = {}
lines = 0
for log in sorted(work.glob("s*/w/runs/*/logs/train_cycle*.log")):
    for text in log.read_text(errors="replace").splitlines():
        m = line.search(text)
        if m is None:
            continue
        lines += 1
        parts = m[1].split()
        for name, took in zip(parts[::2], parts[1::2]):
            longest[name] = max(longest.get(name, 0.0), float(took))
summaries = []
for i in range(1, sessions + 1):
    tail = (work / f"s{i}" / "pytest.log").read_text(errors="replace").strip().splitlines()
    summaries.append(next((t for t in reversed(tail) if " in " in t and ("passed" in t or "failed" in t)), tail[-1] if tail else ""))
result = {
    "what": "reference default matrix, N pytest sessions at once, wheel without bytecode",
    "sessions": sessions,
    "exit_codes": codes,
    "outcomes": summaries,
    "wall_s": wall,
    "pyc_files_after": pycs,
    "section_lines": lines,
    "longest_s": dict(sorted(longest.items())),
}
Path(out).write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1))
sys.exit(0 if all(c == 0 for c in codes) else 1)
EOF
