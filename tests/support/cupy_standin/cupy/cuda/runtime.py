"""``cupy.cuda.runtime`` of the CPU stand-in."""
from .. import DEVICE_COUNT, _current_device, _local


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount() -> int:
    return DEVICE_COUNT


def getDevice() -> int:
    return _current_device()


def setDevice(device: int) -> None:
    """Make GPU ``device`` current for this thread (CUDA 12: its primary context too)."""
    if not 0 <= device < DEVICE_COUNT:
        raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {device}")
    _local.device = int(device)


def getDeviceProperties(device: int) -> dict:
    if not 0 <= device < DEVICE_COUNT:
        raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {device}")
    return {"name": b"CPU stand-in for CuPy", "major": 9, "minor": 0, "totalGlobalMem": 2 ** 34,
            "multiProcessorCount": 2, "sharedMemPerBlock": 48 * 1024}


def runtimeGetVersion() -> int:
    return 13000


def driverGetVersion() -> int:
    return 13000
