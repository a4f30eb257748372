"""Component 4: one step's rollout orchestration, trainer-agnostic.

``core`` (rows -> Gym ``/run`` -> outcomes, per-row callback, one :class:`~nemo_gym_adapter.rollouts.core.StepResult`),
``client`` (HTTP with one capped retry point), ``trajectory`` (a result's token trajectory: contiguity, masks,
log-probs, reward, budgets), ``model_calls``, ``padding`` (the legacy trainer's padded batch), ``samples`` (the v1
trainer's unpadded samples), ``metrics``, ``validation`` (a validation pass per environment), ``row_echo`` (a result
that answers another row: the client's ``wrong_row``). Imported by the recipe and collect; imports gym, data, access,
wire, console, runtime and the flat modules.
"""
