"""Supervised warm start of the demo model on a flawed teacher, so that RL has something to fix.

What: 200 AdamW steps (lr 1e-3, 64 demonstrations per step) of next-token loss on the answer
tokens (incl. eos) of the train prompts. The teacher sorts correctly, except that in 70% of its
demonstrations it drops repeated letters (``sorted(set(letters))``, a classic bug). The student
learns both behaviours: on val problems with a repeated letter (about 70% of them) its greedy
answer is usually the deduplicated, wrong one, while some of its samples at temperature 1 keep
the repeats and earn reward 1. Measured for seeds 0, 1, 2: greedy val accuracy 0.30, 0.33, 0.29;
sampled (temperature 1) 0.27, 0.27, 0.23. Every group of samples with mixed rewards pushes the
same systematic behaviour, so a minimal GRPO loop (16 prompts x 4 samples at temperature 1, one
on-policy AdamW update per step at lr 1e-4 or 2e-4, token-mean loss, grad-norm clip 1) lifted
greedy val accuracy to 0.41-0.52 within 40 steps for all three seeds.

Why not plain SFT stopped early: measured on this model and budget, an early-stopped student is in
the middle of learning, with a high-entropy, fragile policy; its sampled accuracy is too low for
groups of 4 samples to carry much signal, and the same GRPO loop moved its greedy accuracy
erratically, or collapsed it at lr 3e-4 and above. A converged student of a flawed teacher is the RL-after-SFT situation in
miniature: the errors are systematic, and the right behaviour is already in the policy's support.

How: ``with reproducible_torch(): warm_start(model, tokenizer, problems, seed)``.
"""

import contextlib
import logging
import random
from collections.abc import Callable, Iterator

import torch
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
    """One intra-op thread and deterministic kernels, so a CPU build gives the same weights every time.

    CPU kernels may split reductions differently for different thread counts, which changes the
    floating-point result. Both settings are restored on exit.
    """
    num_threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(num_threads)


def teacher_answer(problem: Problem, rng: random.Random) -> str:
    """The flawed teacher's demonstration: the deduplicated sort with probability ``TEACHER_DEDUP_RATE``."""
    if rng.random() < TEACHER_DEDUP_RATE:
        return "".join(sorted(set(problem.letters)))
    return problem.answer


def pad_batch(sequences: list[list[int]], targets: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (``targets``, ``IGNORE_INDEX`` on padding)."""
    width = max(map(len, sequences))
    batch = {
        "input_ids": torch.full((len(sequences), width), pad_token_id),
        "attention_mask": torch.zeros((len(sequences), width), dtype=torch.long),
        "labels": torch.full((len(sequences), width), IGNORE_INDEX),
    }
    for row, (sequence, target) in enumerate(zip(sequences, targets, strict=True)):
        batch["input_ids"][row, : len(sequence)] = torch.tensor(sequence)
        batch["attention_mask"][row, : len(sequence)] = 1
        batch["labels"][row, : len(target)] = torch.tensor(target)
    return batch


def collate_demonstrations(
    tokenizer: PreTrainedTokenizerBase, demonstrations: list[tuple[Problem, str]]
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (answer and eos only) for a batch."""
    sequences, targets = [], []
    for problem, answer in demonstrations:
        prompt_ids = encode_chat_prompt(tokenizer, problem.messages)
        answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        sequences.append(prompt_ids + answer_ids)
        targets.append([IGNORE_INDEX] * len(prompt_ids) + answer_ids)
    return pad_batch(sequences, targets, tokenizer.pad_token_id)


def supervised_fit(
    model: PreTrainedModel, next_batch: Callable[[], dict[str, torch.Tensor]], steps: int, learning_rate: float
) -> None:
    """``steps`` AdamW steps of ``model``'s next-token loss on the batches ``next_batch`` returns, in place."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    for step in range(1, steps + 1):
        loss = model(**next_batch()).loss
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
    rng = random.Random(seed)

    def next_batch() -> dict[str, torch.Tensor]:
        demonstrations = [(problem, teacher_answer(problem, rng)) for problem in rng.choices(problems, k=BATCH_SIZE)]
        return collate_demonstrations(tokenizer, demonstrations)

    supervised_fit(model, next_batch, steps, LEARNING_RATE)
