"""What a launch asks of the server venvs before Gym starts, from files only: which servers its configs start (Gym's
own legacy_agent relay always among them) and which of those have no venv prepared for their requirements -- a
missing link, other requirements than the ones prepared, another Gym venv. Preparing them with real pip (and the
error that names what is missing): tests/integration/gym/test_server_venvs.py; a stock environment on a fresh venvs
dir through ``collect``: tests/integration/gym/test_venvs_first_use.py."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_gym_adapter.gym import server_venvs as sv
from nemo_gym_adapter.gym import venv_prep as vp


def _gym_venv(tmp_path: Path) -> Path:
    """A directory shaped like the Gym venv, with three servers (one with requirements) and a config naming two."""
    venv = tmp_path / "gym-venv"
    site = venv / "lib" / "python3.13" / "site-packages"
    (site / "nemo_gym").mkdir(parents=True)
    (site / "numpy-2.5.5.dist-info").mkdir()
    for server, reqs in [
        ("resources_servers/calc", "-e nemo-gym[dev] @ ../../\nsympy\n"),
        ("responses_api_agents/simple_agent", "-e nemo-gym[dev] @ ../../\n"),
        ("environment_servers/legacy_agent", "-e nemo-gym[dev] @ ../../\n"),
    ]:
        (site / server).mkdir(parents=True)
        (site / server / "requirements.txt").write_text(reqs)
    cfg = site / "resources_servers/calc/configs/calc.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        "calc:\n  resources_servers:\n    calc:\n      entrypoint: app.py\n"
        "calc_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: agent.py\n"
    )
    return venv


def _prepared(venv: Path, venvs: Path, servers: dict[str, list[str]]) -> None:
    """What a preparation leaves: a .venv per server and the state file keyed by the Gym venv and requirements."""
    state: dict = {"base": sv.base_fingerprint(venv), "servers": {}, "shared": []}
    for server, reqs in servers.items():
        (venvs / server / ".venv" / "bin").mkdir(parents=True)
        (venvs / server / ".venv" / "bin" / "python").touch()
        state["servers"][server] = {"key": sv.server_key(reqs, []), "venv": "base", "why": "test"}
    (venvs / vp.STATE_FILE).write_text(json.dumps(state))


def test_a_config_starts_its_servers_and_gyms_relay(tmp_path):
    venv = _gym_venv(tmp_path)
    cfg = next(venv.glob("lib/*/site-packages/resources_servers/calc/configs/calc.yaml"))
    overrides = {"extra": {"resources_servers": {"more": {"entrypoint": "main.py"}}}, "policy_base_url": "x"}
    assert vp.servers_of([cfg], venv, overrides) == {
        "environment_servers/legacy_agent": {"app.py"},
        "resources_servers/calc": {"app.py"},
        "responses_api_agents/simple_agent": {"agent.py"},
        "resources_servers/more": {"main.py"},
    }


def test_only_servers_without_a_venv_for_their_requirements_are_unprepared(tmp_path):
    venv, venvs = _gym_venv(tmp_path), tmp_path / "venvs"
    servers = {"resources_servers/calc": {"app.py"}, "environment_servers/legacy_agent": {"app.py"}}
    assert vp.unprepared(servers, venv, venvs, ()) == list(servers)  # nothing prepared yet
    _prepared(venv, venvs, {"resources_servers/calc": ["sympy"], "environment_servers/legacy_agent": []})
    assert vp.unprepared(servers, venv, venvs, ()) == []
    calc_reqs = next(venv.glob("lib/*/site-packages/resources_servers/calc/requirements.txt"))
    calc_reqs.write_text("sympy==1.14\n")  # its requirements changed since
    assert vp.unprepared(servers, venv, venvs, ()) == ["resources_servers/calc"]


def test_another_gym_venv_makes_every_server_unprepared(tmp_path):
    venv, venvs = _gym_venv(tmp_path), tmp_path / "venvs"
    servers = {"resources_servers/calc": {"app.py"}}
    _prepared(venv, venvs, {"resources_servers/calc": ["sympy"]})
    assert vp.unprepared(servers, venv, venvs, ()) == []
    next(venv.glob("lib/*/site-packages/numpy-2.5.5.dist-info")).rename(
        sv.site_packages(venv) / "numpy-2.2.6.dist-info"
    )
    assert vp.unprepared(servers, venv, venvs, ()) == ["resources_servers/calc"]


def test_a_server_found_nowhere_is_left_to_gym_and_ours_are_found_in_extra_roots(tmp_path):
    venv, venvs = _gym_venv(tmp_path), tmp_path / "venvs"
    ours = tmp_path / "ours"
    (ours / "resources_servers/mine").mkdir(parents=True)
    (ours / "resources_servers/mine/requirements.txt").write_text("")
    servers = {"resources_servers/nowhere": {"app.py"}, "resources_servers/mine": {"app.py"}}
    assert vp.unprepared(servers, venv, venvs, ()) == []  # neither is found without the extra root
    assert vp.unprepared(servers, venv, venvs, (ours,)) == ["resources_servers/mine"]
