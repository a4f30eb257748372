"""Tokens the sampler had no choice about, left out of the loss (``nemo_gym.trajectory.forced_token_min_logprob``).

Constrained decoding -- a grammar, structured outputs, ``allowed_token_ids``, a tool-call format an environment forces
-- renormalises the sampler's distribution over the tokens it allows. A token it *forced* comes back with log-prob
~0, while the policy being trained may give the same token a log-prob of -7 (a random or small model over a 49k
vocabulary). Policy-gradient on such a token is off-policy by construction: its importance ratio is meaningless, its
gradient ``d log p`` is large exactly where ``p`` is small, and it carries no decision the reward could credit. On the
shipped multi-environment toy (two grammar-constrained environments) training those tokens let ``actor/grad_norm``
grow from ~0.2 to 5-12 between steps 20 and 70 and made the multi-turn environment's greedy validation drop; leaving
them out of the loss kept the grad norm at ~0.3 and validation at 1.0 (``docs/BENCHMARKS.md``).

The rule is about the *sampler's* log-prob only, so it needs nothing from the trainer: a sampled token whose rollout
log-prob is at least ``min_logprob`` (e.g. ``-1e-4``: drawn with probability >= 0.9999) is not trained. For a token
the policy itself was that sure of, the loss gradient is ~0 anyway, so unconstrained runs lose nothing. A sample
whose *every* sampled token was forced keeps them all: an all-zero loss mask would read as a masked sample to the
advantage estimator (its outcome would leave the group's baseline), and such a sample has no free token to credit.
"""

from __future__ import annotations

import numpy as np


def forced_tokens(sampled_logprobs: np.ndarray, min_logprob: float | None) -> np.ndarray | None:
    """Boolean mask over the sampled tokens (span order) of those left out of the loss; ``None`` when the rule is
    off, nothing was forced, or everything was (see the module docstring)."""
    if min_logprob is None or sampled_logprobs.size == 0:
        return None
    forced = sampled_logprobs >= min_logprob
    if not forced.any() or forced.all():
        return None
    forced.setflags(write=False)
    return forced


def sampled_positions(spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Response positions of the sampled tokens, in span order (what ``sampled_logprobs`` is indexed by)."""
    if not spans:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(start, end, dtype=np.int64) for start, end in spans])
