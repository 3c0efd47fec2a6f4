#!/usr/bin/env bash
# Prepare what the GPU device machine lacks, into git-ignored folders of the repo root.
#
#   scripts/prepare_device.sh                          wheels only  -> .whl/
#   scripts/prepare_device.sh --megatron-git DIR       wheels + Megatron export -> .megatron/
#   scripts/prepare_device.sh --no-wheels --megatron-git DIR
#
# The device has Python 3.12, torch and CUDA but no network, no NVRx and no Megatron-LM.
# .whl/ holds NVRx 0.7.0 and the packages it needs that the device image lacks (or has in an
# unusable version: NVRx's generated gRPC code needs protobuf 6, the image has 7).
# .megatron/ holds `megatron/`, `pretrain_gpt.py`, `gpt_builders.py` and `model_provider.py`
# of one Megatron-LM tag (default core_v0.19.0), exported with `git archive` from a clone or
# bare git dir DIR, plus .megatron/MEGATRON_REV ("<commit> <tag>"): the export has no .git,
# and pytest_nvrx.stack reads the revision from that file.
# .megatron.tgz packs that export (about 2 MiB against 11 MiB of files): the run tool counts
# the travelling tree by disk blocks, and with the committed runs the tracked tree, .whl/ and
# an unpacked .megatron/ no longer fit. device_gpu_suite.sh extracts it on the device into a
# fresh .megatron/ (no built dataset helpers), as a user's first checkout is.
# Both travel to the device with the run tool's `carry` (64 MiB in all with the tree).
# See docs/device.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MEGATRON_TAG=core_v0.19.0
MEGATRON_GIT=""
DO_WHEELS=1
PY="${PYTHON:-python3}"

# One version of each: two versions of a name in .whl/ stop the device's pip install.
WHEELS=(
    nvidia-resiliency-ext==0.7.0
    defusedxml==0.7.1
    grpcio==1.76.0
    grpcio-tools==1.76.0
    protobuf==6.33.6
    pydantic==2.14.4
    pydantic-core==2.50.5
    pydantic-settings==2.16.3
    python-dotenv==1.2.4
    annotated-types==0.8.0
    typing-inspection==0.4.5
    fastapi==0.165.0
    starlette==1.10.0
    slowapi==0.1.10
    limits==5.8.0
    deprecated==3.0.1
    uvicorn==0.54.0
    opentelemetry-api==1.45.2
)
# Installed on the device image (KINDS.md, "Python packages already there"); requirements on
# these are not carried. Versions there are the image's: the --smoke run prints them.
DEVICE_HAS=(
    torch numpy psutil pyyaml packaging httpx nvidia-ml-py typing-extensions anyio click h11
    wrapt uvloop setuptools annotated-doc idna certifi httpcore sniffio filelock
)
MEGATRON_PATHS=(megatron pretrain_gpt.py gpt_builders.py model_provider.py)

usage() {
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while (($#)); do
    case "$1" in
        --megatron-git) MEGATRON_GIT="${2:?--megatron-git needs a git dir or checkout}"; shift 2 ;;
        --megatron-tag) MEGATRON_TAG="${2:?--megatron-tag needs a tag or commit}"; shift 2 ;;
        --no-wheels) DO_WHEELS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "prepare_device: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

# Refuse to write into a tree where git would pick these folders up.
for d in .whl .megatron; do
    if ! git check-ignore -q "$d/x"; then
        echo "prepare_device: $d/ is not git-ignored here; add '/$d/' to .gitignore first" >&2
        exit 2
    fi
done

prepare_wheels() {
    mkdir -p .whl
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_39_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d .whl "${WHEELS[@]}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    # Drop wheels of other versions left by an earlier pin, then check that every carried
    # wheel's requirements are carried (right version) or on the device image.
    "$PY" - "${#WHEELS[@]}" "${WHEELS[@]}" "${DEVICE_HAS[@]}" <<'PYEOF'
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

n = int(sys.argv[1])
pins = {canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in sys.argv[2 : 2 + n]}
device = {canonicalize_name(x) for x in sys.argv[2 + n :]}
carried = {}
for whl in sorted(Path(".whl").glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    name = canonicalize_name(name)
    if pins.get(name) != version:
        print(f"prepare_device: removing {whl.name} (not pinned)")
        whl.unlink()
        continue
    carried[name] = (version, whl)
missing = sorted(set(pins) - set(carried))
problems = [f"pinned but not downloaded: {m}" for m in missing]
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
for name, (version, whl) in sorted(carried.items()):
    with zipfile.ZipFile(whl) as z:
        meta = next(f for f in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", f))
        msg = Parser().parsestr(z.read(meta).decode())
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue  # an extra, or another platform
        dep = canonicalize_name(req.name)
        if dep in carried:
            if not req.specifier.contains(carried[dep][0], prereleases=True):
                problems.append(f"{name} needs {req}, carried {dep} {carried[dep][0]}")
        elif dep not in device:
            problems.append(f"{name} needs {req}: neither carried nor on the device image")
for p in problems:
    print(f"prepare_device: WARNING {p}", file=sys.stderr)
total = sum(w.stat().st_size for _, w in carried.values())
print(f"prepare_device: .whl/ {len(carried)} wheels, {total / 2**20:.1f} MiB")
sys.exit(1 if missing else 0)
PYEOF
}

prepare_megatron() {
    local gitdir="$MEGATRON_GIT" rev tmp
    [[ -d "$gitdir/.git" ]] && gitdir="$gitdir/.git"
    git --git-dir "$gitdir" rev-parse -q --verify "$MEGATRON_TAG^{commit}" >/dev/null 2>&1 || {
        echo "prepare_device: $MEGATRON_GIT has no commit '$MEGATRON_TAG'" >&2; exit 2; }
    rev="$(git --git-dir "$gitdir" rev-parse "$MEGATRON_TAG^{commit}")"
    tmp=".megatron.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    git --git-dir "$gitdir" archive "$MEGATRON_TAG" "${MEGATRON_PATHS[@]}" | tar -x -C "$tmp"
    printf '%s %s\n' "$rev" "$MEGATRON_TAG" >"$tmp/MEGATRON_REV"
    rm -rf .megatron
    mv "$tmp" .megatron
    trap - EXIT
    tar -czf .megatron.tgz.tmp -C .megatron . && mv .megatron.tgz.tmp .megatron.tgz
    echo "prepare_device: .megatron/ = $MEGATRON_TAG ($rev)," \
        "$(($(du -sb .megatron | cut -f1) / 1048576)) MiB, $(find .megatron -type f | wc -l) files"
}

if ((DO_WHEELS)); then prepare_wheels; fi
if [[ -n "$MEGATRON_GIT" ]]; then prepare_megatron; fi

# What travels with `carry: [".whl", ".megatron.tgz"]` besides the tracked tree (limit 64 MiB,
# counted in disk blocks as `du` counts them).
carried=0
for d in .whl .megatron.tgz; do
    [[ -e "$d" ]] && carried=$((carried + $(du -sk "$d" | cut -f1)))
done
tracked=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "prepare_device: tracked tree $((tracked / 1024)) MiB + carried $((carried / 1024)) MiB" \
    "= $(((tracked + carried) / 1024)) MiB of the device's 64 MiB"
