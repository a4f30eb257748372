"""The run's hydra config (verl's tree with our ``nemo_gym:`` section), read, validated and translated once at
start-up: ``load`` (:func:`~recipe.nemo_gym.config.load.load_config`: our section plus the verl keys the adapter
depends on, every problem reported at once naming the dotted key), ``checks`` (the rules across verl's keys and ours),
``sampling`` (verl's rollout sampling keys sent with every request), ``gym_settings`` (the section as the library's
configs), ``resolvers`` (the ``${ngv_...}`` resolvers the YAML uses).

The lowest room of the recipe: imports :mod:`nemo_gym_adapter` only, never verl (a config error answers in about a
second, before any heavy import) and no other room of the recipe.
"""
