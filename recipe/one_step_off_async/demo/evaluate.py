"""Offline accuracy of a demo model on a split: a sanity check of the assets, not verl's validation.

What: one answer per row with HF ``generate`` (greedy, or sampled at a temperature), decoded as verl's reward
managers do (up to the first eos, special tokens skipped) and scored by the task's ``compute_score``.

Why: the asset build records the warm-started model's accuracy, and tests check it lies in the
intended band, without starting a verl trainer.
"""

from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from recipe.one_step_off_async.demo.reward import compute_score
from recipe.one_step_off_async.demo.task import MAX_RESPONSE_LENGTH
from recipe.one_step_off_async.demo.tokenizer import encode_chat_prompt


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    messages: list[list[dict[str, str]]],
    temperature: float,
    seed: int,
) -> list[str]:
    """Decoded responses to chat ``messages`` (one batch, left-padded); greedy when ``temperature`` is 0."""
    prompts = [encode_chat_prompt(tokenizer, m) for m in messages]
    inputs = tokenizer.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt")
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    config = GenerationConfig(
        max_new_tokens=MAX_RESPONSE_LENGTH,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        output = model.generate(**inputs, generation_config=config)
    # generate pads a row after its eos, and decoding skips pad and eos: each response ends at its first eos
    return tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def model_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    temperature: float = 0.0,
    seed: int = 0,
) -> float:
    """Mean reward of ``model``'s answers to verl-format ``rows``."""
    responses = generate_responses(model, tokenizer, [row["prompt"] for row in rows], temperature, seed)
    scores = [
        compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
        for row, response in zip(rows, responses, strict=True)
    ]
    return sum(scores) / len(scores)


def accuracy(model_dir: str | Path, data_file: str | Path, temperature: float = 0.0, seed: int = 0) -> float:
    """Mean reward of the model saved in ``model_dir`` on the parquet ``data_file`` (greedy by default)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_accuracy(model, tokenizer, pq.read_table(data_file).to_pylist(), temperature, seed)
