"""The vLLM fakes' fixtures of ``test_patch`` (fake vLLM modules, a patched fake renderer over the tiny qwen25
tokenizer), shared with the other hook tests of this directory."""

from tests.unit.vllm.test_patch import fake_vllm, fresh_patch_options, patched_renderer, qwen_tokenizer  # noqa: F401
