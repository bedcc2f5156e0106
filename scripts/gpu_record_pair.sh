#!/usr/bin/env bash
# Two single-GPU record jobs side by side on a machine with two GPUs: GPU 0 runs the items
# before `--`, GPU 1 the items after it. Each job is scripts/gpu_record.sh with
# CUDA_VISIBLE_DEVICES set, its own output folder ($OUT/gpu0, $OUT/gpu1) and a --note
# (copied into every record as `run_note`) naming what ran beside it. Use it for studies whose
# result is not a speed (RL returns, LM losses): the two jobs share the host's CPUs, so a
# throughput or step time recorded this way is not a clean measurement.
#
#   usage: scripts/gpu_record_pair.sh SECONDS ITEM ... -- ITEM ...
#   ITEMs as for scripts/gpu_record.sh. $OUT/results.tgz holds results/ once both have ended
#   (each job also packs its own after every item, in case the call is cut; those are removed
#   once the joint one exists). $OUT then holds six files: results.tgz, autotune.tgz and each
#   job's gpu.txt and log.txt. To run an item on both GPUs first (e.g. multigpu), call
#   OUT=$OUT/mg scripts/gpu_record.sh before this script and remove $OUT/mg/*.tgz afterwards.
set -uo pipefail
budget=${1:?seconds}; shift
a=(); b=(); side=a
for x in "$@"; do
  if [ "$x" = "--" ]; then side=b; continue; fi
  if [ $side = a ]; then a+=("$x"); else b+=("$x"); fi
done
[ ${#a[@]} -gt 0 ] && [ ${#b[@]} -gt 0 ] || { echo "usage: $0 SECONDS ITEM... -- ITEM..."; exit 2; }
out=${OUT:-build/gpu_out}; mkdir -p "$out/gpu0" "$out/gpu1"
# The autotune cache is shared by both jobs: packed once, below, rather than by each job.
CUDA_VISIBLE_DEVICES=0 OUT=$out/gpu0 bash scripts/gpu_record.sh --no-autotune-pack \
  --note "GPU 0 of 2; beside it on GPU 1: ${b[*]}" "$budget" "${a[@]}" > /tmp/gpu0_stdout.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT=$out/gpu1 bash scripts/gpu_record.sh --no-autotune-pack \
  --note "GPU 1 of 2; beside it on GPU 0: ${a[*]}" "$budget" "${b[@]}" > /tmp/gpu1_stdout.txt 2>&1 &
wait
tar czf "$out/results.tgz" results/
tar czf "$out/autotune.tgz" build/xla_autotune/
# Both jobs' records are in $out/results.tgz now: drop their own packs (kept only in case the
# run is cut before this point), so that $OUT holds one copy of the results.
rm -f "$out/gpu0/results.tgz" "$out/gpu1/results.tgz"
tail -n 25 /tmp/gpu0_stdout.txt /tmp/gpu1_stdout.txt
