"""The demo task: sort five letters. Problem generation, verl's RL parquet format (``write_splits``), answer checking.

What: a prompt ``sort dbeca`` asks for the letters in alphabetical order, duplicates kept (``abcde``;
``sort abcab`` -> ``aabbc``). Letters come from ``a``-``j``, so about 70% of the problems contain a repeated
letter. The reward and the offline accuracy check both score answers with ``score_answer``: all or nothing.

The graded variant (``GRADED_DATA_SOURCE``, the ``one_step_off_ppo_cpu_graded`` profile) gives partial credit
(``score_positions``), so advantages within a group are not just the sign of a binary reward, as with graded
rewards in practice; the off-policy correction is measured on both. The long variant (``LONG_DATA_SOURCE``, the
``one_step_off_ppo_cpu_sort_long`` profile) sorts ``LONG_NUM_LETTERS`` letters with partial credit: answers
half again as long, a repeated letter in nearly every problem, and a warm start that scores 0.34 of the
positions, so every group carries signal (``python -m benchmarks learning --grid staleness-parity --tasks
sort_long`` measures what staleness costs on it).

Why this task: prompts (18 tokens with the chat template) and answers (at most 6 tokens incl.
eos) are short, so a 0.4M-parameter model trains in seconds on one CPU core, and repeated letters
give the warm start a natural, systematic mistake for RL to fix (see ``warm_start.py``).
"""

import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "one_step_off_async/sort_letters"
GRADED_DATA_SOURCE = "one_step_off_async/sort_letters_graded"
LONG_DATA_SOURCE = "one_step_off_async/sort_letters_long"
ABILITY = "sorting"
ALPHABET = "abcdefghij"
NUM_LETTERS = 5
LONG_NUM_LETTERS = 8
PROMPT_PREFIX = "sort "
NUM_TRAIN = 4096
NUM_VAL = 128
# Token counts under the demo tokenizer (tests check them): 8 template tokens around the user turn
# plus one token per character of the content; an answer is one token per letter plus eos.
MAX_PROMPT_LENGTH = 8 + len(PROMPT_PREFIX) + NUM_LETTERS
MAX_RESPONSE_LENGTH = NUM_LETTERS + 1
LONG_MAX_PROMPT_LENGTH = 8 + len(PROMPT_PREFIX) + LONG_NUM_LETTERS
LONG_MAX_RESPONSE_LENGTH = LONG_NUM_LETTERS + 1


def row_schema(*extra_info: tuple[str, pa.DataType]) -> pa.Schema:
    """The columns of verl's RL rows; ``extra_info`` holds ``index``, ``split`` and the given fields."""
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string()), *extra_info])),
        ]
    )


ROW_SCHEMA = row_schema()
AGENT_NAME_FIELD = pa.field("agent_name", pa.string())  # the agent loop verl runs for a row (agent-loop tasks)


@dataclass(frozen=True)
class Problem:
    letters: str

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": PROMPT_PREFIX + self.letters}]

    @property
    def answer(self) -> str:
        return "".join(sorted(self.letters))


def split_problems(seed: int, num_letters: int = NUM_LETTERS) -> dict[str, list[Problem]]:
    """Disjoint ``train`` and ``val`` lists of distinct problems, the same lists for the same ``seed``."""
    base = len(ALPHABET)
    codes = random.Random(seed).sample(range(base**num_letters), NUM_VAL + NUM_TRAIN)
    # A code's letters are its digits in base len(ALPHABET), the least significant first.
    problems = [Problem("".join(ALPHABET[code // base**i % base] for i in range(num_letters))) for code in codes]
    return {"val": problems[:NUM_VAL], "train": problems[NUM_VAL:]}


def to_rows(problems: list[Problem], split: str, data_source: str = DATA_SOURCE) -> list[dict]:
    """Rows in verl's RL dataset format; ``data_source`` picks the scoring (exact or graded)."""
    return [
        {
            "data_source": data_source,
            "prompt": problem.messages,
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": problem.answer},
            "extra_info": {"index": index, "split": split},
        }
        for index, problem in enumerate(problems)
    ]


def write_rows(rows: dict[str, list[dict]], out_dir: str | Path, prefix: str, schema: pa.Schema) -> dict[str, Path]:
    """Write each split's rows to ``<out_dir>/<prefix><split>.parquet``; return the paths by split."""
    paths = {split: Path(out_dir) / f"{prefix}{split}.parquet" for split in rows}
    for split, path in paths.items():
        pq.write_table(pa.Table.from_pylist(rows[split], schema=schema), path)
    return paths


def write_splits(
    splits: dict[str, list[Problem]], out_dir: str | Path, data_source: str = DATA_SOURCE, prefix: str = ""
) -> dict[str, Path]:
    """The sort task's ``<prefix><split>.parquet`` files; ``data_source`` picks the scoring (exact or graded)."""
    rows = {split: to_rows(problems, split, data_source) for split, problems in splits.items()}
    return write_rows(rows, out_dir, prefix, ROW_SCHEMA)


def score_answer(response: str, ground_truth: str) -> float:
    """1.0 if the response, up to surrounding whitespace, is exactly the sorted letters, else 0.0 (garbage too)."""
    return 1.0 if response.strip() == ground_truth else 0.0


def score_positions(response: str, ground_truth: str) -> float:
    """Share of the answer's positions holding the right letter, over the longer of response and answer.

    ``abcde`` for ``abcde`` scores 1.0, ``abced`` 0.6, ``abcdef`` 5/6 (an extra letter costs a position),
    ``abcd`` 0.8, garbage or empty text 0.0. Surrounding whitespace is ignored, as in ``score_answer``.
    """
    response = response.strip()
    matches = sum(got == want for got, want in zip(response, ground_truth, strict=False))
    return matches / max(len(response), len(ground_truth))
