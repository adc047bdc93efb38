"""The vision demo task: name the colour of the square in a picture, with a tiny Qwen2.5-VL built offline.

What: each prompt is a 56x56 PNG drawn with PIL (a filled square of one of ``COLOURS``, at a random place and
size, on white) and the question ``colour?``; the answer is the colour's name, scored all or nothing
(``score_colour``). The policy is a ``Qwen2_5_VLForConditionalGeneration`` (a 2-layer vision tower of width 64,
patch 14, 2x2 merge, over the demo's 2-layer text model) with the demo tokenizer plus Qwen2-VL's vision tokens
and a chat template that puts ``<|vision_start|><|image_pad|><|vision_end|>`` where a message has an image. Its
image processor (``Qwen2VLImageProcessor``, fixed at 56x56 pixels) turns a picture into 16 patches, 4 image
tokens after the merge, so a prompt is ``MAX_PROMPT_LENGTH`` tokens.

Why: verl's multi-modal path (images in the parquet rows, the processor in the agent loop, ``multi_modal_data``
to the rollout, ``multi_modal_inputs`` and M-RoPE position ids to the actor) must carry the same pixels to both
sides; a random-init model shows that (the rollout's and the actor's token probabilities differ when the pixels
do), without any hub download. Qwen2.5-VL rather than Qwen2-VL: verl 0.9.1 counts a Qwen2-VL's vision FLOPs
with Qwen2.5-VL's config fields (``verl/utils/flops_counter.py`` ``_estimate_qwen3_vit_flop`` reads
``vision_config.intermediate_size``, which ``Qwen2VLVisionConfig`` lacks), so a Qwen2-VL fails the actor's first
step with images.

How: ``build_model_dir(out_dir, seed)`` writes the model, tokenizer and processor files; ``write_splits(out_dir,
seed)`` writes ``vision_{train,val}.parquet`` in verl's RL format, each row's picture in its ``images`` column
(verl's ``data.image_key``), referenced by ``<image>`` in the prompt.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pyarrow as pa
import torch
from PIL import Image, ImageDraw
from transformers import GenerationConfig, PreTrainedTokenizerBase

from recipe.one_step_off_async.demo import task
from recipe.one_step_off_async.demo.tokenizer import build_tokenizer

DATA_SOURCE = "one_step_off_async/square_colour"
ABILITY = "vision"
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 30), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
QUESTION = "colour?"
IMAGE_SIZE = 56  # pixels a side: 4x4 patches of 14, merged 2x2 into 4 image tokens
PATCH_SIZE = 14
MERGE_SIZE = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE // MERGE_SIZE) ** 2
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
NUM_TRAIN = 512
NUM_VAL = 32
# Under the vision tokenizer: 8 template tokens around the user turn, the image's start, pads and end, one
# token per character of the question; an answer is one token per letter plus eos.
MAX_PROMPT_LENGTH = 8 + 2 + IMAGE_TOKENS + len(QUESTION)
MAX_RESPONSE_LENGTH = max(map(len, COLOURS)) + 1

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ROW_SCHEMA = task.row_schema().append(pa.field("images", pa.list_(pa.struct([("bytes", pa.binary())]))))


def build_vision_tokenizer() -> PreTrainedTokenizerBase:
    """The demo tokenizer plus Qwen2-VL's vision tokens (ids 275-278) and a chat template that places images."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def image_processor():
    """Qwen2-VL's image processor, every picture resized to ``IMAGE_SIZE`` square (its PIL backend: no torchvision;
    imported here, as the model's classes are, so that the reward function's import of this module stays light)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = IMAGE_SIZE * IMAGE_SIZE
    return Qwen2VLImageProcessorPil(
        min_pixels=pixels, max_pixels=pixels, patch_size=PATCH_SIZE, temporal_patch_size=2, merge_size=MERGE_SIZE
    )


def model_config(tokenizer: PreTrainedTokenizerBase):
    """The demo's text model (``model.py``) under a 2-layer vision tower; M-RoPE sections for its head size 32."""
    from transformers import Qwen2_5_VLConfig

    token_id = tokenizer.convert_tokens_to_ids
    return Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": tokenizer.model_max_length,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 6, 6]},
            "tie_word_embeddings": False,
            "bos_token_id": None,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": 128,  # the text model's: the merger projects into it
            "fullatt_block_indexes": [1],  # the last layer attends over the whole image, as in Qwen2.5-VL
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=False,
        dtype=torch.float32,
    )


def build_model_dir(out_dir: str | Path, seed: int) -> None:
    """Save a randomly initialised model (the same weights for the same seed), its tokenizer and its processor.

    The processor is saved part by part: transformers builds a ``Qwen2_5_VLProcessor`` only with its video
    processor, which needs torchvision; loading the folder with ``AutoProcessor`` does too (see the support matrix).
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = build_vision_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(model_config(tokenizer))
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    image_processor().save_pretrained(out_dir)
    (Path(out_dir) / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}) + "\n")
    (Path(out_dir) / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def draw_square(colour: str, rng: random.Random) -> bytes:
    """A PNG of a ``colour`` square (side 16-40 pixels, anywhere inside) on white."""
    side = rng.randint(16, 40)
    left, top = rng.randint(0, IMAGE_SIZE - side), rng.randint(0, IMAGE_SIZE - side)
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), "white")
    ImageDraw.Draw(image).rectangle([left, top, left + side - 1, top + side - 1], fill=COLOURS[colour])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def to_rows(split: str, count: int, rng: random.Random) -> list[dict]:
    """``count`` rows in verl's RL format, each with its picture and ``<image>`` before the question."""
    rows = []
    for index in range(count):
        colour = rng.choice(sorted(COLOURS))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": "<image>" + QUESTION}],
                "images": [{"bytes": draw_square(colour, rng)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": colour},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


def write_splits(out_dir: str | Path, seed: int) -> dict[str, Path]:
    """``vision_train.parquet`` and ``vision_val.parquet``, the same pictures for the same ``seed``."""
    rng = random.Random(seed)
    rows = {"val": to_rows("val", NUM_VAL, rng), "train": to_rows("train", NUM_TRAIN, rng)}
    return task.write_rows(rows, out_dir, "vision_", ROW_SCHEMA)


def score_colour(response: str, ground_truth: str) -> float:
    """1.0 if the response, up to surrounding whitespace, is the colour's name, else 0.0."""
    return 1.0 if response.strip() == ground_truth else 0.0
