"""Rollout throughput of the ``hf`` replica through verl's AgentLoopManager, against ``model.generate()``.

What: builds a small Qwen2 (random weights, the demo's character tokenizer) in a temporary
directory, then generates ``--max-tokens`` tokens for each of ``--num-prompts`` chat prompts three
times, with the same sampling (temperature 1, no top-k/top-p, EOS ignored so every response has the
same length):

1. through verl's ``AgentLoopManager`` -> ``LLMServerManager`` -> one ``hf`` replica (the headline);
2. through a ``GenerationEngine`` in this process, all prompts submitted at once (the batching
   engine alone, without Ray and the agent loop);
3. as one left-padded batched ``model.generate()`` in this process (the reference).

Every model computes on one thread, as the replica's server does (``OMP_NUM_THREADS=1``). Each is
timed ``--repeats`` times after a warm-up and the best run counts (a shared machine is noisy). It
prints generated tokens/s and the ratio to ``model.generate()``. Line 2 near 1 means the engine batches as
well as ``generate()``; the gap between lines 1 and 2 is Ray plus verl's agent loop, a fixed cost
per sample (agent-loop instantiation, chat template, routing, padding) that dominates when the
model is tiny and the responses short.

Why: CPU rollouts must batch; a low ratio on line 2 means requests are not batched together.

How:
    python -m benchmarks hf-rollout                          # 64 prompts x 64 tokens, hidden 64 x 2 layers
    python -m benchmarks hf-rollout --hidden-size 256 --layers 4 --max-tokens 128
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from benchmarks import argument_parser
from recipe.one_step_off_async import verl_plugin

# Before verl resolves its platform: this process and every Ray worker set up as a CPU launch does.
CPU_ENV = verl_plugin.activate(OmegaConf.create({"trainer": {"device": "cpu"}, "async_training": {"one_gpu": False}}))

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from transformers import GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop import AgentLoopManager  # noqa: E402
from verl.utils import hf_tokenizer  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerManager  # noqa: E402

import recipe.one_step_off_async.rollout.hf.replica  # noqa: E402, F401  (registers rollout.name=hf)
from recipe.one_step_off_async.demo.tokenizer import build_tokenizer  # noqa: E402
from recipe.one_step_off_async.rollout.hf.engine import GenerationEngine, SamplingParams  # noqa: E402


def build_model(path: Path, hidden_size: int, layers: int) -> None:
    """Save a random Qwen2 with the demo tokenizer, as verl loads a model directory."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden_size // 16),
        num_key_value_heads=max(1, hidden_size // 32),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)


def verl_config(model_dir: Path, max_tokens: int, agent_workers: int) -> DictConfig:
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.dtype=float32",
                "actor_rollout_ref.rollout.temperature=1.0",
                "actor_rollout_ref.rollout.ignore_eos=true",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.num_workers={agent_workers}",
                "data.max_prompt_length=64",
                f"data.max_response_length={max_tokens}",
            ],
        )


def problems(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [f"{a}+{b}=" for a, b in rng.integers(0, 100, size=(n, 2))]


def agent_loop_tokens_per_s(config: DictConfig, prompts: list[str], repeats: int) -> float:
    servers = LLMServerManager.create(config=config)
    agent_loop = AgentLoopManager.create(config=config, llm_client=servers.get_client())

    def batch(texts: list[str]) -> DataProto:
        raw = np.empty(len(texts), dtype=object)
        raw[:] = [[{"role": "user", "content": text}] for text in texts]
        return DataProto.from_dict(non_tensors={"raw_prompt": raw, "index": np.arange(len(texts))})

    workers = config.actor_rollout_ref.rollout.agent.num_workers
    agent_loop.generate_sequences(batch(prompts[:workers]))  # warm-up: worker start, first forwards

    def run() -> float:
        start = time.perf_counter()
        out = agent_loop.generate_sequences(batch(prompts))
        return float(out.batch["response_mask"].sum()) / (time.perf_counter() - start)

    return max(run() for _ in range(repeats))


def engine_tokens_per_s(model: PreTrainedModel, prompt_ids: list[list[int]], max_tokens: int, repeats: int) -> float:
    async def best() -> float:
        engine = GenerationEngine(model, max_num_seqs=len(prompt_ids), max_num_batched_tokens=1 << 20, seed=0)
        engine.start()
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0)
        await engine.submit(prompt_ids[0], SamplingParams(max_tokens=2))  # warm-up
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            results = await asyncio.gather(*[engine.submit(ids, params) for ids in prompt_ids])
            rates.append(sum(len(r.token_ids) for r in results) / (time.perf_counter() - start))
        await engine.shutdown()
        return max(rates)

    return asyncio.run(best())


def generate_tokens_per_s(
    model: PreTrainedModel, prompt_ids: list[list[int]], max_tokens: int, pad_id: int, repeats: int
) -> float:
    width = max(map(len, prompt_ids))
    input_ids = torch.full((len(prompt_ids), width), pad_id)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": pad_id}
    rates = []
    with torch.no_grad():
        model.generate(input_ids=input_ids[:2], attention_mask=attention_mask[:2], max_new_tokens=2, **sampling)
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                **sampling,
            )
            rates.append((out.shape[1] - width) * len(prompt_ids) / (time.perf_counter() - start))
    return max(rates)


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--agent-workers", type=int, default=1, help="rollout.agent.num_workers")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method; the best one counts")
    args = parser.parse_args(argv)
    if args.num_prompts % args.agent_workers:
        parser.error("--num-prompts must be a multiple of --agent-workers (verl splits the batch evenly)")

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, args.hidden_size, args.layers)
        config = verl_config(model_dir, args.max_tokens, args.agent_workers)
        prompts = problems(args.num_prompts)

        ray.init(num_cpus=8, runtime_env={"env_vars": CPU_ENV}, include_dashboard=False, log_to_driver=False)
        try:
            served = agent_loop_tokens_per_s(config, prompts, args.repeats)
        finally:
            ray.shutdown()

        torch.set_num_threads(1)
        tokenizer = hf_tokenizer(str(model_dir))
        prompt_ids = [
            list(
                tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)["input_ids"]
            )
            for p in prompts
        ]
        model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
        engine = engine_tokens_per_s(model, prompt_ids, args.max_tokens, args.repeats)
        direct = generate_tokens_per_s(model, prompt_ids, args.max_tokens, tokenizer.pad_token_id, args.repeats)

    print(
        f"{args.num_prompts} prompts x {args.max_tokens} tokens, Qwen2 hidden {args.hidden_size} x {args.layers} layers"
    )
    print("                                   generated tokens/s   ratio to generate()")
    for name, rate in [
        ("AgentLoopManager -> hf replica", served),
        ("GenerationEngine, in-process", engine),
        ("model.generate(), one batch", direct),
    ]:
        print(f"{name:<34} {rate:>18.0f}   {rate / direct:>19.2f}")
