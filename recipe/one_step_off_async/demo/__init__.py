"""The built-in tiny task of the one-step-off recipe, generated offline from a seed.

``assets.ensure_assets()`` builds (once, into a cache) a character-level ChatML tokenizer
(``tokenizer.py``), a tiny Qwen2 (``model.py``) warm-started by SFT (``warm_start.py``), and the
letter-sorting task's train/val parquet files (``task.py``); ``reward.py`` is the task's rule-based
reward for ``reward.custom_reward_function``; ``evaluate.py`` measures a model's val accuracy.
"""
