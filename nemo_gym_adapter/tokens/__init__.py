"""Component 2's pure token math: the on-policy token-ID fix without any I/O or vLLM import.

``splice`` (the model's exact earlier tokens + the render of what follows), ``turn_template`` (a chat template's turn
ends, probed once per server), ``history_check`` (in-place edits of the history refused), ``assistant_texts``
(assistant text edited while its ids were kept). Imported by the engines' packages (:mod:`nemo_gym_adapter.vllm`,
:mod:`nemo_gym_adapter.sglang`) and tests; imports only the flat ``errors``.
"""
