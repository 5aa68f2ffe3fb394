"""What a save leaves behind: ``keep_last`` pruning, and removal of unreferenced files.

Retention counts intact checkpoints only, checked as :func:`load_latest` checks them (see
:func:`tidy`), so it never trades an intact checkpoint for a damaged one.
"""

from __future__ import annotations

from sparktrain.checkpoint import layout
from sparktrain.checkpoint._errors import warn
from sparktrain.checkpoint._integrity import Unusable, verify
from sparktrain.checkpoint._store import _Store


def tidy(store: _Store, step: int, data: str, keep_last: int | None) -> None:
    """After ``step`` is committed as ``data``: apply ``keep_last``, drop unreferenced files.

    The new checkpoint is always kept and counts as one. The others are checked newest first
    (size and SHA-256 against the commit marker, as ``load_latest`` does) until
    ``keep_last - 1`` intact ones are found; those are kept. Every older one is deleted
    unchecked, since enough newer intact ones remain.

    A damaged checkpoint met on the way (its marker is invalid, or its data is missing,
    truncated or altered) is not counted and is deleted, with a warning that names it and
    why: ``load_latest`` can never load it, and keeping it would only make every later load
    skip it again. A checkpoint that cannot be read (an I/O error other than "not found")
    may be intact, so when one is met this save deletes no checkpoint at all; the next save
    tries again. Checking reads the data of up to ``keep_last - 1`` earlier checkpoints; the
    new one is not read back, since its size and SHA-256 were taken as it was written.

    With ``keep_last=None`` no checkpoint is deleted; newer steps than ``step`` are checked
    only to name, in the warning, the one ``load_latest`` returns.

    Markers go before their data, so an interrupted prune leaves only unreferenced data,
    which a later save removes; so are data files of steps without a marker (interrupted
    saves), other data of ``step`` (replaced just now), and ``.partial`` files.
    """
    names = store.names()
    markers = dict(layout.committed(names))
    others = sorted((s for s in markers if s != step), reverse=True)
    intact: list[int] = []  # newest first
    damaged: dict[int, Unusable] = {}
    unreadable: dict[int, Unusable] = {}
    checked = 0
    for other in others:
        if keep_last is None and (other < step or intact):
            break  # nothing is deleted: only the newest intact newer step matters
        if keep_last is not None and len(intact) == keep_last - 1:
            break
        checked += 1
        try:
            verify(store, other)
        except Unusable as exc:
            if exc.kind == "damaged":
                damaged[other] = exc
            elif exc.kind == "unreadable":
                unreadable[other] = exc
            continue  # a vanished one was pruned by someone else already
        intact.append(other)

    prune = keep_last is not None and not unreadable
    doomed = set(damaged) | set(others[checked:]) if prune else set()
    for s in sorted(doomed):
        store.remove(markers[s])
    for name in names:
        of = layout.data_step(name)
        if of is not None and name != data:
            # Another file of this step was replaced just now; a step without a marker is
            # an interrupted save; a doomed step was pruned.
            if of == step or of in doomed or of not in markers:
                store.remove(name)
        elif layout.is_partial(name):
            store.remove(name)  # left by a save killed before its rename

    returns = _returns(max([step, *intact[:1]]), unreadable)
    if unreadable:
        held = ""
        if keep_last is not None:
            held = f", so this save deleted no checkpoint (keep_last={keep_last} applies again "
            held += "at the next save)"
        warn(f"could not check {_listing(unreadable)} in {store.where}{held}; {returns}")
    if damaged:
        done = "deleted them" if prune else "left them in place"
        warn(
            f"{store.where} holds damaged checkpoints, which keep_last does not count: "
            f"{_listing(damaged)}; this save {done}; {returns}"
        )
    newer = [s for s in sorted(markers) if s > step and s not in damaged]
    if newer:
        left = [s for s in newer if s not in doomed]
        gone = [s for s in newer if s in doomed]
        parts = [f"saved step {step} into {store.where}"]
        if left:
            parts.append(f"which already holds newer step(s) {left}")
        if gone:
            parts.append(f"keep_last={keep_last} deleted its newer step(s) {gone}")
        advice = "; delete those or save higher steps" if left else ""
        warn(f"{', '.join(parts)}: {returns}{advice}")


def _listing(problems: dict[int, Unusable]) -> str:
    return "; ".join(f"step {s} ({exc})" for s, exc in sorted(problems.items(), reverse=True))


def _returns(latest: int, unreadable: dict[int, Unusable]) -> str:
    """What ``load_latest`` returns now, given the newest intact step ``latest``."""
    text = f"load_latest returns step {latest}"
    newer = sorted((s for s in unreadable if s > latest), reverse=True)
    if newer:
        text += f", or one of the newer step(s) {newer} if it can be read by then"
    return text
