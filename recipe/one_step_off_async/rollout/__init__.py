"""Rollout backends registered with verl's ``RolloutReplicaRegistry``; ``hf`` (HF transformers, CPU) is the
recipe's own. vLLM, SGLang and TensorRT-LLM are verl's."""
