"""Devices by name, and the questions the cluster asks a device instead of comparing its name."""

import types

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.engines import allreduce_limits
from workbench.cluster.program import worker_device
from workbench.devices import device_type, open_device
from workbench.gpu import GPU
from workbench.graph.device import CPU, Device


def test_names_give_the_type_of_device_without_opening_one():
    assert device_type("cpu") is CPU
    assert device_type("gpu") is GPU and device_type("gpu:3") is GPU  # no CuPy needed: nothing is opened
    with pytest.raises(wb.DeviceError, match="unknown device 'tpu'; use 'cpu' or 'gpu'"):
        device_type("tpu")
    assert isinstance(open_device("gpu:1", emulate=True), GPU) and open_device("gpu:1", emulate=True).index == 1


@pytest.mark.parametrize(
    "device, host_arrays, device_arrays",
    [(CPU(), True, False), (GPU(emulate=True), False, False)],  # an emulated GPU keeps a GPU's code path
)
def test_devices_say_where_their_values_live(device, host_arrays, device_arrays):
    assert isinstance(device, Device)
    assert (device.host_arrays, device.device_arrays) == (host_arrays, device_arrays)
    assert type(device).host_arrays == host_arrays  # the type answers for all its devices
    assert device_type(device.kind).kind == device.kind


def test_a_device_names_the_options_a_worker_takes():
    gpu = GPU("gpu:2", emulate=True, fuse=False, results="device", cuda_graphs=True)
    assert set(gpu.options) == {"emulate", "fuse", "results", "cuda_graphs"}
    assert worker_device(gpu.name, gpu.options) == ("gpu", (("emulate", True), ("fuse", False)))
    assert CPU.worker_options == () and worker_device("cpu", {}) == ("cpu", ())
    with pytest.raises(wb.ClusterError, match="unknown device 'tpu' for workers"):
        worker_device("tpu", {})


def test_the_allreduce_family_refuses_devices_whose_values_are_not_host_arrays():
    request = types.SimpleNamespace(data={"x": np.zeros((4, 2))}, device=GPU(emulate=True))
    assert allreduce_limits(request, None, None) == "it runs on CPU workers, and the session's device is 'gpu:0'"
