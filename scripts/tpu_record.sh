#!/usr/bin/env bash
# Record full-profile experiments on a Google TPU VM (a TPU v5e image: its own Python 3.11 and
# JAX with libtpu, a package index on its disk, no internet), in one command: install what the
# studies need beside the image's JAX, check the numerics on the chip, then run the items under
# one deadline, packing results/ after each item so that a run cut at its limit keeps every
# finished cell. scripts/gpu_record.sh does the same on an H200.
#
#   usage: scripts/tpu_record.sh [--dry-run] [--note TEXT] SECONDS [ITEM ...]
#   ITEM is EXPERIMENT[:ARGS] (`repro record EXPERIMENT --profile full ARGS`, ARGS
#   comma-separated), a quoted "COMMAND ARGS..." containing a space (`repro COMMAND ...`,
#   split on spaces without globbing or quote removal), or a quoted "scripts/NAME.py ARGS..."
#   (`python3 scripts/NAME.py ARGS...`, a probe: its files go to $OUT), e.g.
#          scripts/tpu_record.sh 540 \
#            "record rl_throughput --profile full --recipe int8,fp32 --only mlp_w4096_e2048_paired_*"
#
# Install (once per machine, before anything else): requirements-tpu.lock lists what the
# records were made with. Its packages that the image already has at the locked version (jax,
# jaxlib, libtpu, numpy, scipy...) are used as they are; the others are installed with
# `pip --target /tmp/site --no-deps` at their locked versions, from a wheel carried in
# .whl-tpu/ (git-ignored; docs/RECORDING.md says how to make it) where there is one, else from
# the image's package index (/opt/pypi/simple). A package that is neither is named in one
# line and nothing runs. /tmp/site goes at the END of PYTHONPATH, so the image's JAX is the one
# imported. The image's index has no gymnax and no qwix: carry at least gymnax, gymnasium,
# farama-notifications and qwix.
#
# Then: the chip and the versions go to $OUT/tpu.txt, `repro check` must pass (else nothing is
# recorded), and JAX's compilation cache is kept in build/jax_cache/ (the seeds and repeats of
# one program compile once; packed as $OUT/jax_cache.tgz: unpack it in the checkout and carry
# build/jax_cache next time to skip those compiles). Every item gets what is left of SECONDS
# (stopped with SIGINT, killed 20 s later if it ignores it); a `record` item also gets a
# --time-budget ending 30 s before that (unless it sets its own). A command that could not
# open the chip because the previous program had not yet let go of it is run once more, 5 s
# later. $OUT (default build/tpu_out) holds tpu.txt, log.txt, results.tgz and jax_cache.tgz.
#
# --dry-run: print the install plan, the checks and every item's command line with its time
# limit, and run nothing (no pip, no JAX).
set -uo pipefail
dry=0; note=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --note) note=${2:?--note needs a text}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "tpu_record.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
budget=${1:-}
case "$budget" in
  ''|*[!0-9]*) echo "usage: scripts/tpu_record.sh [--dry-run] [--note TEXT] SECONDS [ITEM ...]" \
                    "(SECONDS: a whole number, got '${budget}')" >&2; exit 2 ;;
esac
shift
# The machine's copy of the tree may carry a stale .git: records must name the commit run.
if [ -z "${REPRO_GIT_COMMIT:-}" ]; then
  echo "tpu_record.sh: set REPRO_GIT_COMMIT to the commit being run (git rev-parse HEAD, here)" >&2
  exit 2
fi
start=$(date +%s)
out=${OUT:-build/tpu_out}
site=${REPRO_TPU_SITE:-/tmp/site}
index=${REPRO_TPU_INDEX:-/opt/pypi/simple}
wheels=${REPRO_TPU_WHEELS:-.whl-tpu}
lock=${REPRO_TPU_LOCK:-requirements-tpu.lock}
say() { echo "== $*"; }
run() {  # run a command, or in a dry run print it
  if [ "$dry" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
[ "$dry" = 1 ] || mkdir -p "$out"

# ---------------------------------------------------------------------------- install
# One line per locked package that is not in the image at its version:
# "wheel PATH", "index NAME==VERSION" or "missing NAME==VERSION".
plan=$(python3 - "$lock" "$wheels" "$index" <<'PY'
import pathlib, re, sys
from importlib import metadata

lock, wheels, index = sys.argv[1:4]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
carried = {}
for w in sorted(pathlib.Path(wheels).glob("*.whl")):
    carried.setdefault(norm(w.name.split("-")[0]), str(w))
for line in pathlib.Path(lock).read_text().splitlines():
    line = line.split("#")[0].strip()
    if "==" not in line:
        continue
    name, version = (p.strip() for p in line.split("==", 1))
    try:
        if metadata.version(name) == version:
            continue  # the image's own (jax, jaxlib, libtpu, numpy...)
    except metadata.PackageNotFoundError:
        pass
    d = pathlib.Path(index) / norm(name)
    # the index's files of this package (or its index.html): the locked version must be there
    names = " ".join([p.name for p in d.iterdir()] + [
        p.read_text(errors="replace") for p in d.glob("*.htm*")]) if d.is_dir() else ""
    if norm(name) in carried:
        print("wheel", carried[norm(name)])
    elif re.search(rf"-{re.escape(version)}(-|\.tar|\.zip)", names):
        print("index", f"{name}=={version}")
    else:
        print("missing", f"{name}=={version}")
PY
) || { echo "tpu_record.sh: could not read $lock" >&2; exit 1; }
missing=$(awk '$1 == "missing" {print $2}' <<<"$plan" | tr '\n' ' ')
from_index=$(awk '$1 == "index" {print $2}' <<<"$plan" | tr '\n' ' ')
from_wheels=$(awk '$1 == "wheel" {print $2}' <<<"$plan" | tr '\n' ' ')
say "install into $site: from $wheels/: ${from_wheels:-nothing}; from $index: ${from_index:-nothing}"
if [ -n "$missing" ]; then
  echo "tpu_record.sh: not in the image, its index ($index) or $wheels/: ${missing% }" \
       "(carry their wheels: docs/RECORDING.md, 'On a TPU')" >&2
  exit 1
fi
if [ "$dry" = 1 ] || [ ! -e "$site/.repro_tpu_done" ]; then
  if [ -n "$from_index" ]; then
    # shellcheck disable=SC2086  # one word per package
    run env PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --no-deps \
      --only-binary=:all: --upgrade --index-url "file://$index" --target "$site" $from_index \
      || { echo "tpu_record.sh: pip could not install from $index" >&2; exit 1; }
  fi
  if [ -n "$from_wheels" ]; then
    # shellcheck disable=SC2086
    run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" $from_wheels \
      || { echo "tpu_record.sh: pip could not install the wheels of $wheels/" >&2; exit 1; }
  fi
  run touch "$site/.repro_tpu_done"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}:$site PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=$PWD/build/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=2
[ "$dry" = 1 ] || mkdir -p build/jax_cache

# ----------------------------------------------------------------- facts and the check
say "PYTHONPATH=$PYTHONPATH JAX_COMPILATION_CACHE_DIR=$JAX_COMPILATION_CACHE_DIR note=$note"
if [ "$dry" = 1 ]; then
  run python3 -m repro.cli hardware
  run python3 -m repro.cli check
else
  python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee "$out/tpu.txt"
  python3 -m repro.cli hardware 2>&1 | tee -a "$out/tpu.txt"
  # Every rounding and INT8 product the experiments rely on must happen on this chip.
  if ! python3 -m repro.cli check 2>&1 | tee -a "$out/tpu.txt"; then
    echo "== numerics check failed: nothing recorded"; exit 1
  fi
fi

# ------------------------------------------------------------------------------ items
pack() {
  run tar czf "$out/results.tgz" results/
  run tar czf "$out/jax_cache.tgz" build/jax_cache/
}
for item in "$@"; do
  left=$(( budget - ($(date +%s) - start) - 15 ))
  if [ "$left" -le 20 ]; then say "skip $item: budget spent"; continue; fi
  runner=(python3 -m repro.cli)
  if [[ "${item%% *}" == *.py ]]; then
    set -f; cmd=($item); set +f
    runner=(python3)
  elif [[ "$item" == *" "* ]]; then
    set -f; cmd=($item); set +f
  else
    name=${item%%:*}; args=${item#"$name"}; args=${args#:}
    set -f; cmd=(record "$name" --profile full ${args//,/ }); set +f
  fi
  extra=()
  if [ "${cmd[0]}" = record ] && [[ " ${cmd[*]} " != *" --time-budget "* ]]; then
    extra+=(--time-budget $(( left - 30 )))
  fi
  if [ -n "$note" ] && { [ "${cmd[0]}" = record ] || [ "${cmd[0]}" = trace ]; }; then
    extra+=(--note "$note")
  fi
  say "$item (<= ${left}s)"
  if [ "$dry" = 1 ]; then
    run timeout -k 20 --signal=INT "$left" "${runner[@]}" "${cmd[@]}" "${extra[@]}"
    pack
    continue
  fi
  for attempt in 1 2; do
    timeout -k 20 --signal=INT "$left" "${runner[@]}" "${cmd[@]}" "${extra[@]}" 2>&1 \
      | tee "$out/item.txt" | tee -a "$out/log.txt"
    status=${PIPESTATUS[0]}
    # the chip still held by the program before: once more, a few seconds later
    if [ "$status" -ne 0 ] && [ "$attempt" = 1 ] && grep -qi "libtpu.*lockfile\|lockfile.*libtpu" "$out/item.txt"; then
      say "the chip was still held: again in 5 s"; sleep 5
      left=$(( budget - ($(date +%s) - start) - 15 ))
      [ "$left" -gt 20 ] && continue
    fi
    break
  done
  pack
done
[ "$dry" = 1 ] || rm -f "$out/item.txt"
say "done in $(( $(date +%s) - start ))s"
