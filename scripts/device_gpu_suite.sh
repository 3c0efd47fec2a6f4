#!/usr/bin/env bash
# Runs ON the GPU device machine, from the repo root (see docs/device.md):
#
#   scripts/device_gpu_suite.sh --smoke          validate the carried environment
#   scripts/device_gpu_suite.sh --cli-runs [--common 'ARGS'] 'RUN ARGS' ...
#                                                 our CLI (`python -m pytest_nvrx run`), one run
#                                                 per RUN ARGS, one after another
#   scripts/device_gpu_suite.sh --nodes N [PYTEST ARGS]
#                                                 N pytest sessions at once, one per by-hand
#                                                 "node" of one run: CUDA_VISIBLE_DEVICES=i,
#                                                 --nvrx-node-index i, one NVRX_RUN_ID, a
#                                                 rendezvous on localhost, --nvrx-nnodes N
#   scripts/device_gpu_suite.sh --selftest [SELFTEST ARGS]
#                                                 the Megatron self-test (docs/selftest.md)
#   scripts/device_gpu_suite.sh --exec CMD ...  any command (a benchmark) in that environment
#   scripts/device_gpu_suite.sh [PYTEST ARGS]    run pytest with our plugin
#
# Needs .whl/ and .megatron/ from scripts/prepare_device.sh, carried with the tree
# (run tool: carry [".whl", ".megatron"]). The device has no network: the wheels go into
# $SITE with `pip install --no-index --target`, and our package is used from the tree
# (PYTHONPATH), so its pytest11 entry point is not registered: pytest gets -p pytest_nvrx.plugin.
#
# Everything that comes back is written to $OUT (the run tool's folder; a temp dir elsewhere):
#   smoke:  smoke.log, stack.json
#   pytest: pytest.log, junit.xml, runs.tar.gz (run dirs without checkpoint shards)
#   nodes:  pytest.node<i>.log, junit.node<i>.xml, runs.tar.gz
#   cli-runs: cli-runs.log, cli-runs.tsv (run, exit status, seconds), runs.tar.gz
#   selftest: selftest.log, selftest.json, runs.tar.gz
# The device tool returns at most 8 files, 2 folders deep, 16 MiB each.
#
# Environment: NVRX_DEVICE_LIMIT_S (default 600: the run tool's limit for one command; pytest
# is interrupted with SIGINT early enough to pack the results; a CLI run that would not get
# NVRX_CLI_MIN_S (default 150) seconds before that point is skipped), NVRX_WORK_DIR (default
# /tmp/nvrx-work), MEGATRON_PATH (default .megatron), PYTHON (default python3), SITE.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
PY="${PYTHON:-python3}"
SITE="${SITE:-/tmp/site}"
LIMIT_S="${NVRX_DEVICE_LIMIT_S:-600}"
PACK_RESERVE_S=45
if [[ -z "${OUT:-}" ]]; then
    OUT="$(mktemp -d "${TMPDIR:-/tmp}/nvrx-device-out.XXXXXX")"
    echo "device_gpu_suite: OUT not set; results go to $OUT"
fi
mkdir -p "$OUT"
export OUT
export PYTHONUNBUFFERED=1
# Keep NVLink multicast off (the device's rule; set there already, kept for any child env).
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
export NVRX_WORK_DIR="${NVRX_WORK_DIR:-/tmp/nvrx-work}"
# The Megatron export travels packed (.megatron.tgz, see prepare_device.sh); unpacked here into
# a fresh .megatron/, with nothing built, as a user's freshly extracted checkout is.
if [[ -z "${MEGATRON_PATH:-}" && -f "$REPO/.megatron.tgz" && ! -e "$REPO/.megatron" ]]; then
    mkdir "$REPO/.megatron.unpack.$$" && tar -xzf "$REPO/.megatron.tgz" -C "$REPO/.megatron.unpack.$$" \
        && mv "$REPO/.megatron.unpack.$$" "$REPO/.megatron" \
        || { echo "device_gpu_suite: cannot unpack .megatron.tgz" >&2; exit 2; }
    echo "device_gpu_suite: unpacked .megatron.tgz into a fresh .megatron/"
fi
if [[ -z "${MEGATRON_PATH:-}" && -f "$REPO/.megatron/pretrain_gpt.py" ]]; then
    export MEGATRON_PATH="$REPO/.megatron"
fi
BASETEMP="${NVRX_DEVICE_BASETEMP:-/tmp/nvrx-pytest}"

die() { echo "device_gpu_suite: $*" >&2; exit 2; }

install_wheels() {
    compgen -G ".whl/*.whl" >/dev/null \
        || die "no .whl/*.whl here: run scripts/prepare_device.sh and carry .whl"
    local t0=$SECONDS
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        || die "pip install of the carried wheels into $SITE failed"
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    # pip --target writes console scripts to $SITE/bin; if not, a shim with the same target
    # as NVRx's entry_points.txt (ft_launcher = nvidia_resiliency_ext.fault_tolerance.launcher:main).
    if [[ ! -x "$SITE/bin/ft_launcher" ]]; then
        mkdir -p "$SITE/bin"
        printf '#!%s\nimport sys\nfrom nvidia_resiliency_ext.fault_tolerance.launcher import main\nsys.exit(main())\n' \
            "$(command -v "$PY")" >"$SITE/bin/ft_launcher"
        chmod +x "$SITE/bin/ft_launcher"
        echo "device_gpu_suite: created the ft_launcher shim in $SITE/bin"
    fi
    echo "device_gpu_suite: wheels installed into $SITE in $((SECONDS - t0)) s;" \
        "ft_launcher = $(command -v ft_launcher)"
}

print_stack() {
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'PYEOF'
import importlib.metadata as md, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "nvidia-resiliency-ext", "protobuf", "grpcio", "defusedxml", "pydantic",
             "pytest", "pytest-timeout", "numpy", "typing-extensions", "transformer-engine",
             "apex", "megatron-core"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} -")
PYEOF
}

# Each smoke check runs in its own process (timeout 300 s) and prints PASS/FAIL with the tail
# of its output; the exit status says whether all passed. stack.json gets the detected stack
# and the probed Megatron flags.
smoke() {
    print_stack
    "$PY" - <<'PYEOF'
import os, subprocess, sys

PY, MP = sys.executable, os.environ.get("MEGATRON_PATH")
CHECKS = [
    ("torch + CUDA", [PY, "-c", """
import torch
print(torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))
assert float(torch.ones(1024, device="cuda").sum()) == 1024.0
"""], None),
    ("NVRx and its gRPC/protobuf path", [PY, "-c", """
import google.protobuf, grpc, defusedxml
import nvidia_resiliency_ext.fault_tolerance.launcher
import nvidia_resiliency_ext.fault_tolerance.per_cycle_logs
import nvidia_resiliency_ext.fault_tolerance.cycle_info_writer
import nvidia_resiliency_ext.shared_utils.grpc_log_server
print("protobuf", google.protobuf.__version__, "grpc", grpc.__version__)
"""], None),
    ("ft_launcher --help", ["bash", "-c", "set -o pipefail; ft_launcher --help | head -n 5"], None),
]
if MP:
    CHECKS += [
        (f"megatron imported from {MP}", [PY, "-c", f"""
import megatron.core, megatron.core.package_info as p
assert megatron.core.__file__.startswith({MP!r}), megatron.core.__file__
print(p.__version__, megatron.core.__file__)
import megatron.training.arguments
"""], MP),
        # Not `pretrain_gpt.py --help`: core_v0.19.0's help crashes on a '%' in a field
        # docstring (transformer_config.py:1274). Build the real parser instead, after importing
        # pretrain_gpt (its import chain is what the workers need), and compare it with what
        # pytest_nvrx.megatron_source reads from the source.
        ("real parser == pytest_nvrx.megatron_source's probe", [PY, "-c", f"""
import argparse, sys
sys.argv = ["pretrain_gpt.py"]
import pretrain_gpt
from megatron.training.arguments import add_megatron_arguments
from pathlib import Path
from pytest_nvrx.megatron_source import PROBED_OPTIONS, probe_megatron_flags
parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False, add_help=False))
real = parser._option_string_actions
flags = probe_megatron_flags(Path({MP!r}))
print(len(real), "options in the parser,", len(flags.args), "read from source")
print("only in parser:", sorted(set(real) - set(flags.args)))
print("only in source:", sorted(set(flags.args) - set(real)))
bad = [o for o in PROBED_OPTIONS if (o in real) != flags.has(o)
       or (o in real and real[o].default != flags.get(o).default)]
for o in PROBED_OPTIONS:
    print(" ", o, "absent" if o not in real else (real[o].default, real[o].choices))
assert not bad, f"source probe differs from the parser for {{bad}}"
"""], MP),
    ]
CHECKS.append(("pytest_nvrx.stack", [PY, "-c", """
import json, os, sys
from pathlib import Path
from pytest_nvrx.megatron_source import probe_megatron_flags, probe_validation_env
from pytest_nvrx.recipe import no_te_profile_args
from pytest_nvrx.stack import detect_stack, format_stack_line, no_te_profile_applies
mp = os.environ.get("MEGATRON_PATH")
stack = detect_stack(Path(mp) if mp else None)
print(format_stack_line(stack))
out = {"stack": stack.as_dict()}
if mp:
    flags = probe_megatron_flags(Path(mp))
    out["flags"] = flags.report()
    out["no_te_profile"] = list(no_te_profile_args(flags)) if no_te_profile_applies(stack) else []
    print("no-TE profile:", out["no_te_profile"],
          "| --eval-interval required:", flags.eval_interval_required)
    out["validation_env"] = [c.as_dict() for c in probe_validation_env(Path(mp)).checks]
    for check in out["validation_env"]:
        print("validation env:", check["where"], check["name"], check["relation"],
              check["value"], "when", check["condition"])
Path(os.environ["OUT"], "stack.json").write_text(json.dumps(out, indent=1))
sys.exit(0 if stack.probed else 1)
"""], None))

failed = []
for name, cmd, cwd in CHECKS:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", "", str(exc)
    print(("PASS " if rc == 0 else f"FAIL (exit {rc}) ") + name, flush=True)
    lines = out.strip().splitlines()[-25:]
    if rc != 0:  # stderr holds the traceback; on success only library warnings
        lines += err.strip().splitlines()[-20:]
    for line in lines:
        print("    " + line)
    if rc != 0:
        failed.append(name)
if not MP:
    failed.append("megatron: no .megatron/ (prepare_device.sh --megatron-git DIR; carry .megatron)")
print("smoke: " + (f"FAILED: {failed}" if failed else "all checks passed"))
sys.exit(1 if failed else 0)
PYEOF
}

# Collect the run directories (those holding run.json or cycle_infos/) into $OUT/runs.tar.gz:
# logs, cycle infos, marker, manifest, tracker and small checkpoint metadata; no shards.
pack_runs() {
    "$PY" - "$OUT/runs.tar.gz" "$NVRX_WORK_DIR" "$BASETEMP" <<'PYEOF'
import io, os, re, sys, tarfile
from pathlib import Path

dest, roots = Path(sys.argv[1]), [Path(r) for r in sys.argv[2:]]
MAX_FILE = 4 << 20          # larger logs keep their last 4 MiB (as NAME.tail)
MAX_TOTAL = 14 << 20        # the device tool returns files up to 16 MiB
KEEP_TOP = {"fault_injected.json", "run.json", "result.json"}
LATER_MARKER = re.compile(r"fault_injected_[0-9]+\.json")  # pytest_nvrx.layout.marker_name
KEEP_DIRS = {"logs", "cycle_infos", "plant-records"}
CKPT_FILES = {"latest_checkpointed_iteration.txt", "metadata.json", ".metadata", "ft_state.json"}

run_dirs = {}  # run dir -> its name in the archive: <root name>/<path under root>
for root in roots:
    if root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root):
            if "run.json" in filenames or "cycle_infos" in dirnames:
                run = Path(dirpath)
                run_dirs[run] = Path(root.name, run.relative_to(root))
                dirnames[:] = []

def wanted(run, path):
    rel = path.relative_to(run)
    if len(rel.parts) == 1:
        return (
            rel.name in KEEP_TOP
            or LATER_MARKER.fullmatch(rel.name) is not None  # a fault schedule's later markers
            or (rel.name.startswith(("run.node", "result.node")) and rel.name.endswith(".json"))
        )
    if rel.parts[0] in KEEP_DIRS:
        return True
    return rel.parts[0] == "checkpoints" and rel.name in CKPT_FILES

total = 0
with tarfile.open(dest, "w:gz") as tar:
    for run, arc_root in sorted(run_dirs.items()):
        for path in sorted(p for p in run.rglob("*") if p.is_file() and not p.is_symlink()):
            if not wanted(run, path):
                continue
            data = path.read_bytes()
            name = arc_root / path.relative_to(run)
            if len(data) > MAX_FILE:
                data, name = data[-MAX_FILE:], name.with_name(name.name + ".tail")
            if total + len(data) > MAX_TOTAL:
                print(f"pack_runs: size limit reached, left out {path}", file=sys.stderr)
                continue
            info = tarfile.TarInfo(str(name))
            info.size, info.mtime, info.mode = len(data), int(path.stat().st_mtime), 0o644
            tar.addfile(info, io.BytesIO(data))
            total += len(data)
        for link in run.glob("cycle_infos/*"):
            if link.is_symlink():  # the .current link, as a link
                info = tarfile.TarInfo(str(arc_root / link.relative_to(run)))
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(link)
                tar.addfile(info)
print(f"pack_runs: {len(run_dirs)} run dir(s), {total / 2**20:.1f} MiB -> {dest}")
PYEOF
}

plugin_args() {
    # Our entry point is registered only where the package is installed (not on the device);
    # -p on top of a registered entry point would register the plugin twice.
    if ! "$PY" -c 'import importlib.metadata as m, sys
sys.exit(0 if any(e.value.startswith("pytest_nvrx") for e in m.entry_points(group="pytest11")) else 1)'; then
        echo "-p pytest_nvrx.plugin"
    fi
}

# --nodes N: N sessions of one multinode run on this host, node i on GPU i; each session judges
# the combined run dir after its own launcher ends.
run_pytest_nodes() {
    local n=$1 budget i port rc=0 pids=() plugin
    shift
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--nodes needs a positive count, got $n"
    read -r -a plugin <<<"$(plugin_args)"
    budget=$((LIMIT_S - SECONDS - PACK_RESERVE_S))
    ((budget > 30)) || die "only ${budget}s left for pytest (NVRX_DEVICE_LIMIT_S=$LIMIT_S)"
    port=$("$PY" -m pytest_nvrx.launch.ports)  # free on every address, outside the ephemeral range
    export NVRX_RUN_ID="${NVRX_RUN_ID:-nodes$$}"
    mkdir -p "$NVRX_WORK_DIR"
    echo "device_gpu_suite: $n node sessions, run ID $NVRX_RUN_ID, rendezvous localhost:$port,"         "budget ${budget}s"
    for ((i = 0; i < n; i++)); do
        CUDA_VISIBLE_DEVICES=$i timeout -s INT -k 20 "$budget" "$PY" -m pytest "${plugin[@]}"             -p no:cacheprovider --basetemp="$BASETEMP.node$i"             --junitxml="$OUT/junit.node$i.xml" -o junit_logging=system-out             --nvrx-nnodes="$n" --nvrx-node-index="$i"             --nvrx-rdzv-endpoint="localhost:$port" --nvrx-work-dir="$NVRX_WORK_DIR"             "$@" >"$OUT/pytest.node$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || rc=$?
        echo "device_gpu_suite: node $i session exit ${rc}"
        tail -n 15 "$OUT/pytest.node$i.log"
    done
    pack_runs || echo "device_gpu_suite: packing the run dirs failed" >&2
    return "$rc"
}

run_pytest() {
    local plugin=() budget rc
    # Our entry point is registered only where the package is installed (not on the device);
    # -p on top of a registered entry point would register the plugin twice.
    if ! "$PY" -c 'import importlib.metadata as m, sys
sys.exit(0 if any(e.value.startswith("pytest_nvrx") for e in m.entry_points(group="pytest11")) else 1)'; then
        plugin=(-p pytest_nvrx.plugin)
    fi
    budget=$((LIMIT_S - SECONDS - PACK_RESERVE_S))
    ((budget > 30)) || die "only ${budget}s left for pytest (NVRX_DEVICE_LIMIT_S=$LIMIT_S)"
    echo "device_gpu_suite: pytest budget ${budget}s; MEGATRON_PATH=${MEGATRON_PATH:-unset}" \
        "NVRX_WORK_DIR=$NVRX_WORK_DIR basetemp=$BASETEMP"
    mkdir -p "$NVRX_WORK_DIR"
    # SIGINT first: pytest stops like on Ctrl-C, so the plugin tears its runs down and the
    # junit file is still written; SIGKILL 20 s later if that hangs.
    timeout -s INT -k 20 "$budget" "$PY" -m pytest "${plugin[@]}" -p no:cacheprovider \
        --basetemp="$BASETEMP" --junitxml="$OUT/junit.xml" -o junit_logging=system-out \
        "$@" 2>&1 | tee "$OUT/pytest.log"
    rc=${PIPESTATUS[0]}
    ((rc == 124)) && echo "device_gpu_suite: pytest interrupted after ${budget}s (rc 124)"
    pack_runs || echo "device_gpu_suite: packing the run dirs failed" >&2
    return "$rc"
}

# --cli-runs: `python -m pytest_nvrx run --work-dir $NVRX_WORK_DIR --timeout T COMMON RUN` for
# each RUN argument, one after another (NVRX_CLI_PARALLEL=N: up to N at once; every run of a
# 2-GPU batch then shares both GPUs, which separate NCCL communicators allow). COMMON and RUN are shell-quoted option strings (split as
# the shell would, quotes honoured); Megatron extras go after `--` in RUN, so COMMON holds none.
# T is what is left before the packing reserve; a run with less than NVRX_CLI_MIN_S left is not
# started (`skipped` in cli-runs.tsv). Each run's CLI output goes to cli-runs.log; its run
# directory ($NVRX_WORK_DIR/runs/<run id>) is packed into runs.tar.gz at the end.
run_cli() {
    local -a common=() args=() envs=()
    local spec left k=0 worst=0 min_s="${NVRX_CLI_MIN_S:-150}" par="${NVRX_CLI_PARALLEL:-1}"
    if [[ "${1:-}" == "--common" ]]; then
        eval "common=(${2:?--common needs an option string})"
        shift 2
    fi
    (($#)) || die "--cli-runs needs at least one run's options"
    [[ "$par" =~ ^[1-9][0-9]*$ ]] || die "NVRX_CLI_PARALLEL must be a positive integer: $par"
    mkdir -p "$NVRX_WORK_DIR"
    printf 'run\texit\tseconds\n' >"$OUT/cli-runs.tsv"
    for spec in "$@"; do
        eval "args=($spec)"
        # leading NAME=value words of a run's options go to that run's environment (e.g.
        # CUDA_VISIBLE_DEVICES=1 for the second of several "nodes" on one host)
        envs=()
        while ((${#args[@]})) && [[ "${args[0]}" =~ ^[A-Z_][A-Z0-9_]*= ]]; do
            envs+=("${args[0]}")
            args=("${args[@]:1}")
        done
        # at most $par runs at once: wait for one to end before starting the next
        while (($(jobs -rp | wc -l) >= par)); do wait -n || worst=1; done
        left=$((LIMIT_S - SECONDS - PACK_RESERVE_S))
        if ((left < min_s)); then
            echo "device_gpu_suite: skipped (${left}s left, NVRX_CLI_MIN_S=$min_s): $spec"
            printf '%s\tskipped\t0\n' "$spec" >>"$OUT/cli-runs.tsv"
            worst=1
            continue
        fi
        k=$((k + 1))
        if ((par == 1)); then
            (
                ((${#envs[@]} == 0)) || export "${envs[@]}"
                cli_one "$left" "$spec" "${common[@]}" "${args[@]}"
            ) || worst=1
        else
            # concurrent runs write their own logs (cli-run-K.log), appended at the end
            (
                ((${#envs[@]} == 0)) || export "${envs[@]}"
                cli_one "$left" "$spec" "${common[@]}" "${args[@]}"
            ) >"$OUT/cli-run-$k.log" 2>&1 &
        fi
    done
    while (($(jobs -rp | wc -l) > 0)); do wait -n || worst=1; done
    if ((par > 1)); then
        for ((i = 1; i <= k; i++)); do cat "$OUT/cli-run-$i.log" && rm -f "$OUT/cli-run-$i.log"; done
    fi
    pack_runs || echo "device_gpu_suite: packing the run dirs failed" >&2
    return "$worst"
}

# One CLI run: cli_one LEFT SPEC ARGS...; prints its own ===== lines and appends to cli-runs.tsv.
cli_one() {
    local left="$1" spec="$2" rc t0=$SECONDS
    shift 2
    echo "device_gpu_suite: ===== $(date -u +%FT%TZ) run (timeout ${left}s): $*"
    # The CLI kills its launcher tree at --timeout; SIGINT (Ctrl-C: the same teardown) 10 s
    # later and SIGKILL 20 s after that are the backstops.
    timeout -s INT -k 20 $((left + 10)) "$PY" -m pytest_nvrx run \
        --work-dir "$NVRX_WORK_DIR" --timeout "$left" "$@"
    rc=$?
    echo "device_gpu_suite: ===== exit $rc after $((SECONDS - t0)) s: $spec"
    printf '%s\t%s\t%s\n' "$spec" "$rc" "$((SECONDS - t0))" >>"$OUT/cli-runs.tsv"
    return "$rc"
}

{
    install_wheels
    if [[ "${1:-}" == "--cli-runs" ]]; then
        shift
        print_stack 2>&1 | tee "$OUT/cli-runs.log"
        run_cli "$@" 2>&1 | tee -a "$OUT/cli-runs.log"
        exit "${PIPESTATUS[0]}"
    fi
    if [[ "${1:-}" == "--nodes" ]]; then
        shift
        print_stack
        run_pytest_nodes "$@"
        exit $?
    fi
    if [[ "${1:-}" == "--selftest" ]]; then
        # --selftest ARGS...: the Megatron self-test (python -m pytest_nvrx selftest) on the
        # checkout in MEGATRON_PATH; its JSON in $OUT/selftest.json, its run dirs packed
        shift
        print_stack 2>&1 | tee "$OUT/selftest.log"
        mkdir -p "$NVRX_WORK_DIR"
        timeout -s INT -k 20 $((LIMIT_S - SECONDS - PACK_RESERVE_S)) "$PY" -m pytest_nvrx \
            selftest --workload megatron --megatron-path "$MEGATRON_PATH" \
            --work-dir "$NVRX_WORK_DIR" --json "$OUT/selftest.json" "$@" 2>&1 \
            | tee -a "$OUT/selftest.log"
        rc=${PIPESTATUS[0]}
        pack_runs || echo "device_gpu_suite: packing the run dirs failed" >&2
        exit "$rc"
    fi
    if [[ "${1:-}" == "--exec" ]]; then
        # --exec CMD ARGS...: any command (a benchmark) with the carried wheels installed and
        # this script's environment (PYTHONPATH, PATH with ft_launcher, MEGATRON_PATH, OUT)
        shift
        print_stack 2>&1 | tee "$OUT/exec.log"
        timeout -s INT -k 20 $((LIMIT_S - SECONDS - 10)) "$@" 2>&1 | tee -a "$OUT/exec.log"
        exit "${PIPESTATUS[0]}"
    fi
    if [[ "${1:-}" == "--smoke" ]]; then
        smoke 2>&1 | tee "$OUT/smoke.log"
        exit "${PIPESTATUS[0]}"
    fi
    print_stack
    run_pytest "$@"
    exit $?
}
