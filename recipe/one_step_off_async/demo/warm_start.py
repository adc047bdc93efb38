"""Supervised warm start of the demo model on a flawed teacher, so that RL has something to fix.

What: ``SFT_STEPS`` AdamW steps of next-token loss on the answer tokens (incl. eos) of the train prompts. The
teacher drops repeated letters (``sorted(set(letters))``, a classic bug) in 70% of its demonstrations. The student
learns both behaviours: on val problems with a repeated letter (about 70% of them) its greedy answer is usually
the deduplicated, wrong one, while some of its samples at temperature 1 keep the repeats and earn reward 1.
Measured for seeds 0, 1, 2: greedy val accuracy 0.30, 0.33, 0.29; sampled (temperature 1) 0.27, 0.27, 0.23.
Every group of samples with mixed rewards pushes the same systematic behaviour, so a minimal GRPO loop (16
prompts x 4 samples at temperature 1, one on-policy AdamW update per step at lr 1e-4 or 2e-4, token-mean loss,
grad-norm clip 1) lifted greedy val accuracy to 0.41-0.52 within 40 steps for all three seeds.

Why not plain SFT stopped early: measured on this model and budget, an early-stopped student is in
the middle of learning, with a high-entropy, fragile policy; its sampled accuracy is too low for
groups of 4 samples to carry much signal, and the same GRPO loop moved its greedy accuracy
erratically, or collapsed it at lr 3e-4 and above. A converged student of a flawed teacher is the RL-after-SFT
situation in miniature: the errors are systematic, and the right behaviour is already in the policy's support.
"""

import contextlib
import logging
import random
from collections.abc import Callable, Iterator

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from recipe.one_step_off_async.demo.task import Problem
from recipe.one_step_off_async.demo.tokenizer import encode_chat_prompt

logger = logging.getLogger(__name__)

TEACHER_DEDUP_RATE = 0.7
SFT_STEPS = 200
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
IGNORE_INDEX = -100  # label value the HF causal-LM loss skips


@contextlib.contextmanager
def reproducible_torch() -> Iterator[None]:
    """One intra-op thread (CPU kernels split reductions by thread count) and deterministic kernels, so a CPU
    build gives the same weights every time; both settings are restored on exit."""
    num_threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(num_threads)


def teacher_conversation(problem: Problem, rng: random.Random) -> list[dict[str, str]]:
    """The flawed teacher's demonstration: the deduplicated sort with probability ``TEACHER_DEDUP_RATE``."""
    answer = "".join(sorted(set(problem.letters))) if rng.random() < TEACHER_DEDUP_RATE else problem.answer
    return [*problem.messages, {"role": "assistant", "content": answer}]


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation as verl's agent loops build them, and labels on the assistant turns.

    Each assistant turn is its content and eos, as sampled; every other turn is the chat template's
    rendering of it, followed by the assistant generation prompt (what verl's continuous-token builder
    appends after a tool response).
    """
    ids = encode_chat_prompt(tokenizer, messages[:1])
    labels = [IGNORE_INDEX] * len(ids)
    for index, message in enumerate(messages[1:], start=1):
        if message["role"] == "assistant":
            turn = tokenizer.encode(message["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
            ids, labels = ids + turn, labels + turn
            continue
        before = tokenizer.apply_chat_template(messages[:index], tokenize=True, return_dict=False)
        after = encode_chat_prompt(tokenizer, messages[: index + 1])
        # The rendered history ends with eos + "\n"; the sampled turn ended at eos.
        delta = after[len(before) - 1 :]
        ids, labels = ids + delta, labels + [IGNORE_INDEX] * len(delta)
    return ids, labels


def pad_batch(encoded: list[tuple[list[int], list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (``IGNORE_INDEX`` on padding) of (ids, labels)."""
    ids = [torch.tensor(row) for row, _ in encoded]
    labels = [torch.tensor(row) for _, row in encoded]
    return {
        "input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_token_id),
        "attention_mask": pad_sequence([torch.ones_like(row) for row in ids], batch_first=True),
        "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX),
    }


def supervised_fit(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    conversation: Callable[[Problem, random.Random], list[dict[str, str]]],
    seed: int,
    steps: int,
    batch_size: int,
    learning_rate: float,
) -> None:
    """``steps`` AdamW steps of ``model``'s loss on the assistant turns of ``conversation``s about ``batch_size`` of
    ``problems`` each (drawn with replacement), in place."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    for step in range(1, steps + 1):
        encoded = [encode_conversation(tokenizer, conversation(p, rng)) for p in rng.choices(problems, k=batch_size)]
        loss = model(**pad_batch(encoded, tokenizer.pad_token_id)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps:
            logger.info("supervised step %d/%d: loss %.3f", step, steps, loss.item())
    model.eval()


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    seed: int,
    steps: int = SFT_STEPS,
) -> None:
    """Train ``model`` in place on the teacher's answers to ``problems`` (sampled with replacement)."""
    supervised_fit(model, tokenizer, problems, teacher_conversation, seed, steps, BATCH_SIZE, LEARNING_RATE)
