"""The ``AgentLoopManager`` subclasses verl creates (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``):
``base`` (what both share: start-up -- replicas, patch, Gym started or attached, the rollout core --, validation rows,
the engine probe, shutdown), ``legacy`` (``NemoGymAgentLoopManager``, verl's legacy trainer: a padded ``DataProto``),
``v1`` (``NemoGymAgentLoopManagerTQ``, verl's v1 trainer: samples into TransferQueue as Gym returns them) and
``tq_records`` (v1's records).

Imports :mod:`~recipe.nemo_gym.config`, :mod:`~recipe.nemo_gym.servers`, :mod:`~recipe.nemo_gym.algorithms`, the
library and verl's manager bases; never :mod:`~recipe.nemo_gym.trainer`, which creates them.
"""
