"""The trainer: verl's PPO step with generation ``staleness`` batches ahead (``ray_trainer``), the rollout
pipeline behind the train-dataloader seam (``pipeline``), the checks of every step (``checks``), bounded
waits (``deadlines``), resume verification (``resume``) and the Ray task runner (``task_runner``).

It drives the weight-sync engines and rollout replicas through verl's managers only: it imports no backend.
"""
