"""A run's metrics file -> its report: ``report`` (the report and its command, ``python -m recipe.nemo_gym.reporting``
through ``__main__``), ``curve`` (the metrics file -> its curves: reward per environment, masked rate, step time,
validation success), ``plot`` (the reward-curve PNG).

Imports the library only (errors); ``main`` writes the report at the end of a run.
"""
