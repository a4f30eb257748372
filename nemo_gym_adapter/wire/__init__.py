"""Gym's payloads and what a replica serves, as typed models read once at the boundary: ``payloads`` (dataset rows and
``/run`` results, pydantic, extra fields kept), ``tool_calls`` (what a result's tool calls were worth, in its numeric
fields), ``policy`` (what a policy server says about itself over HTTP: model card, a log-prob probe).

Imports only the flat modules (``errors``); read by most packages above it and by the recipe.
"""
