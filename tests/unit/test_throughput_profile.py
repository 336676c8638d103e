"""Exposed communication from profiler events: which events are communication and which are
compute, on CPU (gloo threads) and GPU (kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer.step_clock import comm_and_compute
from trainer.throughput import exposed_time


def _event(name, thread, start_us, end_us, device=torch.autograd.DeviceType.CPU):
    return SimpleNamespace(name=name, thread=thread, device_type=device,
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def test_cpu_gloo_work_on_its_thread_is_communication_and_main_thread_ops_compute():
    events = [
        _event("aten::mm", 1, 0, 300_000),  # compute on the main thread
        _event("c10d::allreduce_", 1, 300_000, 300_100),  # the launch
        _event("gloo:all_reduce", 2, 250_000, 400_000),  # gloo's thread: 50 ms after compute
        _event("aten::copy_", 2, 260_000, 270_000),  # inside the collective: not compute
    ]
    comm, compute = comm_and_compute(events, on_gpu=False)
    assert compute == [(0.0, 0.3)]
    assert exposed_time(comm, compute) == pytest.approx(0.1)


def test_gpu_nccl_kernels_are_communication_and_other_kernels_compute():
    cuda = torch.autograd.DeviceType.CUDA
    events = [
        _event("ncclDevKernel_AllReduce_Sum_f32", 7, 0, 100, cuda),
        _event("ampere_sgemm_128x64", 7, 50, 100, cuda),
        _event("aten::mm", 1, 0, 1_000),  # host side: ignored on GPU
    ]
    comm, compute = comm_and_compute(events, on_gpu=True)
    assert comm == [(0.0, 1e-4)] and compute == [(5e-5, 1e-4)]
    assert exposed_time(comm, compute) == pytest.approx(5e-5)


def test_log_line_states_speed_mfu_and_breakdown(tmp_path, monkeypatch, capsys):
    from plugins.protocol.events import StepMetrics
    from trainer.metrics import RunReporter

    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    reporter = RunReporter(tmp_path, total_steps=2, log_interval=1, progress_bar=False)
    figures = dict(loss=2.0, lr=0.1, grad_norm=1.0, loss_tokens=8, step_time_s=2.0,
                   data_wait_s=0.2, forward_backward_s=1.6, optimizer_s=0.2,
                   model_tflops_per_gpu=0.5)
    reporter.step(StepMetrics(step=1, **figures), total_steps=2)
    reporter.step(StepMetrics(step=2, exposed_comm_s=0.5, mfu=0.25, **figures), total_steps=2)
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first.endswith("| 0.5 TFLOP/s/GPU | data 10% fwd-bwd 80% opt 10%")  # no peak: no MFU
    assert "MFU" not in first
    assert second.endswith("| MFU 25.0% | data 10% fwd-bwd 80% opt 10% comm exposed 25% "
                           "(profiled)")


def test_a_continued_run_drops_what_an_earlier_attempt_recorded_past_its_start(tmp_path,
                                                                               monkeypatch):
    import json

    from trainer.metrics import RunReporter

    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    def held(step):
        return {"kind": "heldout", "step": step, "loss": 5.0}

    def train(step):
        return {"kind": "train", "step": step, "loss": 5.0, "lr": 1e-3}

    records = [held(0), train(1), train(2), train(3), held(2), train(4),
               {"kind": "summary", "steps": 4}]
    text = "".join(json.dumps(r) + "\n" for r in records)
    for cut_short in ("", '{"kind": "train", "st'):  # a rank killed mid-write leaves the second
        (tmp_path / "metrics.jsonl").write_text(text + cut_short)
        reporter = RunReporter(tmp_path, total_steps=6, log_interval=1, progress_bar=False)
        reporter.continue_from(2)  # resumed from the checkpoint of step 2: 3, 4 trained again
        kept = (tmp_path / "metrics.jsonl").read_text()
        assert kept == "".join(json.dumps(r) + "\n" for r in (held(0), train(1), train(2)))
        # (the held-out loss at 2 is measured again)
        assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
