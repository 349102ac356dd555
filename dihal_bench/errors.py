"""Errors that are the user's to fix: the CLI prints them as one line and exits non-zero."""


class DihalError(Exception):
    """A problem with the user's input or environment (not a bug). Exit code 2 by default."""

    exit_code = 2


def unknown_name(kind: str, name: str, known) -> DihalError:
    known = sorted(known)
    return DihalError(f"unknown {kind} {name!r}; known: {', '.join(known) if known else '(none)'}")
