"""GSM8K -> verl's RL parquet format, for ``run_qwen2_5_3b.sh``.

    python -m recipe.one_step_off_async.data.gsm8k --output-dir ~/data/gsm8k [--source DIR]

``--source`` is a local copy of the dataset (a directory holding ``train`` and ``test`` files in
parquet or jsonl with the ``question`` / ``answer`` columns of ``openai/gsm8k``); without it the
``datasets`` library downloads ``openai/gsm8k`` (config ``main``). Rows use ``data_source``
``openai/gsm8k`` so verl's built-in GSM8K rule reward scores them (it reads the number after
``####`` in the response); the prompt asks for exactly that format.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")


def final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K reference solution, without thousands separators."""
    match = re.search(r"####\s*(-?[0-9.,]+)", solution)
    if match is None:
        raise ValueError(f"GSM8K solution has no '#### <number>' final answer: {solution[-80:]!r}")
    return match.group(1).replace(",", "")


def to_rl_rows(questions: pd.DataFrame, split: str) -> pd.DataFrame:
    rows = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": final_answer(answer)},
            "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
        }
        for index, (question, answer) in enumerate(zip(questions["question"], questions["answer"], strict=True))
    ]
    return pd.DataFrame(rows)


def load_split(split: str, source: Path | None) -> pd.DataFrame:
    if source is None:
        import datasets

        return datasets.load_dataset(DATA_SOURCE, "main", split=split).to_pandas()
    files = sorted(source.glob(f"**/{split}*.parquet")) + sorted(source.glob(f"**/{split}*.jsonl"))
    if not files:
        raise FileNotFoundError(f"No {split}*.parquet or {split}*.jsonl under {source}: is it a copy of {DATA_SOURCE}?")
    frames = [pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_json(f, lines=True) for f in files]
    return pd.concat(frames, ignore_index=True)


def prepare(output_dir: Path, source: Path | None = None) -> dict[str, Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {split: output_dir / f"{split}.parquet" for split in SPLITS}
    for split, path in paths.items():
        to_rl_rows(load_split(split, source), split).to_parquet(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--source", type=Path, default=None, help="local copy of openai/gsm8k (else download)")
    args = parser.parse_args()
    for split, path in prepare(args.output_dir.expanduser(), args.source).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
