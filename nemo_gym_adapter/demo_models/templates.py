"""Chat templates and the tokenizer training corpus of the tiny test models (data and its expansion).

The templates are written for this project; they follow the *semantics* of the real families (what the
on-policy splice has to survive) without copying the vendors' text:

- ``CHATML_TOOLS`` (Qwen2.5-like): ChatML turns, hermes-style tools listed in the system message inside
  ``<tools></tools>``, assistant tool calls as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``
  (arguments may be a JSON string or a mapping), runs of tool results merged into one ``user`` turn of
  ``<tool_response>`` blocks, ``developer`` treated as ``system``, a default system prompt when none is given.
- ``CHATML_THINK`` (Qwen3-like): the same plus reasoning. An assistant turn's ``reasoning_content`` (or a
  ``<think>...</think>`` prefix of its content) is rendered only after the last real user query; earlier
  turns lose it. The final assistant message after that query always gets a think block (possibly empty),
  a non-final one only when it has reasoning: exactly the asymmetry that breaks naive prefix re-renders.
  ``enable_thinking=False`` pre-fills an empty think block in the generation prompt.
- ``LLAMA3_JSON`` (Llama-3.1-like): ``<|begin_of_text|>`` once, header-framed turns each closed by
  ``<|eot_id|>``, tools as JSON in the first user message (default) or the system message
  (``tools_in_user_message=False``), assistant tool calls as ``{"name": ..., "parameters": ...}``,
  tool results in role ``ipython``, message content trimmed.

Every template accepts content as a string or as OpenAI content parts (vLLM may send either).
"""

from __future__ import annotations

import json
import random

# Shared Jinja helpers. ``text`` flattens OpenAI content parts; ``args`` writes tool-call arguments as
# JSON whether they arrive as a string (OpenAI wire format) or a mapping (vLLM parses them for templates).
_MACROS = r"""
{%- macro text(content) -%}
{%- if content is undefined or content is none -%}
{%- elif content is string -%}{{ content }}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro args(a) -%}
{%- if a is string -%}{{ a }}{%- elif a is undefined or a is none -%}{{ '{}' }}{%- else -%}{{ a | tojson }}{%- endif -%}
{%- endmacro -%}
"""

_CHATML_TOOL_BLOCK = (
    "# Tools\\n\\nYou can call the functions whose signatures are listed inside <tools></tools>:\\n<tools>"
)
_CHATML_TOOL_USAGE = (
    "\\n</tools>\\n\\nTo call a function, answer with a JSON object holding its name and arguments inside "
    '<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call>"
)

# Tool results: a run of consecutive tool messages becomes one user turn.
_CHATML_TOOL_RESULT = r"""
{%- elif role in ['tool', 'ipython'] -%}
{%- if loop.first or messages[loop.index0 - 1].role not in ['tool', 'ipython'] -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role not in ['tool', 'ipython'] -%}{{- '<|im_end|>\n' -}}{%- endif -%}
"""


def _chatml_system(default_system: str) -> str:
    """The system block: system/developer text, then the tool list when tools are given."""
    fallback = f"{{%- set ns.sys = '{default_system}' -%}}" if default_system else ""
    return (
        r"""
{%- set ns = namespace(sys='', has_sys=false, last_query=-1) -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
{%- set ns.sys = text(messages[0].content) -%}{%- set ns.has_sys = true -%}
{%- else -%}"""
        + fallback
        + r"""{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}{%- if ns.sys -%}{{- ns.sys + '\n\n' -}}{%- endif -%}
{{- '"""
        + _CHATML_TOOL_BLOCK
        + r"""' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '"""
        + _CHATML_TOOL_USAGE
        + r"""<|im_end|>\n' -}}
{%- elif ns.has_sys or ns.sys -%}
{{- '<|im_start|>system\n' + ns.sys + '<|im_end|>\n' -}}
{%- endif -%}
"""
    )


CHATML_TOOLS = (
    _MACROS
    + _chatml_system("You are a helpful assistant.")
    + r"""
{%- for message in messages -%}
{%- set role = 'system' if message.role == 'developer' else message.role -%}
{%- if loop.first and role == 'system' -%}
{%- elif role in ['user', 'system'] or (role == 'assistant' and not message.tool_calls) -%}
{{- '<|im_start|>' + role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- elif role == 'assistant' -%}
{{- '<|im_start|>assistant' -}}
{%- set content = text(message.content) -%}
{%- if content -%}{{- '\n' + content -}}{%- endif -%}
{%- for call in message.tool_calls -%}
{%- set f = call.function if call.function is defined else call -%}
{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + args(f.arguments) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}"""
    + _CHATML_TOOL_RESULT
    + r"""
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
)

CHATML_THINK = (
    _MACROS
    + _chatml_system("")
    + r"""
{#- The last real user query: a user turn that is not just wrapped tool responses. -#}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
{%- set q = text(message.content) -%}
{%- if not (q.startswith('<tool_response>') and q.endswith('</tool_response>')) -%}
{%- set ns.last_query = loop.index0 -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- set role = 'system' if message.role == 'developer' else message.role -%}
{%- if loop.first and role == 'system' -%}
{%- elif role in ['user', 'system'] -%}
{{- '<|im_start|>' + role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- elif role == 'assistant' -%}
{%- set content = text(message.content) -%}
{%- set reasoning = '' -%}
{%- if message.reasoning_content is string -%}
{%- set reasoning = message.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- set reasoning = reasoning.strip('\n') -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
{{- '<think>\n' + reasoning + '\n</think>\n\n' + content.lstrip('\n') -}}
{%- else -%}
{{- content -}}
{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set f = call.function if call.function is defined else call -%}
{%- if not loop.first or content -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' + args(f.arguments) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}"""
    + _CHATML_TOOL_RESULT
    + r"""
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
)

LLAMA3_JSON = (
    _MACROS
    + r"""
{%- set ns = namespace(sys='', start=0, first_user=-1, tool_text='') -%}
{%- set in_user = tools_in_user_message if tools_in_user_message is defined else true -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
{%- set ns.sys = text(messages[0].content) | trim -%}{%- set ns.start = 1 -%}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' and ns.first_user < 0 -%}{%- set ns.first_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
{%- set ns.tool_text = 'You can call the functions below. To call one, reply with only a JSON object of the form '
    + '{"name": function name, "parameters": dictionary of argument name and its value}.\n\n' -%}
{%- for tool in tools -%}{%- set ns.tool_text = ns.tool_text + (tool | tojson(indent=4)) + '\n\n' -%}{%- endfor -%}
{%- endif -%}
{{- '<|begin_of_text|>' -}}
{%- if ns.sys or (ns.tool_text and not in_user) -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if ns.tool_text and not in_user -%}{{- 'Environment: ipython\n\n' + ns.tool_text -}}{%- endif -%}
{{- ns.sys + '<|eot_id|>' -}}
{%- endif -%}
{%- for message in messages -%}
{%- set role = 'system' if message.role == 'developer' else message.role -%}
{%- if loop.index0 < ns.start -%}
{%- elif role in ['tool', 'ipython'] -%}
{%- set c = (message.content | tojson) if message.content is mapping else text(message.content) -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + c | trim + '<|eot_id|>' -}}
{%- elif role == 'assistant' and message.tool_calls -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- for call in message.tool_calls -%}
{%- set f = call.function if call.function is defined else call -%}
{%- if not loop.first -%}{{- '; ' -}}{%- endif -%}
{{- '{"name": "' + f.name + '", "parameters": ' + args(f.arguments) + '}' -}}
{%- endfor -%}
{{- '<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' -}}
{%- if loop.index0 == ns.first_user and ns.tool_text and in_user -%}{{- ns.tool_text -}}{%- endif -%}
{{- text(message.content) | trim + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""
)

# ---------------------------------------------------------------------------------------------------------
# Tokenizer training corpus. Small on purpose; ``training_corpus`` expands it deterministically
# (fixed-seed combinations) so BPE learns whole-word tokens for common words, JSON punctuation merges
# (``{"``, ``":``), tool-call shapes and digits. Words listed in ``KEY_WORDS`` are repeated until they are
# single tokens with and without a leading space: a model can then emit them in two pieces that re-encode
# to one token (the retokenization drift the on-policy splice fixes).
# ---------------------------------------------------------------------------------------------------------

KEY_WORDS = (
    "Skinny weather city temperature forecast arguments name function tool assistant user system "
    "content result error query answer search number value string object array true false null "
    "Francisco Paris London Tokyo Berlin Sydney Chicago Boston Seattle Denver"
).split()

WORDS = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see way could people my than first water been call who oil its now find long down day did get come "
    "made may part over new sound take only little work know place year live me back give most very after "
    "thing our just good sentence man think say great where help through much before line right too mean old "
    "any same tell boy follow came want show also around form three small set put end does another well large "
    "must big even such because turn here why ask went men read need land different home us move try kind "
    "hand picture again change off play spell air away animal house point page letter mother found study "
    "still learn should world high every near add food between own below country plant last school father "
    "keep tree never start earth eye light thought head under story saw left few while along might close "
    "something seem next hard open example begin life always those both paper together got group often run "
    "important until children side feet car mile night walk white sea began grow took river four carry state "
    "once book hear stop without second later miss idea enough eat face watch far real almost let above girl "
    "sometimes mountain cut young talk soon list song being leave family rain snow wind cloud sunny cloudy "
    "storm humidity celsius fahrenheit degrees today tomorrow weekly hourly report current location unit "
    "please thanks sure okay hello weather check tell me what will"
).split()

PHRASES = (
    "What is the weather in {city} today?",
    "The weather in {city} is {cond} with a temperature of {n} degrees.",
    "Please check the forecast for {city} tomorrow.",
    "I will call the get_weather tool for {city}.",
    "Skinny jeans are back, said the {adj} {noun} from {city}.",
    "The {adj} {noun} will {verb} the {noun2} before {n} pm.",
    "Let me think step by step about the {noun} and the {noun2}.",
    "The answer is {n}.",
    "Sure! The result of {n} plus {m} is {k}.",
    "Here is the {noun} you asked for: {word} {word2} {word3}.",
)

CITIES = (
    "San Francisco",
    "New York",
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Sydney",
    "Chicago",
    "Boston",
    "Seattle",
    "Denver",
    "Los Angeles",
)
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear")
TOOL_NAMES = (
    "get_weather",
    "search",
    "calculator",
    "lookup_user",
    "send_email",
    "get_time",
    "run_python",
    "read_file",
    "list_files",
    "get_stock_price",
)

CODE = r'''
def get_weather(city: str, unit: str = "celsius") -> dict:
    """Return the current weather for a city."""
    if not city:
        raise ValueError("city is required")
    return {"city": city, "temperature": 21, "unit": unit, "condition": "sunny"}


class Calculator:
    def add(self, a: int, b: int) -> int:
        return a + b

    def multiply(self, a: int, b: int) -> int:
        result = 0
        for _ in range(b):
            result = result + a
        return result


for i in range(10):
    print(f"step {i}: value = {i * i}")
import json
data = json.loads('{"name": "get_weather", "arguments": {"city": "San Francisco"}}')
assert data["name"] == "get_weather"
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
{"results": [{"title": "Weather report", "url": "https://example.com/weather", "score": 0.93}], "count": 1, "ok": true, "error": null}
'''


def training_corpus() -> list[str]:
    """The BPE training text, expanded deterministically from the embedded word lists (no global RNG)."""
    rng = random.Random(20250601)
    lines: list[str] = []
    for _ in range(30):  # every key word becomes a token both at line start and after a space
        lines.extend(f"{w} and {w}, {w.lower()} or {w.upper()}" for w in KEY_WORDS)
    nouns, verbs, adjs = WORDS[:200], WORDS[200:300], WORDS[300:]
    for _ in range(1500):
        tpl = rng.choice(PHRASES)
        lines.append(
            tpl.format(
                city=rng.choice(CITIES),
                cond=rng.choice(CONDITIONS),
                n=rng.randint(0, 999),
                m=rng.randint(0, 99),
                k=rng.randint(0, 9999),
                adj=rng.choice(adjs),
                noun=rng.choice(nouns),
                noun2=rng.choice(nouns),
                verb=rng.choice(verbs),
                word=rng.choice(WORDS),
                word2=rng.choice(WORDS),
                word3=rng.choice(WORDS),
            )
        )
    # Inflected and capitalised variants give BPE enough distinct words to reach a realistic vocabulary.
    variants = [v for w in WORDS for v in (w, w.capitalize(), w + "s", w + "ing", w + "ed", w + "er", "un" + w)]
    for _ in range(3000):
        lines.append(" ".join(rng.choice(variants) for _ in range(rng.randint(4, 14))) + rng.choice(".,;:!?"))
    for _ in range(400):
        args = {"city": rng.choice(CITIES), "unit": rng.choice(("celsius", "fahrenheit")), "days": rng.randint(1, 14)}
        call = json.dumps({"name": rng.choice(TOOL_NAMES), "arguments": args})
        lines.append(f"<tool_call>\n{call}\n</tool_call>")
        lines.append(json.dumps({"name": rng.choice(TOOL_NAMES), "parameters": args}, indent=rng.choice((None, 4))))
        reply = {"temperature": rng.randint(-20, 45), "condition": rng.choice(CONDITIONS), "humidity": rng.random()}
        lines.append(f"<tool_response>\n{json.dumps(reply)}\n</tool_response>")
    for _ in range(20):
        lines.append(CODE)
    lines.extend(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(12)) for _ in range(100))
    return lines
