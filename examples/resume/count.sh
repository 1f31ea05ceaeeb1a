#!/usr/bin/env bash
# Counts to 60, saving the step after each one. On the local stack CHECKPOINT_GCS_DIR is
# gs://BUCKET/jobs/JOB/checkpoints/ and the local object store keeps buckets under
# $TPU_RUNNER_OBJECTS; on GCP use gsutil or your framework's checkpointing instead.
set -euo pipefail
dir="${TPU_RUNNER_OBJECTS:?}/${CHECKPOINT_GCS_DIR#gs://}"
mkdir -p "$dir"
step=$(cat "$dir/step" 2>/dev/null || echo 0)
echo "starting at step $step on $TPU_WORKER_HOST (attempt $ATTEMPT_ID)"
while [ "$step" -lt 60 ]; do
  sleep 1
  step=$((step + 1))
  echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"
  echo "step $step"
done
echo "done"
