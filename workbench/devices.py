"""Opening a device by name: ``"cpu"``, ``"gpu"`` or ``"gpu:<index>"`` (see :mod:`workbench.graph.device`)."""

from __future__ import annotations

from typing import Any

from workbench.errors import DeviceError
from workbench.graph.device import CPU, Device


def device_type(device: str) -> type:
    """The class of the device that ``device`` names, not opened: what a device of that kind answers
    for all its instances (``kind``, ``host_arrays``, ``worker_options``), with no CuPy imported.

    >>> device_type("cpu").host_arrays, device_type("gpu:1").kind
    (True, 'gpu')
    """
    if device == "cpu":
        return CPU
    if device.startswith("gpu"):
        from workbench.gpu import GPU  # CuPy is imported only when a GPU is opened

        return GPU
    raise DeviceError(f"unknown device {device!r}; use 'cpu' or 'gpu'")


def open_device(device: str | Device = "cpu", **options: Any) -> Device:
    """The device that ``device`` names, opened with ``options``; an opened Device passes through.

    CuPy is imported only when a GPU is asked for.

    >>> open_device("cpu")
    <CPU>
    """
    if not isinstance(device, str):
        if options:
            raise DeviceError(f"options {sorted(options)} go with a device name, not an opened {device!r}")
        return device
    opened = device_type(device)
    return opened(**options) if opened is CPU else opened(device, **options)
