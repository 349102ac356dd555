"""Errors that are the user's to fix: the CLI prints them as one line and exits non-zero."""


class DihalError(Exception):
    """A problem with the user's input or environment (not a bug). Exit code 2 by default."""

    exit_code = 2


def unknown_name(kind: str, name: str, known) -> DihalError:
    known = sorted(known)
    return DihalError(f"unknown {kind} {name!r}; known: {', '.join(known) if known else '(none)'}")


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is an interrupt (Ctrl-C, or SIGTERM raised as one), or an error raised while one
    unwound: a library's cleanup may replace it (torch's functorch asserts on leaving a vmap early)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
