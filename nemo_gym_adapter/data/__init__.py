"""Rows and their routing: what a Gym JSONL row is and which environment it goes to.

``dataset`` (verl's ``data.custom_cls``: Gym JSONL -> verl rows, errors naming ``file:line``), ``store`` (the validated
rows' content-keyed, memory-mapped Arrow cache), ``rows`` (one row's contract), ``jsonl`` (lines as editors write
them), ``routing`` (row -> environment -> Gym servers), ``env_sampling`` (``nemo_gym.env_weights``). Imported by gym,
rollouts, collect and the recipe; imports wire (the row models), runtime and the flat modules only.
"""
