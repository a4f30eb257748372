"""The seam of a resumed turn, with vLLM 0.31's own detokenizer and output classes (``nemo_gym_adapter.vllm.resume``).

A turn cut after ``k`` tokens and resumed is two engine requests: the first detokenizes its ids after the prompt, the
second after prompt + the first's ids. Each segment's output is built here exactly as the engine builds it (vLLM's
``IncrementalDetokenizer`` for the request, fed one token per step, stop strings checked by it; ``CompletionOutput``
and ``RequestOutput``), for every seam ``k`` of a text with multi-byte characters, and merged by
``vllm.resume._merged``. The merged answer must be what the uninterrupted request gives (same ids, same text, same
stop), and the control shows why the text is replayed: concatenating the segments' own texts is wrong at some seams
(a character split across the seam; measured: the resumed request's text can even restart with prompt text), and the
second segment alone never sees a stop string that began before the seam. No server: vLLM's classes in this process.
"""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.integration

TEXT = "Héllo wörld 😀🎉 漢字かな — ok done ünïcödé 👍🏽 end"
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_qwen25):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_qwen25)


def _segment(tokenizer, prompt: list[int], ids: list[int], params, finish: str):
    """The final ``RequestOutput`` the engine makes of one request that generated ``ids`` after ``prompt``: its own
    detokenizer (primed with ``prompt``) fed one id per step, ended by a stop string it finds (finish ``stop``) or
    with ``finish``; the ids kept up to the token that completed a stop string, as vLLM keeps them."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    request = types.SimpleNamespace(request_id="r", prompt_token_ids=prompt, prompt_embeds=None, sampling_params=params)
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    kept, stop = [], None
    for token in ids:
        kept.append(token)
        stop = detokenizer.update([token], False)
        if stop is not None:
            finish = "stop"
            break
    logprobs = [{t: _logprob(t)} for t in kept]
    text = detokenizer.get_next_output_text(True, False)
    out = CompletionOutput(0, text, kept, None, logprobs, finish_reason=finish, stop_reason=stop)
    return RequestOutput("r", None, list(prompt), None, [out], finished=True)


def _logprob(token: int):
    from vllm.logprobs import Logprob

    return Logprob(-(token % 97) / 10, 1, None)


def _params(**kw):
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(max_tokens=500, output_kind=RequestOutputKind.FINAL_ONLY, **kw)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_every_seam_gives_the_uninterrupted_answer_and_the_segments_own_texts_do_not(tokenizer, skip_special_tokens):
    from nemo_gym_adapter.vllm import resume

    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    params = _params(skip_special_tokens=skip_special_tokens)
    whole = _segment(tokenizer, prompt, ids, params, "length").outputs[0]
    wrong_seams = []
    for k in range(len(ids) + 1):
        first = _segment(tokenizer, prompt, ids[:k], params, "abort")
        rest = _segment(tokenizer, prompt + ids[:k], ids[k:], params, "length")
        merged = resume._merged([first, rest], [3, 4], tokenizer, params)
        done = merged.outputs[0]
        assert list(done.token_ids) == ids and done.text == whole.text, k
        assert [next(iter(p)) for p in done.logprobs] == ids  # each position's own log-prob, in order
        assert merged.prompt_token_ids == prompt and done.finish_reason == "length"
        if first.outputs[0].text + rest.outputs[0].text != whole.text:
            wrong_seams.append(k)
    assert wrong_seams, "the segments' own texts always agreed: the control shows nothing"
    print(f"\n[seam] {len(wrong_seams)} of {len(ids) + 1} seams: the segments' own texts differ from the answer's")


@pytest.mark.parametrize("include_stop", [False, True])
def test_a_stop_string_across_the_seam_ends_the_answer_where_the_uninterrupted_turn_ends(tokenizer, include_stop):
    """``stop=["wörld 😀"]``: cut anywhere inside it, the first segment cannot match it and the resumed one cannot see
    its start; the merged answer still ends where vLLM ends the uninterrupted turn (ids through the token that
    completed it, text without it unless ``include_stop_str_in_output``), and the tokens after it are counted."""
    from nemo_gym_adapter.vllm import resume

    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    params = _params(stop=["wörld 😀"], include_stop_str_in_output=include_stop)
    whole = _segment(tokenizer, prompt, ids, params, "length").outputs[0]
    assert whole.finish_reason == "stop" and len(whole.token_ids) < len(ids)
    across = 0
    for k in range(1, len(whole.token_ids)):
        first = _segment(tokenizer, prompt, ids[:k], params, "abort")
        rest = _segment(tokenizer, prompt + ids[:k], ids[k:], params, "length")
        seam_stop = rest.outputs[0].stop_reason is None  # the resumed request alone ran past the stop
        before = resume.counters()["seam_cut_tokens"]
        done = resume._merged([first, rest], [3, 4], tokenizer, params).outputs[0]
        assert list(done.token_ids) == list(whole.token_ids) and done.text == whole.text, k
        assert (done.finish_reason, done.stop_reason) == ("stop", "wörld 😀"), k
        assert len(done.logprobs) == len(whole.token_ids)
        if seam_stop:
            across += 1
            assert resume.counters()["seam_cut_tokens"] - before == len(ids) - len(whole.token_ids)
    assert across, "no seam fell inside the stop string: the control shows nothing"
