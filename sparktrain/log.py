"""sparktrain's own messages (not the ranks' output): standard :mod:`logging`, shown by default.

Every module logs through ``get_logger(__name__)``, so its records go to the logger
``sparktrain.<module>`` and, as usual, propagate to ``sparktrain`` and then to the root logger.
Where nothing else shows them, a notebook or a terminal still sees them: the first time a
sparktrain logger is used, a handler is added to the ``sparktrain`` logger that writes
``sparktrain: <message>`` to the current ``sys.stderr``, and that logger's level is set to
INFO when no level was set on it and its ancestors would hide INFO. Nothing happens at import.

That handler steps aside whenever another handler would get the record (one on the logger
that made it, on ``sparktrain``, or on the root logger, following ``propagate``), so
configuring logging yourself never prints a message twice. To change what is shown:

- fewer messages: ``logging.getLogger("sparktrain").setLevel(logging.WARNING)``;
- none: ``logging.getLogger("sparktrain").addHandler(logging.NullHandler())``, and
  ``logging.getLogger("sparktrain").propagate = False`` if the root logger has handlers;
- elsewhere: ``logging.basicConfig(...)`` or any handler on the root logger or on
  ``sparktrain`` (with ``propagate = False`` on ``sparktrain`` to keep them off the root's
  handlers).

Example:
    >>> from sparktrain.log import get_logger
    >>> log = get_logger("sparktrain.driver.capacity")
    >>> log.info("waiting up to %.0fs for executors", 60.0)  # doctest: +SKIP
    sparktrain: waiting up to 60s for executors
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

ROOT_NAME = "sparktrain"
FORMAT = "sparktrain: %(message)s"
_INSTALL = threading.Lock()

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter


def get_logger(name: str) -> logging.LoggerAdapter[logging.Logger]:
    """The logger for a sparktrain module; pass ``__name__``.

    Use it like a :class:`logging.Logger` (``info``, ``warning``, ``exception``, ...; lazy
    ``%`` arguments). It is safe to create at module level: the default handler is added on
    first use, not here.

    Args:
        name: the module's name; a name outside ``sparktrain`` (``__main__``) is put under it.

    Returns:
        An adapter over the standard logger of that name.

    Example:
        >>> log = get_logger(__name__)
        >>> log.warning("%d local ranks but %d GPU(s): running on CPU", 4, 2)  # doctest: +SKIP
    """
    if name != ROOT_NAME and not name.startswith(ROOT_NAME + "."):
        name = f"{ROOT_NAME}.{name}"
    return _Logger(logging.getLogger(name), {})


class _Logger(_Adapter):
    """A logger that makes sure sparktrain's messages have somewhere to go."""

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        # Every logging call asks this first; doing the set-up here, rather than in log(),
        # keeps this module off the stack when the record notes where it was logged from.
        install_default_handler()
        return self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs  # keep the caller's ``extra`` (the base class replaces it)


class DefaultHandler(logging.Handler):
    """Writes records to the current ``sys.stderr``, unless another handler gets them."""

    # Recognised by this flag rather than by class, so a reloaded module adds no second one.
    sparktrain_default = True

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``sparktrain: <message>`` unless :func:`handled_elsewhere`."""
        stream = sys.stderr  # looked up now: notebooks and tests replace it
        if stream is None or handled_elsewhere(record):
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise
            self.handleError(record)


def install_default_handler() -> None:
    """Add the default handler to the ``sparktrain`` logger, once; set INFO whenever nothing
    is set (a level of its own, or the root's below WARNING, is kept).

    Called by every sparktrain logger before it logs; idempotent and cheap. A default handler
    that was removed comes back on the next message: to silence or redirect, add a handler.
    """
    top = logging.getLogger(ROOT_NAME)
    if _has_default(top) and not _info_unseen(top):
        return
    with _INSTALL:
        if not _has_default(top):
            top.addHandler(DefaultHandler())
        # Also when the level was set back to "nothing set" since (e.g. a test's log capture
        # restoring what it found before the first message): else INFO would go unseen.
        if _info_unseen(top):
            top.setLevel(logging.INFO)


def _info_unseen(top: logging.Logger) -> bool:
    """Whether ``top`` has no level of its own and what it inherits hides INFO."""
    return top.level == logging.NOTSET and top.getEffectiveLevel() > logging.INFO


def handled_elsewhere(record: logging.LogRecord) -> bool:
    """Whether a handler other than the default one is on the record's way up.

    Args:
        record: a record of a ``sparktrain.*`` logger.
    """
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(not getattr(h, "sparktrain_default", False) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def _has_default(logger: logging.Logger) -> bool:
    return any(getattr(handler, "sparktrain_default", False) for handler in logger.handlers)
