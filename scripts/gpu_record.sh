#!/usr/bin/env bash
# Record full-profile experiments on a GPU machine without internet, the way we do on the
# lent H200: wheels for packages the image lacks travel in .whl/ (see README, "Recording on a
# new GPU"). Each experiment is resumable per cell; results are packed after every experiment
# so that a run stopped at its time limit still returns what it finished.
#
#   usage: scripts/gpu_record.sh SECONDS ITEM ...
#   ITEM is EXPERIMENT[:ARGS] (`repro record EXPERIMENT --profile full ARGS`, ARGS comma-separated)
#   or a quoted "MODULE ARGS..." containing a space (`python3 -m MODULE ARGS...`), e.g.
#          scripts/gpu_record.sh 540 mlp_step \
#            "repro.studies.rl_throughput throughput --profile full --recipe bf16,fp8-delayed --only mlp_w4096_*"
#   A module item is split on spaces, without globbing and without quote removal (write
#   --only mlp_w4096_*, not quoted). Every item gets what is left of SECONDS (stopped with
#   SIGINT, killed 20 s later if it ignores it), and results/ is packed after each item.
set -uo pipefail
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
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} REPRO_RUN_NOTE=${REPRO_RUN_NOTE:-}" | tee -a "$out/gpu.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee -a "$out/gpu.txt"
# Every rounding the experiments rely on must happen on this device (XLA's GPU compiler folds
# plain cast round trips; repro.precision.formats.cast does not rely on them): refuse to record otherwise.
if ! python3 -m repro.precision.check 2>&1 | tee -a "$out/gpu.txt"; then
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
user_budget=${REPRO_TIME_BUDGET_S:-}; user_budget=${user_budget%.*}  # the caller's, if any
for exp in "$@"; do
  left=$(( budget - ($(date +%s) - start) - 15 ))
  if [ "$left" -le 20 ]; then echo "== skip $exp: budget spent"; continue; fi
  echo "== $exp (<= ${left}s)"
  # Studies that checkpoint (repro.studies.lm_quality) stop cleanly at REPRO_TIME_BUDGET_S: give
  # each item a budget that ends 30 s before its timeout (or the caller's, if smaller).
  item_budget=$(( left - 30 ))
  if [ -n "$user_budget" ] && [ "$user_budget" -lt "$item_budget" ]; then item_budget=$user_budget; fi
  export REPRO_TIME_BUDGET_S=$item_budget
  if [[ "$exp" == *" "* ]]; then
    set -f; timeout -k 20 --signal=INT "$left" python3 -m $exp 2>&1 | tee -a "$out/log.txt"; set +f
  else
    name=${exp%%:*}; args=${exp#"$name"}; args=${args#:}
    timeout -k 20 --signal=INT "$left" python3 -m repro.cli record "$name" --profile full ${args//,/ } 2>&1 | tee -a "$out/log.txt"
  fi
  tar czf "$out/results.tgz" results/
  [ "${REPRO_PACK_AUTOTUNE:-1}" = 1 ] && tar czf "$out/autotune.tgz" build/xla_autotune/
done
echo "== done in $(( $(date +%s) - start ))s"
