import os

print(f"hello from {os.environ['TPU_WORKER_HOST']} ({os.environ['TPU_TYPE']} in "
      f"{os.environ['TPU_ZONE']}): job {os.environ['JOB_ID']}, attempt {os.environ['ATTEMPT_ID']}",
      flush=True)
