"""The demo policy: a tiny Qwen2 causal LM built from a config, never downloaded.

What: ``Qwen2ForCausalLM`` with hidden size 128, 2 layers, 4 query / 2 key-value heads (GQA, as in
Qwen2.5), untied embeddings, fp32; 0.37M parameters over the demo tokenizer's 275 tokens.

Why this size: one CPU core runs a forward+backward of 32 sequences x 40 tokens in about 50 ms, and the model
still learns the sort task in a few hundred SFT steps. Qwen2 is the architecture the GPU recipe trains
(Qwen2.5-3B), so verl takes the same code paths (FSDP wrap policy, Qwen chat boundary handling) on CPU as on GPU.
"""

from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)


def model_config(tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The demo model's config; its vocabulary is exactly the tokenizer's, so no id decodes to nothing."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype=torch.float32,
    )


def init_model(tokenizer: PreTrainedTokenizerBase, seed: int) -> Qwen2ForCausalLM:
    """Randomly initialised model; the same weights for the same seed. Leaves the global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(model_config(tokenizer))


def init_reward_model(tokenizer: PreTrainedTokenizerBase, seed: int) -> Qwen2ForSequenceClassification:
    """The demo architecture with a one-label score head, randomly initialised: a stand-in that shows a model-based
    reward through verl's reward loop (its score is a fixed function of the text, unrelated to the task)."""
    config = model_config(tokenizer)
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForSequenceClassification(config)


def save_model(
    model: Qwen2ForCausalLM | Qwen2ForSequenceClassification, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> None:
    """Save weights, config, ``generation_config.json`` (eos/pad ids) and the tokenizer into one directory."""
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
