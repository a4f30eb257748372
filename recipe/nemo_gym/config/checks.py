"""The recipe-level rules: combinations of verl's keys and ours that cannot train correctly with Gym rollouts.

Each rule takes the values :func:`recipe.nemo_gym.config.load.load_config` read (no config access here: the rules
are pure and testable on their own) and appends one problem per broken rule to ``problems``: the dotted key, the bad
value and the fix, so that :func:`~recipe.nemo_gym.config.load.load_config` reports every problem at once.

- the engine (``actor_rollout_ref.rollout.name``): the engines the token-ID patch supports, and what SGLang needs
  from verl's rollout keys (docs/SGLANG.md);
- the advantage estimator (``algorithm.adv_estimator``): ``masked_grpo`` or one of verl's outcome estimators whose
  masked samples ``recipe.nemo_gym.algorithms.masked_estimators`` keeps out of every group statistic; GDPO's reward keys;
- ``nemo_gym.trajectory.contiguity: split``: the trainer and the estimators that count a split rollout once;
- group filtering (``algorithm.filter_groups``): the trainer and a metric masked samples cannot decide;
- micro-batches (``*_micro_batch_size_per_gpu``): a worker's batch must divide into them;
- Ray's dashboard (``ray_kwargs.ray_init.include_dashboard``) only with ``nemo_gym.access.ray_dashboard``;
- ``actor_rollout_ref.rollout.dtype: auto`` only on the CPU platform, where ``recipe.nemo_gym.cpu.dtype`` decides it.
"""

from __future__ import annotations

from typing import Any

from nemo_gym_adapter.runtime import versions

MASKED_GRPO = (
    "masked_grpo"  # = recipe.nemo_gym.algorithms.masked_grpo.MASKED_GRPO (not imported: that module imports verl)
)
# verl's actor_rollout_ref.rollout.name values the token-ID patch supports (= recipe.nemo_gym.servers.engines.ENGINES).
ROLLOUT_ENGINES = ("vllm", "sglang")
MASKABLE_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "gdpo",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "reinforce_plus_plus_baseline",
    "gpg",
)
"""verl's outcome estimators whose masked samples ``recipe.nemo_gym.algorithms.masked_estimators`` keeps out of every group
statistic; with ``masked_grpo``, the values ``algorithm.adv_estimator`` may take."""
GDPO = "gdpo"
SESSION_ESTIMATORS = (MASKED_GRPO, "grpo")
"""The estimators that count a rollout split into several samples (``contiguity: split``) once in its group."""
OUTCOME_METRIC = "gym_outcome"  # = rollouts.groups.OUTCOME_KEY, not imported: reading a config imports no numpy


def check_engine(name: Any, skip_tokenizer_init: Any, disaggregated: Any, problems: list[str]) -> None:
    """``actor_rollout_ref.rollout.name`` is an engine the patch supports; with SGLang, verl's rollout keys it needs
    (``skip_tokenizer_init``: verl's default is true; ``disaggregation.enabled``)."""
    if name not in ROLLOUT_ENGINES:
        problems.append(
            f"actor_rollout_ref.rollout.name={name!r}: the token-ID patch supports {' and '.join(ROLLOUT_ENGINES)}; "
            "set one of them"
        )
    if name != "sglang":
        return
    if skip_tokenizer_init is not False:
        problems.append(
            f"actor_rollout_ref.rollout.skip_tokenizer_init={skip_tokenizer_init!r}: must be false with "
            "rollout.name=sglang: without a tokenizer SGLang's OpenAI chat endpoint (which Gym calls) answers 500 to "
            "every request"
        )
    if disaggregated:
        problems.append(
            f"actor_rollout_ref.rollout.disaggregation.enabled={disaggregated!r}: prefill/decode disaggregation is not "
            "supported with NeMo Gym (Gym calls each replica's one OpenAI address; the token-ID patch is not applied "
            "to the decode servers); set false"
        )


def check_estimator(estimator: Any, problems: list[str]) -> None:
    """``algorithm.adv_estimator``: ``masked_grpo`` or an estimator that keeps masked rows out of its baselines."""
    if estimator == MASKED_GRPO or estimator in MASKABLE_ESTIMATORS:
        return
    problems.append(
        f"algorithm.adv_estimator={estimator!r}: set {MASKED_GRPO} or one of verl's outcome estimators "
        f"{', '.join(MASKABLE_ESTIMATORS)}: failed Gym rollouts are masked rows, which those keep out of every group "
        "baseline (recipe.nemo_gym.algorithms.masked_estimators)"
    )


def check_split_trainer(contiguity: str, v1: bool, problems: list[str]) -> None:
    """``contiguity: split`` puts several samples per rollout: verl's v1 trainer only."""
    if not v1 and contiguity == "split":
        problems.append(
            "nemo_gym.trajectory.contiguity='split': several samples per rollout need verl's v1 trainer (sessions "
            "keyed {uid}_{session}_{i}); the legacy trainer's batch holds one sample per rollout. Set "
            "trainer.use_v1=true, or nemo_gym.trajectory.contiguity to mask or truncate"
        )


def check_split_estimator(contiguity: str, v1: bool, estimator: Any, problems: list[str]) -> None:
    """``contiguity: split`` on the v1 trainer: an estimator that counts a split rollout once in its group."""
    if v1 and contiguity == "split" and estimator not in SESSION_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} with nemo_gym.trajectory.contiguity='split': only "
            f"{' and '.join(SESSION_ESTIMATORS)} count a rollout split into several samples once in its group (verl's "
            f"v1 trainer hands every other estimator each segment as a group member); set {MASKED_GRPO}"
        )


def gdpo_reward_keys(raw: Any, estimator: Any, problems: list[str]) -> list[str]:
    """``algorithm.gdpo_reward_keys`` (``raw``: a list, one string or None) as strings; with
    ``algorithm.adv_estimator=gdpo`` a problem appended for an empty list or a key that is not a name. Both trainers
    run GDPO (on v1 the components reach verl's estimator through ``recipe.nemo_gym.algorithms.gdpo``)."""
    keys = [raw] if isinstance(raw, str) else list(raw or [])
    if estimator != GDPO:
        return [str(k) for k in keys]
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if not keys or bad:
        problems.append(
            f"algorithm.gdpo_reward_keys={keys!r}: GDPO needs a list of the environment's reward component names "
            "(the keys of reward_components in its verify response, e.g. [correctness, format])"
        )
    return [str(k) for k in keys]


def filter_groups_metric(enabled: Any, metric: Any, v1: bool, problems: list[str]) -> str | None:
    """``algorithm.filter_groups.metric`` when verl's group filter is on (``enabled``; None when off)."""
    if not enabled:
        return None
    if not v1:
        problems.append(
            "algorithm.filter_groups.enable=true: verl 0.9.1's legacy trainer has no group filtering (only its v1 "
            "trainer's replay buffer filters groups); set trainer.use_v1=true or algorithm.filter_groups.enable=false"
        )
    if metric in (None, "", "reward"):
        problems.append(
            f"algorithm.filter_groups.metric={metric!r}: with Gym set {OUTCOME_METRIC} (Gym's verified reward of each "
            "valid sample; masked samples never decide a group) or a reward component's name; 'reward' reads "
            "rm_scores, where a masked sample counts as a real 0"
        )
    return str(metric) if metric else None


def check_trusted_logprobs(enabled: bool, verl_bypass: Any, problems: list[str]) -> None:
    """``nemo_gym.trusted_logprobs.enable`` with verl's own ``bypass_mode: true``: verl would never recompute, so the
    guard (``recipe.nemo_gym.algorithms.logprob_guard``, which switches that key per step) could not check anything."""
    if enabled and verl_bypass:
        problems.append(
            "algorithm.rollout_correction.bypass_mode=true with nemo_gym.trusted_logprobs.enable=true: verl's bypass "
            "never recomputes the old log-probs, so the guard could not check them; set bypass_mode=false (the guard "
            "switches it per step) or nemo_gym.trusted_logprobs.enable=false"
        )


def check_micro_batches(
    *,
    strategy: Any,
    train_batch_size: Any,
    n: Any,
    world_size: Any,
    ulysses_size: Any,
    mini_batch: Any,
    update_micro: Any,
    update_dynamic: Any,
    logprob_micro: Any,
    logprob_dynamic: Any,
    problems: list[str],
) -> None:
    """verl 0.9.1's engine workers split a worker's batch into micro-batches of a fixed size and assert that it
    divides (``verl.workers.engine.utils.prepare_micro_batches``): a config that breaks it fails at step 1's first
    log-prob, minutes after the launch, with no key named. A worker's batch is ``train_batch_size x n`` over the data
    parallel size (the log-probs) and ``ppo_mini_batch_size x n`` over it (each update). Checked for FSDP only (the
    data parallel size is then the world over Ulysses'); dynamic batch sizes and values that are not integers
    (another check names those) are left alone."""
    if strategy not in ("fsdp", "fsdp2"):
        return
    values = (train_batch_size, n, world_size, ulysses_size, mini_batch)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        return
    if world_size % ulysses_size:  # also ulysses_size > world_size
        return
    dp = world_size // ulysses_size
    for key, micro, dynamic, rows, what in (
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            logprob_micro,
            logprob_dynamic,
            train_batch_size,
            "data.train_batch_size",
        ),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            update_micro,
            update_dynamic,
            mini_batch,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
        ),
    ):
        if dynamic is True or not isinstance(micro, int) or isinstance(micro, bool) or micro < 1:
            continue
        per_worker, uneven = divmod(rows * n, dp)
        if uneven or per_worker % micro:
            fits = [] if uneven else [d for d in range(1, per_worker + 1) if per_worker % d == 0]
            problems.append(
                f"{key}={micro}: a worker's batch is {what} {rows} x rollout.n {n} over {dp} data-parallel "
                f"worker(s) = {rows * n / dp:g} samples, which verl's engine cannot split into micro-batches of {micro}; "
                f"use a divisor of it ({', '.join(map(str, fits[-4:])) or 'none: fix the batch sizes'}) or a "
                "dynamic batch size"
            )


def check_ray_dashboard(include_dashboard: Any, ray_dashboard: bool, problems: list[str]) -> None:
    """Ray's dashboard asked for (``ray_kwargs.ray_init.include_dashboard: true``) while the run keeps Ray's dashboard
    and metrics exporters off (``nemo_gym.access.ray_dashboard: false``, the default): one of them must give way."""
    if include_dashboard is True and not ray_dashboard:
        problems.append(
            "ray_kwargs.ray_init.include_dashboard=true: nemo_gym.access.ray_dashboard is false, so the run starts Ray "
            "without its dashboard and metrics exporters (they answer every user of the host; docs/CLUSTER.md). Set "
            "nemo_gym.access.ray_dashboard=true for both, or drop include_dashboard"
        )


AUTO_DTYPE = "auto"  # actor_rollout_ref.rollout.dtype decided from the CPU by the driver (recipe.nemo_gym.cpu.dtype)


def check_rollout_dtype(dtype: Any, platform: Any, problems: list[str]) -> None:
    """``actor_rollout_ref.rollout.dtype: auto`` outside the CPU platform (``VERL_PLATFORM=cpu``): the driver decides
    ``auto`` from the CPU's bfloat16 instructions and the node's memory, which say nothing about a GPU engine -- and
    verl would hand the word to vLLM, whose own ``auto`` means the checkpoint's dtype."""
    if str(dtype).lower() == AUTO_DTYPE and str(platform).lower() != "cpu":
        problems.append(
            f"actor_rollout_ref.rollout.dtype=auto: decided from the CPU, on the CPU platform only (VERL_PLATFORM=cpu; "
            f"here {platform!r}); set bfloat16 (or float16) for a GPU engine"
        )


STOCK_CLAMP_FROM = (0, 32)  # the first vLLM release whose stock server clamps a budget that does not fit


def stock_vllm_clamps_budgets(vllm_version: str | None) -> bool:
    """True for a vLLM release whose stock server clamps ``max_tokens`` to the room left (0.32 on; 0.24-0.31 answer
    400). ``0.31.0+cpu`` reads as 0.31; an unreadable or unknown version as False."""
    key = versions.major_minor(vllm_version)
    return key is not None and key >= STOCK_CLAMP_FROM


def stock_budget_warning(
    patch_vllm: bool,
    prompt_length: int,
    response_length: int,
    max_model_len: int | None,
    vllm_version: str | None = None,
) -> str | None:
    """Without the patch (``nemo_gym.patch_vllm: false``), stock vLLM refuses a model call whose prompt plus its
    ``max_tokens`` -- every call asks for the whole response budget -- passes ``max_model_len``, and Gym records the
    refusal as an empty, unfinished answer (the rollout is masked ``context_overflow``). The patch clamps a call's
    budget to the room left instead. Measured on the calculator task (docs/TOKEN_PATCH.md): with 640 + 512 tokens in
    1,152, 74-94 % of the patch-off rollouts were lost that way. The room a later call needs is the prompt, the
    response budget already used and one more call's budget: a warning, not an error, since a run whose later turns are
    short may never reach it.

    From vLLM 0.32 stock vLLM clamps such a budget itself (docs/VLLM_RELEASES.md): no trap, no warning. ``vllm_version``
    is the installed release (None: unknown, warned as the older releases behave)."""
    if patch_vllm or max_model_len is None or stock_vllm_clamps_budgets(vllm_version):
        return None
    needed = prompt_length + 2 * response_length
    if max_model_len >= needed:
        return None
    return (
        f"nemo_gym.patch_vllm=false with actor_rollout_ref.rollout.max_model_len={max_model_len}: stock vLLM refuses a "
        f"model call whose prompt + max_tokens ({response_length}, the response budget) passes it, and such a rollout "
        f"is masked context_overflow (the patch clamps the call instead). A later call can need prompt_length "
        f"{prompt_length} + the response so far + {response_length}: give max_model_len >= {needed}"
    )
