"""Do two token spans spell the same input? The splice's answer to "retokenized, not edited" (issue 19 item 2).

A conversation's earlier ``prompt_token_ids`` may spell a system, user or tool message in other tokens than the chat
template's render of it today (the same characters, another BPE split: a client that tokenized a word itself, NeMo
RL's "Skinny in two tokens"). The model saw exactly those ids, so they are the history to keep; only a change of the
*text* is an edit. :class:`SameText` decides that for two spans that both start right after a common turn end (or
at the start of the sequence) and end right before one:

- the added/special tokens (``TurnTemplate.added_ids``: ``<|im_start|>``, role headers, ``<tool_call>``) must be the
  same ids in the same order: a special token spelled in plain pieces is another input to the model, never a split;
- the decoded texts must be equal, decoded exactly (no clean-up of tokenization spaces, special tokens kept: the
  caller's ``decode`` must be that; ``vllm.hooks`` builds it), and must not contain U+FFFD (a byte sequence that does
  not decode cannot be compared as text);
- the caller passes the common turn end before both spans as their first token when there is one, so a tokenizer
  that drops a word's leading space at the start of a decode (SentencePiece's ``Metaspace``) cannot hide an edit of
  that space.

Decoding a span on its own is exact for the templates in scope because turn ends are added tokens that the tokenizer
splits off first: no BPE merge crosses them. Cost: one decode of each span, on the error path of the token-exact
comparison only (the walk in :mod:`history_check` calls it once per differing unit and then continues with slice
comparisons, so the check stays linear in the prompt).

Imported by :mod:`history_check` and :mod:`required_prefix` (pure token math, no vLLM).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class SameText:
    """``decode`` (exact: ids -> text) and the tokenizer's added/special ids; called on two spans (module doc)."""

    decode: Decode
    special_ids: Collection[int] = frozenset()

    def __call__(self, a: Sequence[int], b: Sequence[int]) -> bool:
        special = self.special_ids
        if special and [t for t in a if t in special] != [t for t in b if t in special]:
            return False
        text = self.decode(list(a))
        return "\ufffd" not in text and text == self.decode(list(b))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, special_ids: Collection[int]) -> SameText | None:
        """The comparison with ``tokenizer``'s exact decode: special tokens kept, no clean-up of tokenization spaces
        (a clean-up would make " ." and "." the same text). None when its ``decode`` has no such option (vLLM's
        non-Hugging-Face tokenizers): a history must then match the render token for token, as before issue 19."""
        exact = functools.partial(tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        try:
            exact([])
        except TypeError:
            return None
        return cls(exact, frozenset(special_ids))
