"""The pure parts of per-server Gym venvs: requirement reading, what a dry-run changes, which modules a server's code
imports, and the problem lines of the import check (the real pip path: tests/integration/gym/test_server_venvs.py)."""

from __future__ import annotations

from nemo_gym_adapter.gym import server_venvs as sv


def test_requirements_keep_url_fragments_and_drop_gym_itself(tmp_path):
    (tmp_path / "requirements.txt").write_text(
        "-e nemo-gym[dev] @ ../../\n# a comment\nnumpy==2.2.6  # pinned\n"
        "tale-suite @ git+https://github.com/x/tales.git#egg=tale-suite\nNemo_Gym\n\n"
    )
    assert sv.read_requirements(tmp_path) == [
        "numpy==2.2.6",
        "tale-suite @ git+https://github.com/x/tales.git#egg=tale-suite",
    ]


def test_pyproject_requirements_and_their_uv_sources(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "code-fim"\ndependencies = ["nemo-gym[dev]", "human-eval-infilling"]\n'
        '[tool.uv.sources]\nhuman-eval-infilling = { git = "https://github.com/w/human-eval-infilling.git" }\n'
    )
    assert sv.read_requirements(tmp_path) == ["human-eval-infilling"]
    assert sv.git_sources(tmp_path) == {"human-eval-infilling": "https://github.com/w/human-eval-infilling.git"}


def test_a_dry_run_changes_what_it_would_install_at_another_version():
    run = sv.DryRun({"numpy": "2.2.6", "tiktoken": "0.14.0", "pillow": "13.0.0"})
    assert run.changes({"numpy": "2.5.5", "pillow": "13.0.0"}) == ["numpy 2.5.5 -> 2.2.6"]  # tiktoken is only new
    assert sv.constraint_lines({"ray": "2.60.0", "openai": "2.44.0", "numpy": "2"}) == ["ray==2.60.0", "openai==2.44.0"]


def test_the_modules_a_server_imports_follow_its_local_modules_and_skip_optional_ones(tmp_path):
    server = tmp_path / "resources_servers" / "env"
    (server / "tests").mkdir(parents=True)
    (server / "app.py").write_text(
        "import os, json\nimport numpy as np\nfrom nemo_gym.base import X\nfrom . import helpers\n"
        "from resources_servers.env.scoring import score\n"
        "try:\n    import optional_thing\nexcept ImportError:\n    optional_thing = None\n"
        "def later():\n    import tiktoken\n"
    )
    (server / "helpers.py").write_text("from rapidfuzz import fuzz\n")
    (server / "scoring.py").write_text("import sympy.parsing\n")
    (server / "tests" / "test_app.py").write_text("import pytest\n")
    (server / "generate_data.py").write_text("import requests\n")  # a script beside the server, never imported
    assert sv.imported_modules(server, ["app.py"]) == {"numpy", "rapidfuzz", "sympy", "tiktoken"}


def test_a_missing_module_names_the_requirement_that_should_have_provided_it():
    reqs = ["human-eval-infilling", "numpy>=2"]
    sources = {"human-eval-infilling": "https://github.com/w/h.git"}
    lines = sv.module_problems({"human_eval_infilling", "yaml"}, {"human-eval-infilling": "2.15.0"}, reqs, sources)
    assert lines == [
        "requirement human-eval-infilling is installed (2.15.0) but provides no module 'human_eval_infilling'; "
        "Gym's uv would take it from https://github.com/w/h.git (tool.uv.sources), which PyPI's "
        "human-eval-infilling is not",
        "module 'yaml' is imported but not installed, and no requirement names it",
    ]


def test_a_module_the_server_ships_in_its_own_folder_and_puts_on_sys_path_is_its_own(tmp_path):
    """iheval-like: ``ifeval/instructions_registry.py`` shipped with the server and imported bare after a sys.path
    shim is the server's module (not "imported but not installed"); its own third-party imports are still checked."""
    server = tmp_path / "resources_servers" / "env"
    (server / "ifeval").mkdir(parents=True)
    (server / "tests").mkdir()
    (server / "ifeval" / "registry.py").write_text("import checks\n")
    (server / "ifeval" / "checks.py").write_text("import langdetect\nfrom absl import logging\n")
    (server / "tests" / "vendored_only_in_tests.py").write_text("import pytest\n")
    shim = "import sys\nsys.path.insert(0, 'ifeval')\n"
    (server / "app.py").write_text(shim + "def registry():\n    import registry\n    import vendored_only_in_tests\n")
    assert sv.imported_modules(server, ["app.py"]) == {"langdetect", "absl", "vendored_only_in_tests"}
    # control: without the server putting anything on sys.path a bare import is a third-party module
    (server / "app.py").write_text("def registry():\n    import registry\n")
    assert sv.imported_modules(server, ["app.py"]) == {"registry"}
