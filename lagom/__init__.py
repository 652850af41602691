"""Lagom: co-tune NCCL with the computation it overlaps.

The user-facing layer: CLI, tuned-config files, reports, runtime hook and bench.
"""

__version__ = "0.1.0"


def install(path=None, **kwargs):
    """Install Lagom's torch.distributed hook in this process; see :func:`lagom.runtime.install`."""
    from lagom.runtime import install as _install

    return _install(path, **kwargs)


def console_main() -> int:
    """The ``lagom`` console script and ``python -m lagom``: :func:`lagom.cli.main`, with a Ctrl-C while the
    CLI itself is being imported held until the import ends, then one line and exit 130 (this module
    imports nothing). After the command's status is known, SIGINT is ignored: nothing left to interrupt
    prints a traceback at exit."""
    import signal
    import sys

    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        from lagom.cli import main
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if held:
            raise KeyboardInterrupt
        status = main()
    except KeyboardInterrupt:
        status = 130
        print("lagom: interrupted", file=sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status
