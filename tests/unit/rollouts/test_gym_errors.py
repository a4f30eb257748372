"""Where a Gym /run error started, read from Gym's inner-server error chain (bodies recorded from Gym 0.7's stock
environments in the catalogue sweep, docs/GYM_ENVIRONMENTS.md)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.rollouts.gym_errors import gym_error_origin

# grl_tetris: the resources server's /step answered 400 to an action it cannot parse; the gymnasium agent failed
TETRIS = (
    '"Hit an exception in GymnasiumAgent___grl_tetris_gymnasium_agent calling an inner server: '
    'b\'{\\"detail\\":\\"No <action>Left|Right|Down</action> tags found in response.\\"}\'"'
)
# scicode: its /verify raised on a data file Gym does not ship
SCICODE = (
    '"Hit an exception in ScicodeAgent___scicode_agent calling an inner server: b\'\\"RuntimeError(\\\\\\\\\\"'
    'test_data_fpath is not configured. Stage SciCode\'s test_data.h5\\\\\\\\\\")\\"\'"'
)
# asr_with_pc: audio rows sent to a text-only model; vLLM refused, through Gym's model server
ASR = (
    "Hit an exception in SimpleAgent___asr_with_pc_simple_agent calling an inner server: b'\\\"Hit an exception "
    'in VLLMModel___policy_model calling an inner server: b\\\'{\\"error\\": \\"tiny is not a multimodal model\\"}'
)
# a vLLM replica that went away: the model server could not connect; the agent wrapped its answer
DEAD = (
    "Hit an exception in SimpleAgent___a calling an inner server: b'\"ClientConnectorError(ConnectionKey("
    "host='127.0.0.1', port=9), ConnectionRefusedError(111, 'Connect call failed'))\"'"
)


@pytest.mark.parametrize(
    ("body", "origin"),
    [
        (TETRIS, "environment"),
        (SCICODE, "environment"),
        (ASR, "model"),
        (DEAD, "transport"),
        ('"Request was cancelled"', None),  # not a chain: a plain request failure
        ("<html>502 Bad Gateway</html>", None),
    ],
)
def test_the_innermost_hop_says_where_an_error_started(body, origin):
    assert gym_error_origin(body) == origin
