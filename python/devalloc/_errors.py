"""devalloc.Error: every failure of devalloc, with its message as devalloc wrote it."""
import re

# Where a message points into a file, only at its start (elsewhere a name
# in the message could look like one): "path/devalloc.toml:12:5: ..." for a
# config, "plan.json: invalid JSON at line 3, column 15: ..." for a plan,
# "m.safetensors: header line 1, column 33 ..." for a safetensors header.
# A path may hold ':' or spaces; the first place that reads as a whole
# location wins. devalloc quotes every name it repeats ("tok.weight"), so a
# "file" with a double quote in it is the start of a name that merely looks
# like a location ('plan.json: /tensors/3 "w:5:6: x" appears twice'): none.
_LOCATIONS = (
    re.compile(r"(?P<file>[^\n]+?):(?P<line>\d+):(?P<column>\d+): "),
    re.compile(r"(?P<file>[^\n]+?): (?:invalid JSON at |header )line (?P<line>\d+), "
               r"column (?P<column>\d+)"),
)


def _location(message):
    for pattern in _LOCATIONS:
        found = pattern.match(message)
        if found and '"' not in found["file"]:
            return found["file"], int(found["line"]), int(found["column"])
    return None, None, None


class Error(RuntimeError):
    """A devalloc failure.

    message  devalloc's message, unchanged (also str(error))
    code     devalloc's status code: "invalid_argument", "out_of_device_memory",
             "no_such_device", "runtime_unavailable", "unsupported", "not_found",
             "permission_denied", "io_error", "data_loss", ...
    file, line, column
             where the message points into a file, when it does (None otherwise)
    """

    def __init__(self, message, code="internal"):
        super().__init__(message)
        self.message = message
        self.code = code
        self.file, self.line, self.column = _location(message)
