"""``python -m recipe.nemo_gym.reporting <metrics.jsonl>``: the report's command (:func:`~recipe.nemo_gym.reporting.
report.main`). The name was a module before it was this package; ``-m`` keeps answering to it."""

from recipe.nemo_gym.reporting.report import main

raise SystemExit(main())
