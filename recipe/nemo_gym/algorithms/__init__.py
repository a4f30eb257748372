"""What GRPO and co compute on Gym's samples: ``masked_grpo`` (the ``masked_grpo`` estimator: masked samples out of
their group's baseline), ``masked_estimators`` (verl's own outcome estimators with masked samples kept out),
``gdpo`` (GDPO on the v1 trainer), ``outcomes`` (what a finished rollout tells the trainer besides its tokens:
``gym_outcome``, reward components, group verdicts, the readable dump -- here because the managers and ``gdpo``
both read it), ``rollout_correction`` (verl's rollout-correction metrics on an all-masked step), ``logprob_guard``
(``nemo_gym.trusted_logprobs``).

Imports :mod:`~recipe.nemo_gym.config`, the library and verl's algorithm code (lazily); never the managers or the
trainer wiring, which import it.
"""
