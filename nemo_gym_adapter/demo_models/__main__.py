"""``python -m nemo_gym_adapter.demo_models``: build the tiny models (the package imports ``tiny_models``, so running
that module with ``-m`` would execute it a second time; runpy warns about exactly that)."""

from nemo_gym_adapter.demo_models.tiny_models import main

raise SystemExit(main())
