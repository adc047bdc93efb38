"""Off-policy policy losses from ROLL, registered as verl policy losses: ``topr``, ``kimi15``, ``tis_pg``, ``reinforce``.

What: four REINFORCE-family losses, selected with verl's ``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``
and tuned with the keys of ``OffPolicyLossConfig`` below (the one place their defaults live); also ROLL's
``cispo_use_unified_mask`` as an option of verl's own ``cispo``. Users' view: docs/advance/off_policy_losses.md.

Why: with staleness >= 1 every batch is off-policy; these losses are the ones ROLL ships for
that case, behind verl's ``register_policy_loss`` so the actor's training code needs no change.

How they plug in: the recipe's verl plugin imports this module in every process; ``policy_loss._target_`` is
``OffPolicyLossConfig`` (``config/one_step_off_base.yaml``), since hydra's ``instantiate`` rejects keys its target
does not declare. Every loss follows verl's contract (``_policy_loss``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import verl.utils.torch_functional as verl_F
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import ActorConfig, PolicyLossConfig

from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.errors import OffPolicyCorrectionError
from recipe.one_step_off_async.schema import Check, Problems, unknown_keys, value_problems

LOSS_MODES = ("topr", "kimi15", "tis_pg", "reinforce")
TOPR_SPLITS = ("score", "advantage")
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
CORRECTION = "algorithm.rollout_correction"
BYPASS_LOSS_MODE = "bypass_mode"  # verl's policy loss for bypass mode (core_algos.compute_policy_loss_bypass_mode)
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")  # what compute_policy_loss_bypass_mode dispatches on


@dataclass
class OffPolicyLossConfig(PolicyLossConfig):
    """verl's ``policy_loss`` section plus the keys of this module's losses (defaults = ROLL's)."""

    topr_positive_weight: float = field(
        default=1.0,
        metadata={
            "help": "topr: weight of the plain REINFORCE term of the positive samples (>= 0).",
            "check": Check(at_least=0),
        },
    )
    topr_negative_weight: float = field(
        default=1.0,
        metadata={"help": "topr: weight of the tapered term of the other samples (>= 0).", "check": Check(at_least=0)},
    )
    topr_split: str = field(
        default="score",
        metadata={
            "help": "topr: what makes a token positive. score: its sample's score > 0 (the paper's and ROLL's "
            "split, by the reward); advantage: the token's own advantage > 0 (the same for binary GRPO rewards).",
            "check": Check(choices=TOPR_SPLITS),
        },
    )
    cispo_use_unified_mask: bool = field(
        default=False,
        metadata={
            "help": "verl's cispo: also drop the tokens PPO-clip would not move (advantage > 0 with the ratio above "
            "1 + clip_ratio_high, advantage < 0 below 1 - clip_ratio_low), as ROLL's cispo_use_unified_mask."
        },
    )
    kimi15_tau: float = field(
        default=0.1,
        metadata={
            "help": "kimi15: tau of the tau/2 (log pi - log pi_old)^2 penalty (>= 0). The Kimi k1.5 report "
            "gives no value; 0.1 is ROLL's default.",
            "check": Check(at_least=0),
        },
    )
    tis_lower_bound: float = field(
        default=0.0,
        metadata={"help": "tis_pg: lower truncation of pi/pi_old (>= 0; ROLL's default).", "check": Check(at_least=0)},
    )
    tis_upper_bound: float = field(
        default=1.0,
        metadata={
            "help": "tis_pg: upper truncation of pi/pi_old (>= tis_lower_bound; ROLL's default).",
            "check": Check(at_least=0),
        },
    )


CONFIG_TARGET = f"{OffPolicyLossConfig.__module__}.{OffPolicyLossConfig.__qualname__}"
_OWN_KEYS = tuple(f.name for f in fields(OffPolicyLossConfig) if f.name not in PolicyLossConfig.__dataclass_fields__)
_DEFAULTS = {f.name: f.default for f in fields(OffPolicyLossConfig) if f.name in _OWN_KEYS}


def policy_loss_problems(config: DictConfig) -> Problems:
    """The unknown ``policy_loss`` keys, the values this module's keys do not take, and the settings its losses
    cannot run with, each naming the key and the fix."""
    section = OmegaConf.select(config, POLICY_LOSS, default=None)
    values = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else {}
    known = f"the keys of this recipe's losses are {', '.join(_OWN_KEYS)} (see recipe/one_step_off_async/losses.py)."
    problems = unknown_keys(OffPolicyLossConfig, values, f"{POLICY_LOSS}.", also_known=("_target_",), known=known)
    problems += value_problems(OffPolicyLossConfig, values, f"{POLICY_LOSS}.", names=_OWN_KEYS)
    mode, target = values.get("loss_mode"), values.get("_target_")
    if (mode in LOSS_MODES or set(values) & set(_OWN_KEYS)) and target != CONFIG_TARGET:
        problems.append(
            f"{POLICY_LOSS}._target_={target}: the recipe's losses and their keys need {POLICY_LOSS}._target_="
            f"{CONFIG_TARGET} (the recipe's configs set it; a config that does not start from them must too)."
        )
    low = values.get("tis_lower_bound", _DEFAULTS["tis_lower_bound"])
    high = values.get("tis_upper_bound", _DEFAULTS["tis_upper_bound"])
    if Check(at_least=0).accepts(float, low) and Check(at_least=0).accepts(float, high) and low > high:
        problems.append(
            f"{POLICY_LOSS}.tis_lower_bound={low!r} is above {POLICY_LOSS}.tis_upper_bound={high!r}; the truncation "
            "range must be [lower, upper]."
        )
    correction = OmegaConf.select(config, CORRECTION, default=None) or {}
    bypass = correction.get("bypass_mode", False)
    loss_type = correction.get("loss_type", BYPASS_LOSS_TYPES[0])
    if bypass and loss_type not in BYPASS_LOSS_TYPES:
        problems.append(
            f"{CORRECTION}.loss_type={loss_type!r}: bypass mode's loss is one of {', '.join(BYPASS_LOSS_TYPES)} "
            "(PPO clip on pi / pi_rollout, or REINFORCE weighted by the rollout_is weights)."
        )
    if correction.get("rollout_rs") is not None and correction.get("rollout_rs_threshold") is None:
        problems.append(
            f"{CORRECTION}.rollout_rs={correction.get('rollout_rs')!r} needs {CORRECTION}.rollout_rs_threshold (verl "
            "raises at the first update without one): e.g. rollout_rs=token_k1 rollout_rs_threshold=0.5_2.0, the "
            "bounds of pi_train / pi_rollout a token must keep (verl's docs/algo/rollout_corr.md)."
        )
    if mode == BYPASS_LOSS_MODE and not bypass:
        problems.append(
            f"{POLICY_LOSS}.loss_mode={mode!r} is verl's loss for bypass mode; set "
            f"{CORRECTION}.bypass_mode=true (the recipe's default; the trainer selects this loss "
            f"itself), or a loss of decoupled mode such as {POLICY_LOSS}.loss_mode=vanilla."
        )
    if mode not in (None, "vanilla", BYPASS_LOSS_MODE) and bypass:
        problems.append(
            f"{POLICY_LOSS}.loss_mode={mode!r} with {CORRECTION}.bypass_mode=true (the recipe's default): the actor "
            f"would run verl's bypass-mode loss in its place (PPO clip or REINFORCE on the rollout's log-probs, "
            f"{CORRECTION}.loss_type). Set "
            f"{' '.join(DECOUPLED_OVERRIDES)} (decoupled PPO: old log-probs recomputed, token-level IS)."
        )
    return Problems(problems)


def _policy_loss(name: str, verl_loss: Callable | None = None, option: str = "") -> Callable:
    """Register ``term(ratio, log_prob, old_log_prob, advantages, response_mask, config)``, which returns the
    per-token loss and its metrics, as verl's policy loss ``name``, with verl's signature: the loss is weighted by
    ``rollout_is_weights``, aggregated by ``agg_loss`` and reported with ``actor/ppo_kl``. With ``verl_loss``, that
    function is called unchanged instead unless ``policy_loss.<option>`` is set."""

    def register(term: Callable) -> Callable:
        def loss(
            old_log_prob: torch.Tensor,
            log_prob: torch.Tensor,
            advantages: torch.Tensor,
            response_mask: torch.Tensor,
            loss_agg_mode: str = "token-mean",
            config: ActorConfig | None = None,
            rollout_is_weights: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            assert config is not None
            if verl_loss is not None and not getattr(config.policy_loss, option, False):
                return verl_loss(
                    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
                )
            log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # as verl's losses clamp it
            ratio, ppo_kl = torch.exp(log_ratio), verl_F.masked_mean(-log_ratio, response_mask)
            pg_losses, metrics = term(ratio, log_prob, old_log_prob, advantages, response_mask, config)
            if rollout_is_weights is not None:
                pg_losses = pg_losses * rollout_is_weights
            pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
            return pg_loss, {"actor/ppo_kl": ppo_kl.detach().item(), **metrics}

        loss.__name__ = loss.__qualname__ = f"compute_policy_loss_{name}"
        loss.__doc__ = term.__doc__
        return register_policy_loss(name)(loss)

    return register


@_policy_loss("reinforce")
def compute_policy_loss_reinforce(ratio, log_prob, old_log_prob, advantages, response_mask, config):
    """Plain REINFORCE, ``-A * log pi`` (ROLL's ``vanilla``; verl's ``vanilla`` is PPO-clip). No ratio, no clip."""
    return -advantages * log_prob, {}


@_policy_loss("kimi15")
def compute_policy_loss_kimi15(ratio, log_prob, old_log_prob, advantages, response_mask, config):
    """Kimi k1.5 (arXiv 2501.12599, eq. 3): ``-A * log pi + tau/2 * (log pi - log pi_old)^2``.

    The paper squares the log-ratio of the whole response; here, as in ROLL, the penalty is per
    token, so it aggregates with every ``loss_agg_mode`` like the REINFORCE term.
    """
    tau = config.policy_loss.kimi15_tau
    return -advantages * log_prob + 0.5 * tau * (log_prob - old_log_prob).square(), {}


@_policy_loss("tis_pg")
def compute_policy_loss_tis_pg(ratio, log_prob, old_log_prob, advantages, response_mask, config):
    """Truncated-IS REINFORCE (ROLL's ``tis``): ``-sg(clip(pi/pi_old, lo, hi)) * A * log pi``.

    ``lo, hi`` = ``tis_lower_bound, tis_upper_bound``. ``actor/pg_clipfrac`` is the share of tokens
    truncated from above, ``actor/pg_clipfrac_lower`` from below.
    """
    low, high = config.policy_loss.tis_lower_bound, config.policy_loss.tis_upper_bound
    weight = torch.clamp(ratio, min=low, max=high).detach()
    return -weight * advantages * log_prob, {
        "actor/pg_clipfrac": verl_F.masked_mean((ratio > high).float(), response_mask).item(),
        "actor/pg_clipfrac_lower": verl_F.masked_mean((ratio < low).float(), response_mask).item(),
    }


# topr splits by score (the paper, ROLL), which verl's policy-loss signature does not carry: the actor's loss
# runs inside ``with_sample_scores``, which publishes the micro-batch's sample scores here.
_SAMPLE_SCORES: ContextVar[torch.Tensor | None] = ContextVar("sample_scores", default=None)


def sample_scores_of(data) -> torch.Tensor | None:
    """Each sample's score (its ``token_level_scores`` summed over the response), or None when absent."""
    scores = data.get("token_level_scores", None)
    if scores is None:
        return None
    if scores.is_nested:
        return torch.stack([row.sum() for row in scores.unbind()])
    return scores.sum(dim=-1)


def with_sample_scores(loss_fn: Callable) -> Callable:
    """verl's actor loss (``ppo_loss(config, model_output, data, dp_group)`` with its config bound), with the
    micro-batch's sample scores readable by the policy loss it calls."""

    @functools.wraps(loss_fn)
    def loss(*args, **kwargs):
        # The engines call it with keywords (model_output=, data=, dp_group=; the distillation path as a logits
        # processor with student_logits=, data=, data_format=): pass everything through.
        data = kwargs["data"] if "data" in kwargs else args[1]
        published = _SAMPLE_SCORES.set(sample_scores_of(data))
        try:
            return loss_fn(*args, **kwargs)
        finally:
            _SAMPLE_SCORES.reset(published)

    return loss


def _positive_samples(advantages: torch.Tensor, config: ActorConfig) -> torch.Tensor:
    """topr's split, per token: the sample's score > 0 (``topr_split=score``) or the token's advantage > 0."""
    split = getattr(config.policy_loss, "topr_split", "score")
    if split == "advantage":
        return advantages > 0
    scores = _SAMPLE_SCORES.get()
    if scores is None:
        raise OffPolicyCorrectionError(
            "policy_loss.loss_mode=topr splits samples by their score, but the actor's loss got none "
            "(token_level_scores missing from the batch, or the actor worker is not the recipe's). Set "
            "+actor_rollout_ref.actor.policy_loss.topr_split=advantage to split by the advantage's sign instead."
        )
    if scores.shape[0] != advantages.shape[0]:
        raise OffPolicyCorrectionError(
            f"topr got {scores.shape[0]} sample scores for a micro-batch of {advantages.shape[0]} samples."
        )
    return (scores.to(advantages.device) > 0)[:, None].expand_as(advantages)


@_policy_loss("topr")
def compute_policy_loss_topr(ratio, log_prob, old_log_prob, advantages, response_mask, config):
    """Tapered Off-Policy REINFORCE (arXiv 2503.14286, eq. 8).

    Positive samples (``topr_split``) take the plain REINFORCE term ``-w+ * A * log pi``; the others take it tapered
    by the stop-gradient ratio truncated to [0, 1]: ``-w- * sg(clip(pi/pi_old, 0, 1)) * A * log pi``
    (``w+, w-`` = ``topr_positive_weight, topr_negative_weight``).

    ``actor/pg_clipfrac`` is the share of tokens whose ratio the taper cut to 1 (negative tokens with
    pi > pi_old); a ratio is never below 0, so there is no lower clip fraction.
    """
    positive_weight = config.policy_loss.topr_positive_weight
    negative_weight = config.policy_loss.topr_negative_weight
    positive = _positive_samples(advantages, config)
    weight = torch.where(positive, positive_weight, negative_weight * torch.clamp(ratio, max=1.0)).detach()
    return -weight * advantages * log_prob, {
        "actor/pg_clipfrac": verl_F.masked_mean((~positive & (ratio > 1.0)).float(), response_mask).item(),
        "actor/topr_positive_frac": verl_F.masked_mean(positive.float(), response_mask).item(),
    }


_VERL_CISPO = core_algos.compute_policy_loss_cispo  # verl's own, whatever the registry holds


@_policy_loss("cispo", verl_loss=_VERL_CISPO, option="cispo_use_unified_mask")
def compute_policy_loss_cispo(ratio, log_prob, old_log_prob, advantages, response_mask, config):
    """verl's CISPO (arXiv 2506.13585), with ROLL's ``cispo_use_unified_mask`` as an option.

    Without the option (the default) this is verl's own function, called unchanged. With it, the tokens
    PPO-clip would leave alone, advantage > 0 with pi/pi_old > 1 + clip_ratio_high and advantage < 0 with
    pi/pi_old < 1 - clip_ratio_low, get no gradient; the others keep CISPO's ``-sg(clip(r)) * A * log pi``.
    """
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    masked = ((advantages > 0) & (ratio > 1 + high)) | ((advantages < 0) & (ratio < 1 - low))
    weight = torch.clamp(ratio, 1 - low, 1 + high).detach() * (~masked)
    return -weight * advantages * log_prob, {
        "actor/pg_clipfrac": verl_F.masked_mean(((ratio < 1 - low) | (ratio > 1 + high)).float(), response_mask).item(),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/cispo_masked_frac": verl_F.masked_mean(masked.float(), response_mask).item(),
    }
