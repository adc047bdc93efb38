"""The ``hf`` reward-model server: vLLM's ``/classify`` endpoint on CPU, for verl's reward loop.

What: ``HFRewardServer``, one Ray actor per reward-model replica (``HFReplica`` with ``is_reward_model=True``,
``reward.reward_model.rollout.name=hf``). It holds a HF-transformers sequence classifier
(``AutoModelForSequenceClassification``) and serves ``POST /classify`` over HTTP with vLLM's request and
response schema: ``{"model", "input": text or texts, "use_activation"}`` in, one ``{"index", "label",
"probs", "num_classes"}`` per text out, ``probs`` being the raw logits when ``use_activation`` is false.

Why: verl 0.9.1's reward loop scores a sample with a discriminative reward model by posting the model's
chat-formatted text to a router, which forwards it to a replica's HTTP address
(``RewardLoopWorker.compute_score_disrm``, ``verl/experimental/reward_loop/reward_loop.py``); it speaks
vLLM's and SGLang's protocols only (``trainer/reward_loop.py`` lets ``hf`` take vLLM's). Serving the same
protocol lets the CPU path run verl's reward loop unmodified: router, reward workers, streaming scores.

How: ``launch_server`` starts the app with verl's ``run_uvicorn`` in the actor's event loop and returns
``host:port``. Each text is tokenized as vLLM does (``add_special_tokens=True``) and scored alone, one at a
time on one thread: no padding, so a score never depends on what it arrived with (the determinism vLLM
gets from ``max_num_seqs=1``). The scores are the classifier's logits at the last token (as vLLM's pooler
takes them; transformers would skip trailing pad tokens); with ``use_activation`` (vLLM's default) a softmax
over the labels, or a sigmoid for a single label, as vLLM's classify pooler applies them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
import torch
from fastapi import FastAPI, HTTPException
from omegaconf import DictConfig
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForSequenceClassification, PreTrainedModel
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.net_utils import is_valid_ipv6_address
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.utils import run_uvicorn

from recipe.one_step_off_async.rollout.hf.server import resolve_max_model_len

_log = logging.getLogger(__name__)


class ClassifyRequest(BaseModel):
    """vLLM's classification request, the fields verl's reward loop sends; any other field is refused (422)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[str]
    use_activation: bool | None = None


def load_classifier(model_config: HFModelConfig, dtype: str) -> PreTrainedModel:
    """The reward model (a sequence-classification head on a causal LM) with SDPA attention, in eval mode.

    Raises if the checkpoint lacks weights of the classifier (a policy checkpoint loads with a random head). Its
    score is taken at the last token, as vLLM's pooler does: transformers would skip trailing pad tokens.
    """
    model, loading = AutoModelForSequenceClassification.from_pretrained(
        model_config.local_path,
        dtype=PrecisionType.to_dtype(dtype),
        attn_implementation="sdpa",
        trust_remote_code=model_config.trust_remote_code,
        output_loading_info=True,
    )
    if loading["missing_keys"]:
        raise ValueError(
            f"reward.reward_model.model_path={model_config.path} is not a sequence-classification checkpoint: it lacks "
            f"{sorted(loading['missing_keys'])}, which would score with random weights. Point it at a reward model."
        )
    model.config.get_text_config().pad_token_id = None  # one text per forward: no padding to skip
    return model.eval()


def activation(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's classify activation: a sigmoid for one label, else a softmax over the labels."""
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(dim=-1)


class HFRewardServer:
    """One ``hf`` reward-model replica: a sequence classifier behind vLLM's ``/classify`` endpoint.

    Created by ``HFReplica`` through a verl ``RayWorkerGroup`` on the reward model's pool; ``launch_server``
    starts serving. The memory controls verl's ``RewardModelManager`` calls around scoring are no-ops on CPU.
    """

    def __init__(
        self,
        rollout_config: RolloutConfig | DictConfig,
        model_config: HFModelConfig | DictConfig,
        replica_rank: int,
    ) -> None:
        config: RolloutConfig = omega_conf_to_dataclass(rollout_config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.model = load_classifier(self.model_config, config.dtype)
        self.tokenizer = self.model_config.tokenizer
        self.max_model_len = resolve_max_model_len(config, self.model.config, "reward.reward_model.rollout")
        self.served_model = str(self.model_config.path)
        self.replica_rank = replica_rank
        self._scoring = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-model")
        self._server_task: asyncio.Task | None = None

    def score(self, text: str, use_activation: bool) -> tuple[list[float], int]:
        """The scores of one text (logits, or their activation) and its token count."""
        token_ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        if not token_ids or len(token_ids) > self.max_model_len:
            raise ValueError(
                f"the text has {len(token_ids)} tokens; the reward model scores 1 to {self.max_model_len} "
                "(reward.reward_model.rollout.max_model_len)"
            )
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([token_ids])).logits[0].float()
        scores = activation(logits) if use_activation else logits
        return scores.tolist(), len(token_ids)

    async def classify(self, request: ClassifyRequest) -> dict[str, Any]:
        if request.model not in (None, self.served_model):  # vLLM's check of the served model's name
            raise HTTPException(status_code=404, detail=f"The model `{request.model}` does not exist.")
        texts = [request.input] if isinstance(request.input, str) else request.input
        use_activation = True if request.use_activation is None else request.use_activation
        loop = asyncio.get_running_loop()
        try:
            scored = [await loop.run_in_executor(self._scoring, self.score, text, use_activation) for text in texts]
        except ValueError as error:
            # verl's router turns the 400 into a 500 that its reward workers retry: the cause shows only here.
            _log.error("reward model replica %d refused a request: %s", self.replica_rank, error)
            raise HTTPException(status_code=400, detail=str(error)) from error
        labels = self.model.config.id2label
        data = []
        for index, (probs, _) in enumerate(scored):
            label = labels.get(max(range(len(probs)), key=probs.__getitem__)) if labels else None
            data.append({"index": index, "label": label, "probs": probs, "num_classes": len(probs)})
        tokens = sum(count for _, count in scored)
        return {
            "id": f"classify-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": request.model or self.served_model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }

    def build_app(self) -> FastAPI:
        """The HTTP app: ``POST /classify`` and ``GET /health``."""
        app = FastAPI()
        app.post("/classify")(self.classify)
        app.get("/health")(lambda: {})
        return app

    async def launch_server(self) -> str:
        """Serve ``build_app()`` on a free port of this node; return ``host:port``."""
        host = ray.util.get_node_ip_address().strip("[]")
        port, self._server_task = await run_uvicorn(self.build_app(), None, host)
        return f"[{host}]:{port}" if is_valid_ipv6_address(host) else f"{host}:{port}"

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to wake: on CPU the weights never leave memory."""

    async def sleep(self) -> None:
        """Nothing to free: on CPU the weights never leave memory."""
