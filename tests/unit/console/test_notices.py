"""The driver's console filter (``nemo_gym_adapter.console.notices``): the known start-up notices are left out, and
everything else -- an unknown warning, an error, a traceback, verl's progress bar and metrics, our own lines -- still
reaches the console unchanged. The lines are as a CPU demo run printed them (Ray's worker prefix and colours
included)."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from nemo_gym_adapter.console.notices import KNOWN, QuietStream, known_notice, message_of, quiet_console

C, R = "\x1b[36m", "\x1b[0m"  # Ray colours a worker's prefix
NOISE = [
    f"{C}(pid=28696){R} WARNING:2026-12-07 06:41:17,019:Triton is installed, but doesn't include CPU backend. "
    "Disabling Triton.",
    f"{C}(pid=28696){R} WARNING:2026-12-07 06:41:18,590:Failed to import the DeepSelect extension (vllm._deepselect_C):"
    " No module named 'vllm._deepselect_C'",
    f"{C}(CPUvLLMHttpServer pid=29664){R} (EngineCore pid=30013) WARNING 12-07 06:42:01 [cpu_worker.py:114] "
    "libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section",
    f"{C}(CPUvLLMHttpServer pid=29664){R} INFO:2026-12-07 06:42:44,309:CPUvLLMHttpServer, replica_rank: 0, "
    "node_rank: 0, CUDA_VISIBLE_DEVICES: , master_address: 127.0.0.1, master_port: 44443, data_parallel_rpc_port: 1",
    f"{C}(CPUvLLMHttpServer pid=29664){R} Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00]",
    f"{C}(CPUvLLMHttpServer pid=29664){R} ",
    "ray init kwargs: {'num_cpus': 8, 'runtime_env': {'env_vars': {'NCCL_DEBUG': 'WARN'}}}",
    # a Python warning: its line, then its source line (one entry: the two come together)
    f"{C}(WorkerDict pid=29472){R} /x/verl/workers/engine_workers.py:123: UserWarning: "
    "Using blocking ray.get inside async actor. This blocks the event loop.\n"
    f"{C}(WorkerDict pid=29472){R}   ray.get(refs)",
]
SHOWN = [
    f"{C}(NemoGymTaskRunnerV1Impl pid=28696){R} NeMo Gym TaskRunner (v1, sync) on vm, pid 28696",
    f"{C}(NemoGymTaskRunnerV1Impl pid=28696){R} Training Progress:   3%|▎         | 1/30 [00:18<08:46, 18.17s/it]",
    f"{C}(NemoGymTaskRunnerV1Impl pid=28696){R} step:1 - actor/pg_loss:0.01 - gym/all/reward_mean:0.5",
    f"{C}(WorkerDict pid=29472){R} ERROR:2026-12-07 06:42:44,309:weight sync failed: connection refused",
    f"{C}(NemoGymTaskRunnerV1Impl pid=28696){R} Traceback (most recent call last):",
    f'{C}(NemoGymTaskRunnerV1Impl pid=28696){R}   File "/x/verl/trainer/main_ppo.py", line 12, in run',
    f"{C}(NemoGymTaskRunnerV1Impl pid=28696){R} RuntimeError: vLLM engine died",
    f"{C}(CPUvLLMHttpServer pid=29664){R} (EngineCore pid=30013) WARNING 12-07 06:42:01 [scheduler.py:9] "
    "KV cache is full; preempting requests",
    "/x/torch/nn/modules/module.py:1: UserWarning: an unknown warning",
    "  its source line",
    "[nemo-gym-verl] first 5 steps mean reward: 0.491",
    "error: actor_rollout_ref.rollout.name=sglang cannot start here",
]


def _through_filter(lines: list[str], chunks: int = 1) -> tuple[str, QuietStream]:
    out = io.StringIO()
    stream = QuietStream(out)
    text = "".join(line + "\n" for line in lines)
    step = max(1, len(text) // chunks)
    for i in range(0, len(text), step):  # writes that cut lines anywhere, as a pipe's reads do
        stream.write(text[i : i + step])
    stream.close()
    return out.getvalue(), stream


@pytest.mark.parametrize("chunks", [1, 7, 500])
def test_known_notices_are_left_out_and_every_other_line_passes_unchanged(chunks):
    mixed = [line for pair in zip(SHOWN, NOISE + NOISE[:4], strict=True) for line in pair]
    text, stream = _through_filter(mixed, chunks)
    assert text.splitlines() == SHOWN
    assert sum(stream.dropped.values()) == 11  # the empty worker line and the warning's source line not counted


def test_the_control_without_the_list_shows_every_notice():
    out = io.StringIO()
    stream = QuietStream(out, notices=())
    stream.write("".join(line + "\n" for line in NOISE))
    stream.close()
    shown = out.getvalue().splitlines()
    assert shown == [line for entry in NOISE for line in entry.split("\n") if not line.endswith(f"{R} ")]
    assert len(shown) == len(NOISE)  # the two-line warning in, the empty worker line out
    assert all(known_notice(line) is not None for line in NOISE[:5])


def test_a_left_out_warnings_source_line_goes_with_it_and_no_other_line_does():
    worker = f"{C}(A pid=1){R} "
    other = f"{C}(B pid=2){R} "
    lines = [
        worker + "/x.py:1: UserWarning: Using blocking ray.get inside async actor.",
        other + "  indented output of another worker",  # not the warning's source line
        worker + "  ray.get(x)",  # no longer right after the warning: shown
    ]
    text, _ = _through_filter(lines)
    assert text.splitlines() == lines[1:]


def test_the_ray_prefix_and_colours_are_read_off_before_matching():
    who, message = message_of(f"{C}(WorkerDict pid=29472, ip=10.0.0.5){R} Before FSDP, memory allocated (GB): 0.79")
    assert (who, message) == ("WorkerDict pid=29472, ip=10.0.0.5", "Before FSDP, memory allocated (GB): 0.79")
    assert message_of("(not a ray prefix) text") == ("", "(not a ray prefix) text")


def test_every_notice_says_who_prints_it_and_why_it_is_harmless_and_none_matches_our_lines():
    assert all(n.text.strip() and n.source and n.why for n in KNOWN)
    assert len({n.text for n in KNOWN}) == len(KNOWN)
    for line in SHOWN:
        assert known_notice(line) is None, line


def test_quiet_console_wraps_both_streams_and_puts_them_back_and_full_turns_it_off(capsys):
    before = sys.stdout, sys.stderr
    with quiet_console({}) as wrappers:
        assert len(wrappers) == 2 and (sys.stdout, sys.stderr) == tuple(wrappers)
        print(NOISE[0])
        print(SHOWN[3], file=sys.stderr)
        print("partial line without its newline", end="")
    assert (sys.stdout, sys.stderr) == before
    captured = capsys.readouterr()
    assert captured.out == "partial line without its newline" and captured.err == SHOWN[3] + "\n"
    with quiet_console({"NGV_CONSOLE": "full"}) as wrappers:
        assert wrappers == [] and sys.stdout is before[0]


def test_writes_from_several_threads_keep_whole_lines():
    out = io.StringIO()
    stream = QuietStream(out)

    def writer(tag: str) -> None:
        for i in range(200):
            stream.write(f"{tag} line {i}\n")
            stream.write(NOISE[0] + "\n")

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert sorted(lines) == sorted(f"{t} line {i}" for t in "ab" for i in range(200))


def test_through_rays_own_printing_a_worker_notice_is_left_out_and_a_real_error_and_warning_reach_the_console(
    capsys,
):
    """Ray's driver prints every worker's lines with ``print(..., file=sys.stdout/sys.stderr)`` looked up at each
    call (``ray._private.worker.print_to_stdstream``): the filter sees them there. Ray's real function, no cluster."""
    from ray._private import worker as ray_worker

    real = [
        "ERROR:2026-12-07 06:42:44,309:weight sync failed: connection refused",
        "(EngineCore pid=30013) WARNING 12-07 06:42:01 [scheduler.py:9] KV cache is full; preempting requests",
    ]
    noise = [message_of(NOISE[0])[1], message_of(NOISE[2])[1]]
    batch = {"pid": 4242, "actor_name": "WorkerDict", "ip": "127.0.0.1", "localhost": "127.0.0.1"}
    with quiet_console({}):
        for is_err in (True, False):
            ray_worker.print_to_stdstream(
                {**batch, "is_err": is_err, "lines": [noise[0], real[0], noise[1], real[1]]}, ignore_prefix=False
            )
    captured = capsys.readouterr()
    for stream in (captured.err, captured.out):
        shown = [message_of(line) for line in stream.splitlines()]
        assert shown == [("WorkerDict pid=4242", line) for line in real]
    with quiet_console({"NGV_CONSOLE": "full"}):  # the control: the same lines, unfiltered
        ray_worker.print_to_stdstream({**batch, "is_err": True, "lines": noise}, ignore_prefix=False)
    assert [message_of(line)[1] for line in capsys.readouterr().err.splitlines()] == noise
