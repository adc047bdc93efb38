"""Byte-level ChatML tokenizer for the built-in demo task, built offline.

What: a ``Qwen2Tokenizer`` (byte-level BPE) whose vocabulary is the 256 byte symbols, the merges that spell the
three role names, and the special tokens, with a Qwen-style chat template. Text encodes one token per byte (one
per character for ASCII), except role names.

Why: the demo must run without any model hub. transformers 5 loads the tokenizer of every ``model_type: qwen2``
directory as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the saved vocabulary and merges, so the
tokenizer has to be one to load back unchanged. A byte vocabulary keeps the embedding tiny and every string
encodable. Role names are single tokens, so the template around one user turn plus the generation prompt costs
8 tokens. ``"\\n"`` is a single token and ``<|im_end|>`` exists, which verl's Qwen continuous-token builder needs.
"""

from transformers import PreTrainedTokenizerBase, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
ROLE_NAMES = ("system", "user", "assistant")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer() -> Qwen2Tokenizer:
    """Return the demo tokenizer; the same vocabulary (and the same saved files) on every call."""
    byte_symbols = [bytes_to_unicode()[byte] for byte in range(256)]  # token id == byte value
    # BPE merges that grow each role name one character at a time, so it encodes as one token.
    merges = [(name[: end - 1], name[end - 1]) for name in ROLE_NAMES for end in range(2, len(name) + 1)]
    tokens = byte_symbols + [left + right for left, right in merges] + [PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN]
    tokenizer = Qwen2Tokenizer(
        vocab={token: token_id for token_id, token in enumerate(tokens)},
        merges=merges,
        unk_token=None,  # every byte is in the vocabulary
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[IM_START_TOKEN],
        clean_up_tokenization_spaces=False,  # decode must be the exact inverse of encode
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def encode_chat_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of chat ``messages`` plus the assistant generation prompt, as verl's agent loop renders them."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
