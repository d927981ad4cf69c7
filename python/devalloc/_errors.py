"""devalloc.Error: every failure of devalloc, with its message as devalloc wrote it."""
import re

# "path/to/file.toml:12:5: ..." (config errors carry line and column).
_LOCATION = re.compile(r"(?P<file>[^\s:][^:\n]*?):(?P<line>\d+)(?::(?P<column>\d+))?: ")


class Error(RuntimeError):
    """A devalloc failure.

    message  devalloc's message, unchanged (also str(error))
    code     devalloc's status code: "invalid_argument", "out_of_device_memory",
             "no_such_device", "runtime_unavailable", "unsupported", ...
    file, line, column
             where the message points into a file, when it does (None otherwise)
    """

    def __init__(self, message, code="internal"):
        super().__init__(message)
        self.message = message
        self.code = code
        found = _LOCATION.search(message)
        self.file = found["file"] if found else None
        self.line = int(found["line"]) if found else None
        self.column = int(found["column"]) if found and found["column"] else None
