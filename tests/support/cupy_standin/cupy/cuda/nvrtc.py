"""``cupy.cuda.nvrtc`` of the CPU stand-in (real CuPy imports it with ``cupy.cuda``); nothing compiles here."""


def getVersion() -> tuple:
    return (13, 0)
