"""Component 1 in the recipe: verl's rollout server replicas. ``engines`` (the engine
``actor_rollout_ref.rollout.name`` selects -- vLLM or SGLang --: its server actors, its patch, whether it can start
here), ``replicas`` (the replicas behind verl's ``llm_client``: the patch inside each through Ray, the tokenizer ids,
the weight version each serves).

Imports :mod:`~recipe.nemo_gym.config` and the library; verl lazily, inside functions.
"""
