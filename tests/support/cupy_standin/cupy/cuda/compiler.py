"""``cupy.cuda.compiler`` of the CPU stand-in."""


class CompileException(Exception):
    def get_message(self) -> str:
        return str(self)
