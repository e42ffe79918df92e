"""The machine label a run records names the CPU's model, so hosts with the same core count are told apart."""

from __future__ import annotations

import os

import torch

from topotuner_lab.training.machine import cpu_model, machine


def test_the_model_name_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: avx2\n")
    assert cpu_model(info) == "AMD EPYC 7B13"


def test_without_cpuinfo_the_platform_says_it(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: " x86_64 ")
    assert cpu_model(tmp_path / "absent") == "x86_64"
    monkeypatch.setattr("platform.processor", lambda: "")
    assert cpu_model(tmp_path / "absent") == ""


def test_the_label_holds_cores_model_and_device():
    label = machine()
    assert label.startswith(f"{os.cpu_count()} CPU cores")
    assert label.endswith(", no GPU") is not torch.cuda.is_available()
    model = cpu_model()
    assert (f"({model})" in label) is bool(model)
