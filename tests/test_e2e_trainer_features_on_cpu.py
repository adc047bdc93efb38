"""verl trainer features beyond the recipe's defaults, through the pipeline: the real entry point on CPU, rolling out
on vLLM's CPU build through verl's own vLLM path.

The run a PPO user would type, at staleness 1 with the profiles' partial rollout: ``algorithm.adv_estimator=gae``
(a critic on the training pool, the CPU profile's ``critic`` section) with ``trainer.critic_warmup=2`` (the actor
starts updating at step 2), a KL loss against the reference policy (``actor.use_kl_loss``) and a KL penalty in the
reward (``algorithm.use_kl_in_reward``), the reward from a reward model (``reward.reward_model.enable``: the demo's
tiny classifier, served on a pool of its own by vLLM's ``/classify`` and called by verl's reward loop), a bf16
rollout beside the fp32 actor (``rollout.dtype``, the GPU profiles' precision: the syncs
send bf16), dynamic batch sizes (actor, reference, rollout log-probs), the tensorboard tracker,
validation generations logged to it, and a checkpoint that also holds the actor in Hugging Face format
(``checkpoint.save_contents``). The rows of the support matrix (docs/advance/one_step_off_async/support_matrix.md)
for these features name this test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from e2e import contract_version, run_main

from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.trainer.workers import SENT_MBYTES

pytestmark = pytest.mark.e2e

STEPS = 4
CRITIC_WARMUP = 2
DYNAMIC_BATCH_SIZES = (
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
)
# What a verl user types (the CPU profile names the demo's reward model and its pool); the function reward is
# unset, or verl would score with it.
REWARD_MODEL = ("reward.reward_model.enable=true", "reward.custom_reward_function.path=null")
# max |p_actor - p_rollout| over a batch's tokens when both hold the same weights, the actor computing in fp32 and vLLM
# in bf16 from the bf16 weights a sync sends: 4.8e-3 to 5.4e-3 measured on vLLM's CPU build (1e-6 with an fp32
# rollout); weights that arrive wrong give O(0.5).
BF16_PROBS_BOUND = 0.02


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, demo_assets):
    directory = tmp_path_factory.mktemp("ppo_gae_kl")
    return run_main(
        directory,
        "algorithm.adv_estimator=gae",
        f"trainer.critic_warmup={CRITIC_WARMUP}",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "algorithm.use_kl_in_reward=true",
        *DYNAMIC_BATCH_SIZES,
        *REWARD_MODEL,
        "actor_rollout_ref.rollout.dtype=bfloat16",
        *DECOUPLED_OVERRIDES,  # the actor's recomputed log-probs give the bf16 rollout's probs diff
        "trainer.logger=[console,file,tensorboard]",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        f"trainer.test_freq={STEPS}",
        "trainer.log_val_generations=2",
        f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        env={"TENSORBOARD_DIR": str(directory / "tensorboard")},
        whole_batches=False,  # the profiles' default: partial rollout
    )


def test_ppo_with_a_critic_and_kl_trains_on_the_pipeline(ppo_run, demo_assets):
    from transformers import AutoModelForCausalLM

    assert ppo_run.returncode == 0, ppo_run.output[-5000:]
    metrics = ppo_run.metrics
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, values in metrics.items():
        # The critic trains every step, warm-up included; its values feed GAE.
        for key in ("critic/vf_loss", "critic/values/mean", "critic/returns/mean", "timing_s/update_critic"):
            assert math.isfinite(values[key]), f"step {step} {key}"
        # KL in reward: the penalty is computed against the reference every step.
        assert "actor/reward_kl_penalty" in values, f"step {step}"
        # The pipeline's contract holds with the extra workers on the training pool; before the actor's first
        # update (the critic's warm-up) its weights are v0's and no sync pushes them. With partial rollout a batch's
        # oldest token is at least the contract's version (the run checked every token) and at most the last synced.
        oldest, newest = (contract_version(step, s, 1, critic_warmup=CRITIC_WARMUP) for s in (1, 0))
        assert oldest <= values["async/weight_version"] <= newest, f"step {step}"
        assert values["async/synced"] == float(step >= CRITIC_WARMUP), f"step {step}"
        if step < CRITIC_WARMUP:
            assert "actor/pg_loss" not in values, f"step {step}: the actor updated during the critic's warm-up"
        else:
            assert math.isfinite(values["actor/pg_loss"]) and math.isfinite(values["actor/kl_loss"]), f"step {step}"
    # The batches of steps 1 and 2 were both sampled with v0, and the actor, which first updates at step
    # CRITIC_WARMUP, still holds v0's weights at both: the rollout's bf16 probabilities are the actor's within bf16.
    for step in range(1, CRITIC_WARMUP + 1):
        assert metrics[step]["training/rollout_probs_diff_max"] < BF16_PROBS_BOUND, f"step {step}"
    # Each sync sent the actor's fp32 weights as bf16: 2 bytes a parameter (the tied lm_head sent as its own tensor).
    model = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir)
    bf16_mbytes = 2 * sum(tensor.numel() for tensor in model.state_dict().values()) / 2**20
    synced = [step for step, values in metrics.items() if values["async/synced"]]
    assert synced and all(metrics[step][SENT_MBYTES] == bf16_mbytes for step in synced), bf16_mbytes
    # The actor moved away from the reference after its first update (step CRITIC_WARMUP).
    assert metrics[STEPS]["actor/kl_loss"] > 0
    assert metrics[STEPS]["actor/reward_kl_penalty"] != 0
    for key in ("use_dynamic_bsz", "log_prob_use_dynamic_bsz"):
        assert f"'{key}': False" not in ppo_run.output  # the resolved config the task runner printed


def test_the_reward_model_scored_every_sample_through_verls_reward_loop(ppo_run, demo_assets):
    """Each sample's reward is the reward model's logit for the prompt and response, as verl's reward loop renders
    them (the chat template with the response as the assistant turn): scored on the reward model's pool."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_assets.reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(demo_assets.reward_model_dir)
    samples = [
        json.loads(line)
        for step in range(1, STEPS + 1)
        for line in (ppo_run.directory / "rollouts" / f"{step}.jsonl").open()
    ]
    assert len(samples) == STEPS * 16 * 4
    texts = []
    for sample in samples:
        prompt = sample["input"].removeprefix("user\n").removesuffix("\nassistant\n")
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": sample["output"]}]
        texts.append(tokenizer.apply_chat_template(chat, tokenize=False))
    # Batched, right-padded: the classifier reads the last token that is not padding (its pad_token_id).
    assert tokenizer.padding_side == "right" and tokenizer.pad_token_id is not None
    assert model.config.pad_token_id == tokenizer.pad_token_id
    with torch.inference_mode():
        scores = [
            score
            for start in range(0, len(texts), 64)
            for score in model(**tokenizer(texts[start : start + 64], return_tensors="pt", padding=True))
            .logits[:, 0]
            .tolist()
        ]
    matched = sum(abs(score - sample["score"]) < 1e-5 for score, sample in zip(scores, samples, strict=True))
    # vLLM's /classify in fp32 scored all 256 samples of a run within 2.3e-7 of this forward.
    # The dump's text drops special tokens the policy may (rarely) emit inside a response, which the reward model
    # saw: those few samples cannot be re-rendered here. A random logit matching to 1e-5 by chance is impossible.
    assert matched >= 0.95 * len(samples), f"{matched} of {len(samples)} rewards are the reward model's"
    # Validation is scored by the reward model too.
    assert "val-core/one_step_off_async/sort_letters/reward/mean@1" in ppo_run.metrics[STEPS]


def test_tensorboard_gets_the_metrics_and_the_validation_generations(ppo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars, generations = {}, []
    for events in sorted((ppo_run.directory / "tensorboard").iterdir()):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0, "tensors": 0})
        accumulator.Reload()
        tags = accumulator.Tags()
        scalars |= {tag: [event.step for event in accumulator.Scalars(tag)] for tag in tags["scalars"]}
        if "val/generations/text_summary" in tags["tensors"]:
            generations += accumulator.Tensors("val/generations/text_summary")
    assert scalars["critic/vf_loss"] == list(range(1, STEPS + 1))
    assert scalars["async/staleness"] == list(range(1, STEPS + 1))
    [logged] = generations
    assert logged.step == STEPS
    assert b"### Sample 2" in logged.tensor_proto.string_val[0]


def test_the_checkpoint_holds_the_actor_in_hugging_face_format(ppo_run, demo_assets):
    from transformers import AutoModelForCausalLM

    exported = ppo_run.directory / "checkpoints" / f"global_step_{STEPS}" / "actor" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(exported)
    start = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir)
    assert model.state_dict().keys() == start.state_dict().keys()
    assert any(not (model.state_dict()[name] == weights).all() for name, weights in start.state_dict().items())
