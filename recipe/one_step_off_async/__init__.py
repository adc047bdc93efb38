"""One-step-off (k-step-off) asynchronous PPO/GRPO for verl 0.9.1.

The FSDP2 actor and the rollout replicas live on disjoint resource pools; generation of the
next batches overlaps training of the current one, and weights flow actor -> rollout through
verl's checkpoint-engine manager after every step. See docs/advance/one_step_off_async.md.
"""
