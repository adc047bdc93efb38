"""The recipe's policy losses (``topr``, ``kimi15``, ``tis_pg``, ``reinforce``): values, gradients, config, registration.

Values and gradients are checked against float64 references written from the papers' formulas
(per token: the loss term and its derivative w.r.t. log pi, with the stop-gradient ratios held
constant), weighted by the rollout-correction weights and aggregated by verl's own ``agg_loss``
called as verl's losses call it (the mode, the mask and ``config.global_batch_info``); the weight
each token gets in that aggregate comes from autograd through ``agg_loss``. Inputs are random with
padding, for every mode verl offers and with and without rollout-correction weights. The losses are
called through verl's registry, as the actor calls them.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import (
    agg_loss,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

from recipe.one_step_off_async import launch, losses, verl_plugin
from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES, validate_config
from recipe.one_step_off_async.errors import ConfigError, OffPolicyCorrectionError
from recipe.one_step_off_async.losses import LOSS_MODES, OffPolicyLossConfig, policy_loss_problems
from recipe.one_step_off_async.trainer import verl_seams

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PARAMS = {  # not the defaults, so a key that does not reach the loss shows
    "kimi15_tau": 0.3,
    "tis_lower_bound": 0.8,
    "tis_upper_bound": 1.2,
    "topr_positive_weight": 0.7,
    "topr_negative_weight": 1.3,
}
B, T = 6, 7
# Graded scores (the sample's reward): samples 1 and 4 have the sign opposite to their outcome advantage.
SCORES = np.array([0.5, -0.2, 0.0, 1.0, 0.3, -1.0])


def compose_config(*overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name="one_step_off_ppo_cpu", overrides=list(overrides))


def batch(seed: int):
    """Random float64 inputs: padded responses (one fully padded), ratios on both sides of 1 and of [0.8, 1.2]."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 5, 1, 0, 3, 6])
    mask = np.arange(T)[None, :] < lengths[:, None]
    log_prob = np.log(rng.uniform(0.05, 0.95, (B, T)))
    old_log_prob = log_prob + rng.normal(0.0, 0.4, (B, T))
    advantages = rng.normal(0.0, 1.0, (B, T))  # per token (GAE-like); sign mixes within a response
    advantages[1] = 0.9  # an outcome advantage: constant along the response
    advantages[4] = -1.1
    is_weights = rng.uniform(0.2, 2.0, (B, T))
    return mask, log_prob, old_log_prob, advantages, is_weights


def reference_term(loss: str, log_prob, old_log_prob, advantages):
    """(per-token loss, its derivative w.r.t. log pi) from the papers' formulas; ratios are stop-gradient."""
    ratio = np.exp(log_prob - old_log_prob)
    if loss == "reinforce":  # REINFORCE: -A log pi
        return -advantages * log_prob, -advantages
    if loss == "kimi15":  # Kimi k1.5 eq. 3: -(A log pi - tau/2 (log pi - log pi_old)^2)
        tau = PARAMS["kimi15_tau"]
        delta = log_prob - old_log_prob
        return -advantages * log_prob + tau / 2 * delta**2, -advantages + tau * delta
    if loss == "tis_pg":  # truncated IS: -[pi/pi_old]_lo^hi A log pi
        weight = np.clip(ratio, PARAMS["tis_lower_bound"], PARAMS["tis_upper_bound"])
        return -weight * advantages * log_prob, -weight * advantages
    if loss in ("topr", "topr_by_advantage"):  # TOPR eq. 8: positive -> w+ A log pi; else w- [pi/pi_old]_0^1 A log pi
        positive = (SCORES > 0)[:, None] if loss == "topr" else advantages > 0  # the paper: by the sample's reward
        weight = np.where(
            positive, PARAMS["topr_positive_weight"], PARAMS["topr_negative_weight"] * np.minimum(ratio, 1.0)
        )
        return -weight * advantages * log_prob, -weight * advantages
    if loss == "cispo_unified":  # CISPO: -sg(clip(r, 1-lo, 1+hi)) A log pi, zero where PPO-clip would be flat
        low, high = CISPO_CLIP
        masked = ((advantages > 0) & (ratio > 1 + high)) | ((advantages < 0) & (ratio < 1 - low))
        weight = np.clip(ratio, 1 - low, 1 + high) * ~masked
        return -weight * advantages * log_prob, -weight * advantages
    raise AssertionError(loss)


CISPO_CLIP = (0.15, 0.25)  # clip_ratio_low, clip_ratio_high: not verl's defaults


def policy_loss(loss: str, config: ActorConfig, **inputs):
    """The registered policy loss called as the recipe's actor calls it: inside verl's actor loss wrapped by
    ``with_sample_scores``, which publishes the micro-batch's scores (``token_level_scores``, summed)."""
    token_level_scores = torch.zeros(B, T, dtype=torch.float64)
    token_level_scores[:, 0] = torch.tensor(SCORES)  # verl puts the reward on one token of the response

    def actor_loss(model_output, data, dp_group=None):
        return get_policy_loss_fn(loss)(**inputs, config=config)

    return losses.with_sample_scores(actor_loss)(
        model_output=None, data={"token_level_scores": token_level_scores}, dp_group=None
    )


def actor_config(loss: str, mode: str, info: dict) -> ActorConfig:
    own = {"topr_by_advantage": {"topr_split": "advantage"}, "cispo_unified": {"cispo_use_unified_mask": True}}
    registered = {"topr_by_advantage": "topr", "cispo_unified": "cispo"}.get(loss, loss)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        clip_ratio_low=CISPO_CLIP[0],
        clip_ratio_high=CISPO_CLIP[1],
        policy_loss=OffPolicyLossConfig(loss_mode=registered, **PARAMS, **own.get(loss, {})),
    )
    config.global_batch_info.update(info)  # what verl's ppo_loss sets before calling the policy loss
    return config


GLOBAL_INFOS = {
    # one rank, verl passing the global counts of this batch
    "local": {"dp_size": 1, "batch_num_tokens": 22, "global_batch_size": 5, "loss_scale_factor": None},
    # one of two ranks: global counts cover both; a fixed scale factor for the -norm mode
    "dp2": {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 11, "loss_scale_factor": 4},
    # nothing global: agg_loss falls back to this batch's own counts
    "none": {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None},
}


@pytest.mark.parametrize("with_is_weights", [False, True], ids=["no-is", "is-weights"])
@pytest.mark.parametrize("info", list(GLOBAL_INFOS))
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss", [*LOSS_MODES, "topr_by_advantage", "cispo_unified"])
def test_value_and_gradient_match_the_papers_formulas(loss, mode, info, with_is_weights):
    mask, log_prob, old_log_prob, advantages, is_weights = batch(seed=len(loss) + 7 * AGG_MODES.index(mode))
    assert mask.sum() == 22 and (mask.sum(axis=1) > 0).sum() == 5  # the "local" info describes this batch
    if not with_is_weights:
        is_weights = np.ones_like(log_prob)
    config = actor_config(loss, mode, GLOBAL_INFOS[info])
    term, derivative = reference_term(loss, log_prob, old_log_prob, advantages)
    loss_mat = torch.tensor(term * is_weights, requires_grad=True)
    expected = agg_loss(
        loss_mat=loss_mat, loss_mask=torch.tensor(mask), loss_agg_mode=mode, **config.global_batch_info
    )  # as compute_policy_loss_vanilla aggregates
    expected.backward()  # loss_mat.grad: each token's weight in the aggregate (0 on padding)
    expected_grad = loss_mat.grad.numpy() * is_weights * derivative

    log_prob_t = torch.tensor(log_prob, requires_grad=True)
    value, metrics = policy_loss(
        config.policy_loss.loss_mode,
        config,
        old_log_prob=torch.tensor(old_log_prob),
        log_prob=log_prob_t,
        advantages=torch.tensor(advantages),
        response_mask=torch.tensor(mask),
        loss_agg_mode=mode,
        rollout_is_weights=torch.tensor(is_weights) if with_is_weights else None,
    )
    value.backward()
    np.testing.assert_allclose(value.item(), expected.item(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(log_prob_t.grad.numpy(), expected_grad, rtol=1e-7, atol=1e-10)
    assert metrics["actor/ppo_kl"] == pytest.approx((old_log_prob - log_prob)[mask].mean())


def loss_inputs(mask, log_prob, old_log_prob, advantages) -> dict:
    """The keyword arguments verl's actor gives a policy loss (but the config and the rollout weights)."""
    return {
        "old_log_prob": torch.tensor(old_log_prob),
        "log_prob": torch.tensor(log_prob),
        "advantages": torch.tensor(advantages),
        "response_mask": torch.tensor(mask),
        "loss_agg_mode": "token-mean",
    }


def test_clip_metrics_count_the_truncated_tokens():
    mask, log_prob, old_log_prob, advantages, _ = batch(seed=0)
    ratio = np.exp(log_prob - old_log_prob)[mask]
    inputs = loss_inputs(mask, log_prob, old_log_prob, advantages)
    _, tis = get_policy_loss_fn("tis_pg")(**inputs, config=actor_config("tis_pg", "token-mean", GLOBAL_INFOS["none"]))
    assert tis["actor/pg_clipfrac"] == pytest.approx((ratio > 1.2).mean())
    assert tis["actor/pg_clipfrac_lower"] == pytest.approx((ratio < 0.8).mean())
    assert 0 < tis["actor/pg_clipfrac"] < 1 and 0 < tis["actor/pg_clipfrac_lower"] < 1

    for split, config in (("score", "topr"), ("advantage", "topr_by_advantage")):
        _, topr = policy_loss("topr", actor_config(config, "token-mean", GLOBAL_INFOS["none"]), **inputs)
        positive = (
            np.broadcast_to((SCORES > 0)[:, None], mask.shape)[mask] if split == "score" else advantages[mask] > 0
        )
        assert topr["actor/pg_clipfrac"] == pytest.approx((~positive & (ratio > 1)).mean())
        assert topr["actor/topr_positive_frac"] == pytest.approx(positive.mean())
        assert 0 < topr["actor/pg_clipfrac"] < 1
    # The default split differs from the advantage's sign on graded rewards, as the test's scores make it.
    assert (np.broadcast_to((SCORES > 0)[:, None], mask.shape) != (advantages > 0))[mask].any()


def test_topr_without_sample_scores_fails_naming_the_other_split():
    mask, log_prob, old_log_prob, advantages, _ = batch(seed=0)
    with pytest.raises(OffPolicyCorrectionError, match=r"topr_split=advantage"):
        get_policy_loss_fn("topr")(
            **loss_inputs(mask, log_prob, old_log_prob, advantages),
            config=actor_config("topr", "token-mean", GLOBAL_INFOS["none"]),
        )


def test_sample_scores_sum_each_responses_token_level_scores_padded_or_nested():
    padded = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    nested = torch.nested.as_nested_tensor([torch.tensor([0.0, 1.0]), torch.tensor([-0.25])], layout=torch.jagged)
    assert losses.sample_scores_of({"token_level_scores": padded}).tolist() == [1.0, 0.5]
    assert losses.sample_scores_of({"token_level_scores": nested}).tolist() == [1.0, -0.25]
    assert losses.sample_scores_of({}) is None


def test_the_sample_score_wrapper_passes_every_argument_through():
    """verl's engines call the actor loss with keywords; the distillation path with others (student_logits=...)."""
    seen = []

    def actor_loss(*args, **kwargs):
        seen.append((args, kwargs, losses._SAMPLE_SCORES.get().tolist()))
        return "loss"

    wrapped = losses.with_sample_scores(actor_loss)
    data = {"token_level_scores": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}
    assert wrapped(student_logits="logits", data=data, data_format="padded") == "loss"
    assert wrapped("output", data) == "loss"
    assert seen == [
        ((), {"student_logits": "logits", "data": data, "data_format": "padded"}, [1.0, 0.0]),
        (("output", data), {}, [1.0, 0.0]),
    ]
    assert losses._SAMPLE_SCORES.get() is None  # reset after each call


def test_cispo_without_the_unified_mask_is_verls_own():
    mask, log_prob, old_log_prob, advantages, is_weights = batch(seed=3)
    inputs = {
        **loss_inputs(mask, log_prob, old_log_prob, advantages),
        "config": actor_config("cispo", "token-mean", GLOBAL_INFOS["none"]),
        "rollout_is_weights": torch.tensor(is_weights),
    }
    assert get_policy_loss_fn("cispo") is losses.compute_policy_loss_cispo
    ours, ours_metrics = get_policy_loss_fn("cispo")(**inputs)
    verls, verls_metrics = losses._VERL_CISPO(**inputs)
    assert losses._VERL_CISPO.__module__ == "verl.trainer.ppo.core_algos"
    assert ours.item() == verls.item() and ours_metrics == verls_metrics


def test_the_actor_loss_verl_builds_is_the_one_the_recipes_worker_wraps():
    """Tripwire: the recipe's actor worker wraps ``self.loss_fn`` after verl's ``init_model`` builds it as
    ``partial(ppo_loss, config=...)`` and hands it to the actor; the engine calls it with keyword arguments; the
    trainer sends the actor the whole batch (token_level_scores included)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.workers import engine_workers
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.utils.losses import ppo_loss

    init_model = inspect.getsource(engine_workers.ActorRolloutRefWorker.init_model)
    assert "self.loss_fn = partial(ppo_loss, config=actor_config)" in init_model
    assert "self.actor.set_loss_fn(self.loss_fn)" in init_model
    assert list(inspect.signature(ppo_loss).parameters) == ["config", "model_output", "data", "dp_group"]
    assert "loss_function(\n                    model_output=model_output, data=micro_batch, dp_group=" in (
        inspect.getsource(transformer_impl)
    )
    assert "batch_td = batch.to_tensordict()" in inspect.getsource(RayPPOTrainer._update_actor)


def bypass_actor_config(*overrides: str) -> ActorConfig:
    """The actor's config as its worker builds it from a launch of the profiles' bypass mode."""
    config = compose_config(*overrides)
    verl_seams.route_bypass_loss_to_the_actor(config)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor.global_batch_info.update(GLOBAL_INFOS["local"])
    return actor


def test_in_bypass_mode_the_actor_runs_verls_bypass_loss_which_for_ppo_clip_is_vanilla_on_the_rollouts_log_probs():
    """The actor runs verl's ``bypass_mode`` loss (``verl_seams.route_bypass_loss_to_the_actor``): with the default
    ``loss_type=ppo_clip`` its value and gradient are vanilla PPO's on pi / pi_rollout (no IS weight) and it logs the
    sampler's distance (``rollout_corr/*``); its ``rollout_rs`` (the bad tokens masked) and ``loss_type`` reach it."""
    mask, log_prob, rollout_log_prob, advantages, _ = batch(7)
    actor = bypass_actor_config()
    assert actor.policy_loss.loss_mode == losses.BYPASS_LOSS_MODE

    def loss_and_gradient(loss, config):
        inputs = loss_inputs(mask, log_prob, rollout_log_prob, advantages)
        inputs["log_prob"].requires_grad_(True)
        value, metrics = get_policy_loss_fn(loss)(**inputs, config=config)
        value.backward()
        return value.detach(), inputs["log_prob"].grad, metrics

    bypass, bypass_grad, metrics = loss_and_gradient(losses.BYPASS_LOSS_MODE, actor)
    vanilla, vanilla_grad, _ = loss_and_gradient("vanilla", actor)
    torch.testing.assert_close(bypass, vanilla, rtol=0, atol=0)
    torch.testing.assert_close(bypass_grad, vanilla_grad, rtol=0, atol=0)
    assert metrics["rollout_corr/k3_kl"] > 0

    rejecting = bypass_actor_config(
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1"
    )
    rejected, _, metrics = loss_and_gradient(losses.BYPASS_LOSS_MODE, rejecting)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] > 0 and rejected != bypass

    reinforce = bypass_actor_config("algorithm.rollout_correction.loss_type=reinforce")
    inputs = loss_inputs(mask, log_prob, rollout_log_prob, advantages)
    verls, _ = compute_policy_loss_reinforce(
        rollout_log_prob=inputs.pop("old_log_prob"), **inputs, config=reinforce, rollout_is_weights=None
    )
    torch.testing.assert_close(loss_and_gradient(losses.BYPASS_LOSS_MODE, reinforce)[0], verls, rtol=0, atol=0)
    assert verls != vanilla


def test_a_decoupled_launch_keeps_its_loss_and_the_bypass_loss_is_refused_outside_bypass_mode():
    config = compose_config(*DECOUPLED_OVERRIDES)
    verl_seams.route_bypass_loss_to_the_actor(config)
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert "rollout_correction" not in config.actor_rollout_ref.actor.policy_loss
    with pytest.raises(ConfigError, match=r"loss_mode='bypass_mode' is verl's loss for bypass mode; set .*=true"):
        policy_loss_problems(
            compose_config(*DECOUPLED_OVERRIDES, f"{losses.POLICY_LOSS}.loss_mode=bypass_mode")
        ).raise_any()
    assert not policy_loss_problems(compose_config(f"{losses.POLICY_LOSS}.loss_mode=bypass_mode")).problems


def test_losses_take_the_arguments_verl_passes():
    """Tripwire: verl's actor calls a policy loss with vanilla's keyword arguments."""
    expected = list(inspect.signature(compute_policy_loss_vanilla).parameters)
    for loss in LOSS_MODES:
        assert list(inspect.signature(get_policy_loss_fn(loss)).parameters) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["+actor_rollout_ref.actor.policy_loss.kimi15_tau=-0.1"],
            r"policy_loss.kimi15_tau=-0.1 must be a number >= 0",
        ),
        (["+actor_rollout_ref.actor.policy_loss.kimi15_tau=abc"], r"policy_loss.kimi15_tau='abc' must be a number"),
        (["+actor_rollout_ref.actor.policy_loss.topr_positive_weight=-1"], r"policy_loss.topr_positive_weight=-1 must"),
        (["+actor_rollout_ref.actor.policy_loss.topr_negative_weight=-2"], r"policy_loss.topr_negative_weight=-2 must"),
        (["+actor_rollout_ref.actor.policy_loss.tis_lower_bound=-0.5"], r"policy_loss.tis_lower_bound=-0.5 must"),
        (
            ["+actor_rollout_ref.actor.policy_loss.tis_lower_bound=1.5"],
            r"policy_loss.tis_lower_bound=1.5 is above actor_rollout_ref.actor.policy_loss.tis_upper_bound=1.0",
        ),
        (
            [
                "+actor_rollout_ref.actor.policy_loss.tis_lower_bound=2",
                "+actor_rollout_ref.actor.policy_loss.tis_upper_bound=1",
            ],
            r"policy_loss.tis_lower_bound=2 is above actor_rollout_ref.actor.policy_loss.tis_upper_bound=1",
        ),
        (["+actor_rollout_ref.actor.policy_loss.topr_split=sign"], r"policy_loss.topr_split='sign' must be one of"),
        (
            ["+actor_rollout_ref.actor.policy_loss.cispo_use_unified_mask=1"],
            r"policy_loss.cispo_use_unified_mask=1 must be true or false",
        ),
        (
            ["+actor_rollout_ref.actor.policy_loss.kimi_tau=0.5"],
            r"Unknown key\(s\) actor_rollout_ref.actor.policy_loss.kimi_tau",
        ),
        # In the profiles' bypass mode (pi_old = the rollout's log-probs, no IS) every loss but vanilla is refused.
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=topr", "algorithm.rollout_correction.bypass_mode=true"],
            r"loss_mode='topr' with algorithm.rollout_correction.bypass_mode=true",
        ),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=cispo"], r"loss_mode='cispo' with .*bypass_mode=true"),
        # Bypass mode's own settings, which verl would reject at the first update.
        (["algorithm.rollout_correction.loss_type=reinforc"], r"loss_type='reinforc': bypass mode's loss is one of"),
        (["algorithm.rollout_correction.rollout_rs=token_k1"], r"rollout_rs='token_k1' needs .*rollout_rs_threshold"),
    ],
)
def test_bad_loss_config_names_the_key(overrides, message):
    config = compose_config(*overrides)
    with pytest.raises(ConfigError, match=message):
        policy_loss_problems(config).raise_any()
    with pytest.raises(ConfigError, match=message):  # the launch runs it before Ray starts
        launch.prepare_config(config)


def test_every_problem_of_the_loss_keys_is_reported_at_once():
    config = compose_config(
        "actor_rollout_ref.actor.policy_loss.loss_mode=topr",
        "algorithm.rollout_correction.bypass_mode=true",
        "+actor_rollout_ref.actor.policy_loss.kimi_tau=0.5",
        "+actor_rollout_ref.actor.policy_loss.kimi15_tau=-0.1",
        "+actor_rollout_ref.actor.policy_loss.topr_split=sign",
        "+actor_rollout_ref.actor.policy_loss.tis_lower_bound=2",
    )
    with pytest.raises(ConfigError) as caught:
        policy_loss_problems(config).raise_any()
    assert [problem.split("=")[0].split(";")[0] for problem in caught.value.problems] == [
        "Unknown key(s) actor_rollout_ref.actor.policy_loss.kimi_tau",
        "actor_rollout_ref.actor.policy_loss.topr_split",
        "actor_rollout_ref.actor.policy_loss.kimi15_tau",
        "actor_rollout_ref.actor.policy_loss.tis_lower_bound",  # is above tis_upper_bound
        "actor_rollout_ref.actor.policy_loss.loss_mode",  # with bypass_mode
    ]


def test_the_loss_check_leaves_verls_own_sections_under_policy_loss_to_verl():
    """Only the recipe's loss keys are checked: a key of a verl section nested there (``rollout_correction``, which
    verl fills at run time) is verl's to accept or refuse."""
    assert not policy_loss_problems(
        compose_config("+actor_rollout_ref.actor.policy_loss.rollout_correction.a_newer_verl_key=1")
    ).problems


@pytest.mark.parametrize("loss", [*LOSS_MODES, "vanilla", "cispo"])
def test_good_loss_config_validates(loss):
    """Every loss in decoupled mode (which they need; the profiles' bypass mode refuses all but vanilla)."""
    config = compose_config(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", *DECOUPLED_OVERRIDES)
    validate_config(config)
    assert not policy_loss_problems(config).problems
    params = compose_config(*(f"+actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in PARAMS.items()))
    assert not policy_loss_problems(params).problems
    options = compose_config(
        "+actor_rollout_ref.actor.policy_loss.topr_split=advantage",
        "+actor_rollout_ref.actor.policy_loss.cispo_use_unified_mask=true",
    )
    assert not policy_loss_problems(options).problems


def test_an_override_reaches_the_actor_config():
    """Tripwire: verl builds the actor config with hydra's instantiate; the base config's ``_target_`` makes it
    accept the keys, which verl's own PolicyLossConfig refuses."""
    keys = (
        "actor_rollout_ref.actor.policy_loss.loss_mode=kimi15",
        "+actor_rollout_ref.actor.policy_loss.kimi15_tau=0.5",
    )
    verls = compose_config(*keys, "actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig")
    with pytest.raises(Exception, match="kimi15_tau"):
        omega_conf_to_dataclass(verls.actor_rollout_ref.actor)
    with pytest.raises(ConfigError, match="_target_"):  # refused before Ray starts, naming the key
        policy_loss_problems(verls).raise_any()
    config = compose_config(*keys)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, OffPolicyLossConfig)
    assert (actor.policy_loss.loss_mode, actor.policy_loss.kimi15_tau, actor.policy_loss.topr_negative_weight) == (
        "kimi15",
        0.5,
        1.0,
    )


def test_worker_env_lists_the_plugin_first_and_keeps_the_users_modules(monkeypatch):
    monkeypatch.setenv(verl_plugin.EXTERNAL_MODULES_ENV, "mine.plugin")
    config = compose_config("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=theirs.plugin")
    expected = "recipe.one_step_off_async.verl_plugin,mine.plugin,theirs.plugin"
    assert verl_plugin.worker_env(config)["VERL_USE_EXTERNAL_MODULES"] == expected
    monkeypatch.setenv(verl_plugin.EXTERNAL_MODULES_ENV, expected)  # idempotent: a second launch lists it once
    assert verl_plugin.worker_env(config)["VERL_USE_EXTERNAL_MODULES"] == expected
    assert OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss._target_") == losses.CONFIG_TARGET


PROBE = """
import json, os
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
names = {names!r}
print(json.dumps({{
    "ours": {{name: get_policy_loss_fn(name).__module__ for name in names if name in POLICY_LOSS_REGISTRY}},
    "vanilla": get_policy_loss_fn("vanilla").__module__,
    "cispo": get_policy_loss_fn("cispo").__module__,
}}))
"""


def probe_registry(env: dict[str, str]) -> dict:
    """verl's registry in a fresh process that imports only verl, with ``env`` (and no VERL_* inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(names=list(LOSS_MODES))],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_verl_itself_registers_none_of_our_names():
    """Tripwire: if verl ever ships a loss under one of these names, ours would silently replace it."""
    assert probe_registry({}) == {
        "ours": {},
        "vanilla": "verl.trainer.ppo.core_algos",
        "cispo": "verl.trainer.ppo.core_algos",
    }


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_worker_processes_find_our_losses(device, monkeypatch):
    """The env ``launch.prepare_config`` gives Ray workers registers the losses when a worker imports verl."""
    monkeypatch.setenv(verl_plugin.EXTERNAL_MODULES_ENV, "")
    env = verl_plugin.worker_env(compose_config(f"trainer.device={device}"))
    found = probe_registry(env)
    assert found == {
        "ours": dict.fromkeys(LOSS_MODES, "recipe.one_step_off_async.losses"),
        "vanilla": "verl.trainer.ppo.core_algos",
        "cispo": "recipe.one_step_off_async.losses",  # verl's, wrapped for cispo_use_unified_mask
    }
