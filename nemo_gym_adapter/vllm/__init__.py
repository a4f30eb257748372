"""Components 1-2 on vLLM: everything that touches vLLM's code.

``hooks`` (where each vLLM version turns a chat request into prompt ids, and our hook there), ``patch`` (applied
inside verl's vLLM server actors via Ray, or in this process), ``abort`` (a generation aborted for a weight sync
answers 503, which Gym retries), ``prefix_render`` (the history render the splice needs), ``server`` (the standalone
patched server, ``python -m nemo_gym_adapter.vllm.server``). The token math itself lives in
:mod:`nemo_gym_adapter.tokens`; vLLM is imported lazily, inside the server process. Imported by the recipe and
collect; imports tokens, access, wire, console, runtime and the flat modules only.
"""
