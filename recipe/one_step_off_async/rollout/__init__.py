"""The rollout client of partial rollout. No engine of the recipe's own: vLLM (its CPU build on CPU), SGLang and
TensorRT-LLM are verl's replicas."""
