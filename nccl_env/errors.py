"""The one exception type for bad input a user can fix.

Every package raises a subclass of :class:`LagomError` for input problems (a bad
file, an out-of-range knob, an unknown preset). The CLI prints its message as one
line and exits with status 2; anything else is a bug and keeps its traceback.
It lives in the lowest package so that every other package can use it.
"""


class LagomError(Exception):
    """Bad input: the message is one line that names the thing and the problem."""
