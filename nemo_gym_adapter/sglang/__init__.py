"""Components 1-2 on SGLang: everything that touches SGLang's code (0.5.12, verl 0.9.1's ``verl[sglang]`` pin).

``request_ids`` (the token-ID fields of a request's raw body, which SGLang's request model drops), ``hooks`` (the
splice in SGLang's chat-template render, and the guard on its named conversation templates), ``answer`` (the token ids
and log-prob tokens Gym reads, in vLLM's shape; an aborted generation answers 503), ``patch`` (installed in this
process or inside verl's ``sglang_server_*`` actors via Ray, with a report like the vLLM one). The token math is
:mod:`nemo_gym_adapter.tokens`, the same code the vLLM hook runs; SGLang is imported lazily, inside the server process.
docs/SGLANG.md has what a GPU user sets and what was executed here. Imported by the recipe; imports tokens, access,
wire, runtime and the flat modules only (never :mod:`nemo_gym_adapter.vllm`).
"""
