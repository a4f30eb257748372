"""The rollout-vs-trainer log-prob gap (``onpolicy/*``): how far the engine's log-probs of the trained tokens are from
the actor's own recomputation of them, overall, per environment when a batch mixes them, and per turn.

Why per turn: a first turn's context is the row's prompt, the same whoever renders it; a later turn's context holds
earlier turns, which a trainer without exact token ids re-renders. So a gap that grows from the first turn to the later
ones is the cost of re-rendering history, and ``never_generated`` counts the trained tokens no engine ever sampled
(``nemo_gym.trajectory.train_tokens: measure_retemplated``): they have no rollout log-prob and stay out of the gap.
Which call each token is comes with every sample as ``token_turns`` (``rollouts.trajectory.Trajectory.token_turns``).
Pure torch: no verl import; both trainers call it.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_gym_adapter.rollouts.metrics import scope_name

_KEYS = ("logprob_abs_diff_mean", "logprob_abs_diff_max", "kl_k3", "kl_k1")


def logprob_gap_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, prefix: str = "onpolicy"
) -> dict[str, float]:
    """Rollout-vs-trainer logprob gap over the sampled tokens (``response_mask == 1``); all inputs ``(B, R)``.

    * ``logprob_abs_diff_mean`` / ``_max``: |log π_rollout − log π_train| per token;
    * ``kl_k3``: E_rollout[r − log r − 1] with r = π_train / π_rollout, the K3 estimate of KL(π_rollout ‖ π_train)
      (NeMo RL's ``gen_kl_error`` is this quantity);
    * ``kl_k1``: E_rollout[log π_rollout − log π_train];
    * ``num_tokens``: how many tokens these are. NaN metrics (and 0 tokens) when the batch has none.
    """
    mask = response_mask.bool()
    n = int(mask.sum().item())
    if n == 0:
        nan = float("nan")
        return {f"{prefix}/{k}": nan for k in _KEYS} | {f"{prefix}/num_tokens": 0.0}
    delta = (old_log_probs.float() - rollout_log_probs.float())[mask]  # log r
    return {
        f"{prefix}/logprob_abs_diff_mean": delta.abs().mean().item(),
        f"{prefix}/logprob_abs_diff_max": delta.abs().max().item(),
        f"{prefix}/kl_k3": (torch.exp(delta) - delta - 1).mean().item(),
        f"{prefix}/kl_k1": (-delta).mean().item(),
        f"{prefix}/num_tokens": float(n),
    }


def logprob_gap_by_env(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    envs: Any = None,
    token_turns: torch.Tensor | None = None,
) -> dict[str, float]:
    """:func:`logprob_gap_metrics` over the batch (``onpolicy/*``) and, when the batch mixes environments (``envs``:
    each row's ``gym_env``), per environment as ``onpolicy/<env>/*``: one environment's constrained decoding (a
    grammar renormalises vLLM's log-probs) must not hide another's gap. With ``token_turns``, per turn as well
    (:func:`logprob_gap_by_turn`); the overall gap then leaves out the tokens the model never generated."""
    mask = response_mask
    out: dict[str, float] = {}
    if token_turns is not None:
        out.update(logprob_gap_by_turn(old_log_probs, rollout_log_probs, response_mask, token_turns))
        mask = response_mask * (token_turns >= 0)
    out.update(logprob_gap_metrics(old_log_probs, rollout_log_probs, mask))
    names = [str(e) for e in envs] if envs is not None else []
    if len(set(names)) > 1:
        for env in sorted(set(names)):
            rows = torch.tensor([n == env for n in names], dtype=torch.bool)
            out.update(
                logprob_gap_metrics(
                    old_log_probs[rows],
                    rollout_log_probs[rows],
                    mask[rows],
                    prefix=f"onpolicy/{scope_name(env)}",
                )
            )
    return out


def logprob_gap_by_turn(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, token_turns: torch.Tensor
) -> dict[str, float]:
    """The gap over the first model call's trained tokens (``onpolicy/first_turn/*``) and over every later call's
    (``onpolicy/later_turns/*``), the tokens the model never generated left out of both; and
    ``onpolicy/never_generated_rate``: their share of the trained tokens. All inputs ``(B, R)``; ``token_turns`` as
    ``Trajectory.token_turns`` (k + 1 on call k's tokens, negative where never generated, 0 elsewhere)."""
    trained = response_mask.bool() & (token_turns != 0)
    out = logprob_gap_metrics(old_log_probs, rollout_log_probs, trained & (token_turns == 1), "onpolicy/first_turn")
    out.update(
        logprob_gap_metrics(old_log_probs, rollout_log_probs, trained & (token_turns > 1), "onpolicy/later_turns")
    )
    n = int(trained.sum().item())
    out["onpolicy/never_generated_rate"] = float((trained & (token_turns < 0)).sum().item()) / n if n else float("nan")
    return out
