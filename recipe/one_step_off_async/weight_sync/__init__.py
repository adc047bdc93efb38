"""Weight-sync backends registered with verl's ``CheckpointEngineRegistry``: ``gloo`` (a broadcast group on
CPU), ``checkpoint`` (safetensors through a shared folder, ``files``), and what the engines share
(``common``). Selected by ``actor_rollout_ref.rollout.checkpoint_engine.backend``; the backends never import
each other.
"""
