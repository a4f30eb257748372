#!/usr/bin/env python
"""Where the rollout-vs-actor log-prob offset comes from: same weights, same tokens, one knob at a time.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/probe_logprob_offset.py [--family qwen25] [--hf-only]

Every number is Δ = log p(knob) - log p(reference) over the same response tokens, reported as mean Δ (the sign
shows a one-signed bias), mean |Δ| and max |Δ|. The reference is a plain Hugging Face forward (fp32, eager
attention, one unpadded row at a time, ``log_softmax`` over every row of the LM head), or verl's actor where the
row says so. The knobs:

* vocabulary rows beyond ``len(tokenizer)``: the model is the tiny model truncated to exactly ``len(tokenizer)``
  rows (``exact``), or the same weights plus rows drawn like Hugging Face's init (``pad64``: padded to a multiple
  of 64, as the tiny-model builder did before; ``+64``: 64 extra rows). The real rows are identical in all
  variants, so real-token logits are identical too; only what a softmax normalises over changes;
* the normalisation set: ``log_softmax`` over all rows vs over ``len(tokenizer)`` rows (what verl's vLLM server
  computes: ``monkey_patch_compute_logits`` sets logits beyond ``len(tokenizer)`` to -inf);
* attention implementation and dtype of the HF forward; verl's actor ``compute_log_prob`` with
  ``use_remove_padding`` false (padded batch) / true (packed), fp32 / bf16 FSDP2 mixed precision, temperature;
* vLLM through verl's own server (``LLMServerManager`` -> the CPU replica; verl's ``logprobs_mode`` default
  ``processed_logprobs``): prompt logprobs of the fixed sequences, sampled logprobs at temperature 1 / 0.7, top-p;
  and a plain vLLM server (no verl patch, vLLM's default ``raw_logprobs``).

Sequences: chat-templated prompts plus responses sampled from the model itself (seeded). Heavy (verl's FSDP2
actor, two vLLM engines): run under the machine's heavy lock. ``--hf-only`` prints the Hugging Face rows only
(seconds). Everything started (Ray, vLLM) is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import types
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

PROMPTS = [
    "What is the weather in Paris?",
    "Say something short.",
    "Tell me about the forecast for Berlin tomorrow, please.",
    "Hi",
]
RESPONSE_LENGTHS = [24, 9, 17, 24]  # unequal, so padding and packing differ between rows
PROMPT_LEN = 64
RESPONSE_LEN = 24
SAMPLED_TOKENS = 16
LOW_TEMPERATURE = 0.7


@dataclass
class Row:
    knob: str
    setting: str
    reference: str
    delta: torch.Tensor  # 1-D, one entry per compared token

    def cells(self) -> list[str]:
        d = self.delta.double()
        return [
            self.knob,
            self.setting,
            self.reference,
            str(d.numel()),
            f"{d.mean().item():+.2e}",
            f"{d.abs().mean().item():.2e}",
            f"{d.abs().max().item():.2e}",
        ]


def table(rows: list[Row]) -> str:
    head = ["knob", "setting", "vs", "tokens", "mean Δ", "mean \\|Δ\\|", "max \\|Δ\\|"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- models and data


def make_variants(base: Path, out: Path) -> dict[str, Path]:
    """``exact`` (rows == len(tokenizer)), ``pad64`` (rounded up to a multiple of 64), ``+64``: same real rows."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    n_tok = len(AutoTokenizer.from_pretrained(base))
    config = json.loads((base / "config.json").read_text())
    weights = load_file(str(base / "model.safetensors"))
    emb_key = "model.embed_tokens.weight"
    assert config["tie_word_embeddings"] and "lm_head.weight" not in weights, "variants assume a tied LM head"
    real = weights[emb_key][:n_tok].clone()
    extra = torch.randn(n_tok + 64, real.shape[1], generator=torch.Generator().manual_seed(64))
    extra *= config.get("initializer_range", 0.02)  # what from_config's init gives an embedding row
    variants = {}
    for name, rows in (("exact", n_tok), ("pad64", -(-n_tok // 64) * 64), ("+64", n_tok + 64)):
        if name == "pad64" and rows == n_tok:
            continue
        target = out / name
        shutil.copytree(base, target, ignore=shutil.ignore_patterns("*.safetensors", "tiny_model_stamp.json"))
        save_file(
            {**weights, emb_key: torch.cat([real, extra[: rows - n_tok]]).contiguous()}, target / "model.safetensors"
        )
        (target / "config.json").write_text(json.dumps({**config, "vocab_size": rows}, indent=2))
        variants[name] = target
    return variants


def make_sequences(model_dir: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids): responses sampled from the model at temperature 1 over the tokenizer's rows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(1234)
    seqs = []
    for text, length in zip(PROMPTS, RESPONSE_LENGTHS, strict=True):
        messages = [{"role": "user", "content": text}]
        prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
        prompt = prompt[-PROMPT_LEN:]
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(length):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1, : len(tok)]
                ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
        seqs.append((prompt, ids[len(prompt) :]))
    return seqs


def hf_logprobs(
    model_dir: Path, seqs, temperature: float = 1.0, rows: int | None = None, dtype=torch.float32, attn: str = "eager"
) -> list[torch.Tensor]:
    """log p(response token | prefix), one unpadded row at a time; ``rows`` limits the softmax to the first rows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).eval()
    out = []
    with torch.no_grad():
        for prompt, resp in seqs:
            logits = model(input_ids=torch.tensor([prompt + resp])).logits[0, len(prompt) - 1 : -1].float()
            if rows is not None:
                logits = logits[:, :rows]
            logp = torch.log_softmax(logits / temperature, dim=-1)
            out.append(logp.gather(-1, torch.tensor(resp)[:, None])[:, 0])
    return out


def delta(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x - y for x, y in zip(a, b, strict=True)])


# ------------------------------------------------------------------------------------------------ verl's actor


def compose(model_dir: Path, extra: list[str] = ()):
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from recipe.nemo_gym.cpu import platform as cpu_platform

    base = list(cpu_platform.CPU_ACTOR_OVERRIDES)
    keys = {o.lstrip("+").split("=")[0] for o in extra}
    base = [o for o in base if o.lstrip("+").split("=")[0] not in keys]
    rollout = "actor_rollout_ref.rollout"
    overrides = [
        *base,
        *extra,
        f"actor_rollout_ref.model.path={model_dir}",
        "trainer.use_v1=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=4",
        f"{rollout}.name=vllm",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.dtype=float32",
        f"{rollout}.load_format=auto",
        f"{rollout}.max_model_len=512",
        f"{rollout}.prompt_length={PROMPT_LEN}",
        f"{rollout}.response_length={RESPONSE_LEN}",
        f"{rollout}.max_num_seqs=8",
        f"{rollout}.max_num_batched_tokens=1024",
        f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes=64",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def actor_logprobs(config, actor_wg, tokenizer, seqs, temperature: float = 1.0) -> list[torch.Tensor]:
    """verl's ``RayPPOTrainer._compute_old_log_prob`` on the legacy padded layout (left-padded prompts)."""
    import numpy as np
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.model import compute_position_id_with_mask

    bs, pad = len(seqs), tokenizer.pad_token_id
    prompts = torch.full((bs, PROMPT_LEN), pad, dtype=torch.long)
    responses = torch.full((bs, RESPONSE_LEN), pad, dtype=torch.long)
    pmask = torch.zeros(bs, PROMPT_LEN, dtype=torch.long)
    rmask = torch.zeros(bs, RESPONSE_LEN, dtype=torch.long)
    for i, (p, r) in enumerate(seqs):
        prompts[i, PROMPT_LEN - len(p) :], pmask[i, PROMPT_LEN - len(p) :] = torch.tensor(p), 1
        responses[i, : len(r)], rmask[i, : len(r)] = torch.tensor(r), 1
    attention = torch.cat([pmask, rmask], dim=1)
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": rmask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": compute_position_id_with_mask(attention),
        },
        non_tensors={"uid": np.array([f"u{i}" for i in range(bs)], dtype=object)},
        meta_info={"temperature": temperature, "global_token_num": attention.sum(-1).tolist()},
    )
    view = types.SimpleNamespace(config=config, actor_rollout_wg=actor_wg, distillation_config=None)
    old, _ = RayPPOTrainer._compute_old_log_prob(view, batch)
    lp = old.batch["old_log_probs"]
    return [lp[i, : len(r)].float() for i, (_, r) in enumerate(seqs)]


# ------------------------------------------------------------------------------------------------------- vLLM


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def vllm_prompt_logprobs(base_url: str, model: str, seqs) -> list[torch.Tensor]:
    """The engine's log p of every given response token (``prompt_logprobs``: computed on the model's logits)."""
    out = []
    for prompt, resp in seqs:
        body = {"model": model, "prompt": prompt + resp, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        entries = _post(f"{base_url}/completions", body)["choices"][0]["prompt_logprobs"][len(prompt) :]
        out.append(torch.tensor([e[str(t)]["logprob"] for e, t in zip(entries, resp, strict=True)]))
    return out


def vllm_sample(base_url: str, model: str, seqs, **sampling) -> tuple[list, list[torch.Tensor]]:
    """Sampled continuations of the prompts with the engine's own logprob of each sampled token."""
    new_seqs, logps = [], []
    for i, (prompt, _) in enumerate(seqs):
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": SAMPLED_TOKENS,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
            "seed": 100 + i,
            **sampling,
        }
        choice = _post(f"{base_url}/completions", body)["choices"][0]
        new_seqs.append((prompt, list(choice["token_ids"])))
        logps.append(torch.tensor(choice["logprobs"]["token_logprobs"], dtype=torch.float32))
    return new_seqs, logps


# ---------------------------------------------------------------------------------------------------- phases


class Rows(list):
    def add(self, knob: str, setting: str, vs: str, got: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
        self.append(Row(knob, setting, vs, delta(got, ref)))


def hf_rows(variants: dict[str, Path], seqs, n_tok: int) -> Rows:
    rows = Rows()
    ref = {name: hf_logprobs(path, seqs) for name, path in variants.items()}
    exact = variants["exact"]
    rows.add("HF attention", "sdpa", "HF eager", hf_logprobs(exact, seqs, attn="sdpa"), ref["exact"])
    rows.add(
        "HF dtype", "bf16 weights+compute", "HF fp32", hf_logprobs(exact, seqs, dtype=torch.bfloat16), ref["exact"]
    )
    for name, path in variants.items():
        extra = json.loads((path / "config.json").read_text())["vocab_size"] - n_tok
        setting = f"len(tokenizer) rows, model {name} ({n_tok}+{extra})"
        rows.add("softmax over", setting, f"HF all rows ({name})", hf_logprobs(path, seqs, rows=n_tok), ref[name])
    for name in variants:
        if name != "exact":
            rows.add("vocab rows", f"{name}, all rows", "HF exact", ref[name], ref["exact"])
    return rows


_BF16 = [f"+actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}_dtype=bf16" for k in ("param", "reduce", "buffer")]
ACTOR_KNOBS = {
    "use_remove_padding=true (packed)": ["actor_rollout_ref.model.use_remove_padding=true"],
    "FSDP2 mixed precision bf16": _BF16,
}


def verl_rows(name: str, model_dir: Path, seqs, all_knobs: bool) -> Rows:
    """verl's actor and verl's vLLM server on one model variant (one Ray cluster, stopped at the end)."""
    import ray
    from transformers import AutoTokenizer

    from recipe.nemo_gym.cpu import platform as cpu_platform
    from tests.integration.verl_workers import spawn_cpu_actor_workers

    tok = AutoTokenizer.from_pretrained(model_dir)
    env = {"VERL_USE_EXTERNAL_MODULES": "recipe.nemo_gym.cpu.rollout"}
    cpu_platform.apply_env(env)
    ray.init(address="local", num_cpus=12, num_gpus=2, include_dashboard=False, runtime_env={"env_vars": env})
    rows, low = Rows(), LOW_TEMPERATURE
    try:
        from verl.workers.rollout.llm_server import LLMServerManager

        import recipe.nemo_gym.cpu.rollout  # noqa: F401  (the CPU replica registered as "vllm")

        config = compose(model_dir)
        t0 = time.perf_counter()
        actor = spawn_cpu_actor_workers(config, pool_name=f"probe_{name}")

        def act(sequences, temperature=1.0, cfg=config, wg=actor.actor_wg):
            return actor_logprobs(cfg, wg, tok, sequences, temperature)

        hf, actor_lp = hf_logprobs(model_dir, seqs), act(seqs)
        print(f"[{name}] actor up + compute_log_prob: {time.perf_counter() - t0:.0f}s", flush=True)
        rows.add("verl actor", f"{name}: fp32, use_remove_padding=false", "HF", actor_lp, hf)
        if all_knobs:
            hf_low = hf_logprobs(model_dir, seqs, temperature=low)
            rows.add("verl actor", f"{name}: temperature {low}", f"HF logits/{low}", act(seqs, low), hf_low)
            for label, overrides in ACTOR_KNOBS.items():
                other_cfg = compose(model_dir, overrides)
                other = spawn_cpu_actor_workers(other_cfg, pool_name=f"probe_{name}_{len(rows)}")
                try:
                    rows.add("verl actor", f"{name}: {label}", "HF", act(seqs, cfg=other_cfg, wg=other.actor_wg), hf)
                finally:
                    other.kill()

        t0 = time.perf_counter()
        manager = LLMServerManager.create(config=config, worker_group=actor.actor_wg)
        url, model = f"http://{manager.get_addresses()[0]}/v1", str(model_dir)
        print(f"[{name}] verl vLLM replica: {time.perf_counter() - t0:.0f}s", flush=True)
        engine = vllm_prompt_logprobs(url, model, seqs)
        rows.add("verl vLLM server", f"{name}: prompt_logprobs", "HF", engine, hf)
        rows.add("verl vLLM server", f"{name}: prompt_logprobs", "verl actor", engine, actor_lp)
        sampled, engine = vllm_sample(url, model, seqs, temperature=1.0)
        rows.add("verl vLLM server", f"{name}: sampled, T=1", "verl actor", engine, act(sampled))
        if all_knobs:
            sampled, engine = vllm_sample(url, model, seqs, temperature=low)
            setting = f"{name}: sampled, T={low} (processed_logprobs)"
            rows.add("verl vLLM server", setting, f"verl actor T={low}", engine, act(sampled, low))
            sampled, engine = vllm_sample(url, model, seqs, temperature=1.0, top_p=0.9)
            setting = f"{name}: sampled, T=1, top_p=0.9 (processed_logprobs)"
            rows.add("verl vLLM server", setting, "verl actor", engine, act(sampled))
    finally:
        ray.shutdown()
    return rows


def plain_vllm_rows(name: str, model_dir: Path, seqs) -> Rows:
    """A plain vLLM OpenAI server (no verl patch; vLLM's default raw_logprobs) on the same model and tokens."""
    from nemo_gym_adapter.vllm.server import start_vllm_server

    rows, low = Rows(), LOW_TEMPERATURE
    with start_vllm_server(model_dir, served_model_name="probe", log_name="vllm-probe-offset") as server:
        url = server.base_url
        rows.add(
            "plain vLLM",
            f"{name}: prompt_logprobs",
            "HF",
            vllm_prompt_logprobs(url, "probe", seqs),
            hf_logprobs(model_dir, seqs),
        )
        sampled, engine = vllm_sample(url, "probe", seqs, temperature=low)
        setting = f"{name}: sampled, T={low} (raw_logprobs)"
        rows.add("plain vLLM", setting, f"HF logits/{low}", engine, hf_logprobs(model_dir, sampled, temperature=low))
        rows.add("plain vLLM", setting, "HF T=1", engine, hf_logprobs(model_dir, sampled))
    return rows


def probe_checkpoint(model_dir: Path) -> int:
    """The one knob that matters for a real checkpoint: rows beyond ``len(tokenizer)`` and their probability mass."""
    from transformers import AutoTokenizer

    n_tok = len(AutoTokenizer.from_pretrained(model_dir))
    rows_total = json.loads((model_dir / "config.json").read_text()).get("vocab_size")
    print(f"{model_dir}: len(tokenizer)={n_tok}, vocab_size={rows_total}", flush=True)
    seqs = make_sequences(model_dir)
    row = Row(
        "softmax over",
        f"len(tokenizer) rows ({n_tok} of {rows_total})",
        "HF all rows",
        delta(hf_logprobs(model_dir, seqs, rows=n_tok), hf_logprobs(model_dir, seqs)),
    )
    print(table([row]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen25", choices=("qwen25", "qwen3", "llama3"))
    parser.add_argument("--hf-only", action="store_true", help="only the Hugging Face rows (seconds, no Ray/vLLM)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a local Hugging Face checkpoint (e.g. your GPU model): only how far verl's rollout softmax (first "
        "len(tokenizer) rows) sits above the actor's (every row) on it; no Ray, no vLLM",
    )
    args = parser.parse_args(argv)
    if args.model is not None:
        return probe_checkpoint(args.model)

    from recipe.nemo_gym.cpu import platform as cpu_platform

    cpu_platform.apply_env()  # before verl is imported anywhere in this process
    os.environ["VERL_USE_EXTERNAL_MODULES"] += ",recipe.nemo_gym.cpu.rollout"
    from transformers import AutoTokenizer

    from nemo_gym_adapter.demo_models.tiny_models import build_tiny_model

    started = time.perf_counter()
    base = build_tiny_model(args.family)
    n_tok = len(AutoTokenizer.from_pretrained(base))
    built = json.loads((base / "config.json").read_text())["vocab_size"]
    print(f"{args.family}: {base}, len(tokenizer)={n_tok}, built vocab_size={built}", flush=True)
    with tempfile.TemporaryDirectory(prefix="probe-logprob-offset-") as tmp:
        variants = make_variants(base, Path(tmp))
        seqs = make_sequences(variants["exact"])
        rows = hf_rows(variants, seqs, n_tok)
        if not args.hf_only:
            padded = "pad64" if "pad64" in variants else "+64"
            rows += verl_rows(padded, variants[padded], seqs, all_knobs=True)
            rows += verl_rows("exact", variants["exact"], seqs, all_knobs=False)
            rows += plain_vllm_rows(padded, variants[padded], seqs)
    print()
    print(table(rows))
    print(f"\n{time.perf_counter() - started:.0f}s; load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    dict(
                        zip(("knob", "setting", "vs", "tokens", "mean", "mean_abs", "max_abs"), r.cells(), strict=True)
                    )
                    for r in rows
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
