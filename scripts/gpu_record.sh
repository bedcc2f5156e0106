#!/usr/bin/env bash
# Record full-profile experiments on a GPU machine, also one without internet: wheels for
# packages the machine lacks travel in .whl/ (docs/RECORDING.md says how to make it). Each
# experiment is resumable per cell; results are packed after every experiment so that a run
# stopped at its time limit still returns what it finished.
#
#   usage: scripts/gpu_record.sh [--note TEXT] [--no-autotune-pack] SECONDS ITEM ...
#   ITEM is EXPERIMENT[:ARGS] (`repro record EXPERIMENT --profile full ARGS`, ARGS comma-separated)
#   or a quoted "COMMAND ARGS..." containing a space (`repro COMMAND ARGS...`), e.g.
#          scripts/gpu_record.sh 540 mlp_step \
#            "record rl_throughput --profile full --recipe bf16,fp8-delayed --only mlp_w4096_*" \
#            "trace ppo --width 4096 --recipes bf16,fp8-delayed"
#   A command item is split on spaces, without globbing and without quote removal (write
#   --only mlp_w4096_*, not quoted). Every item gets what is left of SECONDS (stopped with
#   SIGINT, killed 20 s later if it ignores it); a `record` item also gets a --time-budget
#   ending 30 s before that (unless it sets its own), so a study that checkpoints stops
#   cleanly. results/ is packed after each item. --note TEXT goes into every record as
#   `run_note` (what else ran on the machine); --no-autotune-pack leaves the XLA autotune
#   cache out of $OUT (scripts/gpu_record_pair.sh packs it once for both jobs).
set -uo pipefail
note=""; pack_autotune=1
while [ $# -gt 0 ]; do
  case "$1" in
    --note) note=${2:?--note needs a text}; shift 2 ;;
    --no-autotune-pack) pack_autotune=0; shift ;;
    *) break ;;
  esac
done
budget=${1:?seconds}; shift
# The GPU machine's copy of the tree may carry a stale .git: records must name the commit run.
: "${REPRO_GIT_COMMIT:?set REPRO_GIT_COMMIT to the commit being run (git rev-parse HEAD, here)}"
start=$(date +%s)
out=${OUT:-build/gpu_out}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  # Under a lock and once per machine: two of these scripts may start together, one per GPU
  # (scripts/gpu_record_pair.sh).
  (
    command -v flock >/dev/null && flock 9
    [ -e /tmp/site/.repro_wheels_done ] || {
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && touch /tmp/site/.repro_wheels_done; }
  ) 9>/tmp/repro_wheels.lock || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee "$out/gpu.txt"
nvidia-smi topo -m 2>&1 | tee -a "$out/gpu.txt"  # how the GPUs are linked (multi-GPU machines)
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} note=$note" | tee -a "$out/gpu.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee -a "$out/gpu.txt"
# Every rounding the experiments rely on must happen on this device (XLA's GPU compiler folds
# plain cast round trips; repro.precision.formats.cast does not rely on them): refuse to record otherwise.
if ! python3 -m repro.cli check 2>&1 | tee -a "$out/gpu.txt"; then
  echo "== numerics check failed: nothing recorded"; exit 1
fi
# Compile caches (compile time, not run time, bounds a call: an FP8 step autotunes every GEMM
# for 40-200 s). XLA's per-fusion autotune results go to build/xla_autotune/<jax>-<gpu>/ (the
# cache has no version check of its own) and come back as $out/autotune.tgz: unpack it here
# and carry build/xla_autotune next time. JAX's executable cache stays on the machine (it is
# kept between calls while the machine is warm): seeds of one variant compile once.
tag=$(python3 -c "import jax; d=jax.devices()[0]; print(f'{jax.__version__}-{d.device_kind}'.replace(' ', '_'))" 2>/dev/null || echo unknown)
mkdir -p "build/xla_autotune/$tag" build/jax_cache
xla_flags_before=${XLA_FLAGS:-}
export XLA_FLAGS="$xla_flags_before --xla_gpu_per_fusion_autotune_cache_dir=$PWD/build/xla_autotune/$tag"
if ! python3 -c "import jax; jax.devices()" >/dev/null 2>&1; then  # an XLA without the flag
  echo "== no XLA autotune cache: this XLA rejects the flag"; export XLA_FLAGS="$xla_flags_before"
fi
export JAX_COMPILATION_CACHE_DIR=$PWD/build/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=2
for exp in "$@"; do
  left=$(( budget - ($(date +%s) - start) - 15 ))
  if [ "$left" -le 20 ]; then echo "== skip $exp: budget spent"; continue; fi
  echo "== $exp (<= ${left}s)"
  if [[ "$exp" == *" "* ]]; then
    set -f; cmd=($exp); set +f
  else
    name=${exp%%:*}; args=${exp#"$name"}; args=${args#:}
    set -f; cmd=(record "$name" --profile full ${args//,/ }); set +f
  fi
  extra=()
  if [ "${cmd[0]}" = record ] && [[ " ${cmd[*]} " != *" --time-budget "* ]]; then
    extra+=(--time-budget $(( left - 30 )))
  fi
  if [ -n "$note" ] && { [ "${cmd[0]}" = record ] || [ "${cmd[0]}" = trace ]; }; then
    extra+=(--note "$note")
  fi
  timeout -k 20 --signal=INT "$left" python3 -m repro.cli "${cmd[@]}" "${extra[@]}" 2>&1 | tee -a "$out/log.txt"
  tar czf "$out/results.tgz" results/
  [ "$pack_autotune" = 1 ] && tar czf "$out/autotune.tgz" build/xla_autotune/
done
echo "== done in $(( $(date +%s) - start ))s"
