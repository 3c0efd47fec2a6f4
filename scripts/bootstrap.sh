#!/usr/bin/env bash
# Create/refresh the project's interpreter at .venv (Python 3.12 + torch + megatron-core + NVRx 0.7).
#
# NVRx >= 0.5 ships only cp312 manylinux_2_39 wheels. Its fault-tolerance launcher is pure
# Python and runs on older glibc (measured on Debian 12, glibc 2.36), so we ask uv to resolve for
# manylinux_2_39 explicitly. On a glibc >= 2.39 host pip installs a built wheel or the git URL too
# (docs/install.md; the package is not on PyPI yet).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never

find_python312() {
    local cand
    if command -v pyenv >/dev/null 2>&1; then
        for cand in "$(pyenv root)"/versions/3.12*/bin/python3.12; do
            [[ -x "$cand" ]] && { echo "$cand"; return 0; }
        done
    fi
    for cand in python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 \
            && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$cand"; return 0
        fi
    done
    return 1
}

PY312="$(find_python312)" || { echo "bootstrap: no Python 3.12 found (pyenv or PATH)" >&2; exit 1; }

# uv: use one on PATH if it really runs, else install it next to the 3.12 interpreter.
if uv --version >/dev/null 2>&1; then
    UV=(uv)
else
    "$PY312" -m uv --version >/dev/null 2>&1 || "$PY312" -m pip install -q --disable-pip-version-check uv
    UV=("$PY312" -m uv)
fi

# --compile-bytecode: every launched worker imports torch; with PYTHONDONTWRITEBYTECODE=1 (set on
# these machines) and no .pyc in the venv, each import recompiles torch's sources (~12 s of CPU
# per worker instead of ~5 s). Compiling once at install costs ~20 s; later syncs skip it.
# Say what is installed when something will be (the first time, or after uv.lock changed): a
# cold install downloads ~3 GB and is silent for a minute or more otherwise.
locked() {  # the version uv.lock pins for package $1
    awk -v want="$1" '$1 == "name" { name = $3; gsub(/"/, "", name) }
        $1 == "version" && name == want { v = $3; gsub(/"/, "", v); print v; exit }' uv.lock
}
stamp=.venv/.nvrx-bootstrap
want=$(cat uv.lock pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "bootstrap: installing .venv from uv.lock with $PY312: torch $(locked torch)," \
        "nvidia-resiliency-ext $(locked nvidia-resiliency-ext), megatron-core" \
        "$(locked megatron-core), pytest $(locked pytest) and the dev tools (ruff, mypy," \
        "pytest-xdist), bytecode compiled; ~3 GB to download when uv's cache is cold" >&2
fi
"${UV[@]}" sync --frozen --python "$PY312" --python-platform x86_64-manylinux_2_39 --quiet \
    --compile-bytecode
echo "$want" >"$stamp"
