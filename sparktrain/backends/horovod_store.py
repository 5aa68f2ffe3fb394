"""Horovod's Gloo rendezvous store, with each scope emptied once all of its ranks are done.

``hvd.init()`` under Gloo meets its peers in three scopes of an HTTP key-value store
(``global``, ``local_<host>``, ``cross_<local rank>``): each rank puts its address, reads its
peers', connects, then sends a DELETE for its key; once every rank of a scope has, the store
empties the scope, so that a later ``hvd.init()`` (after ``hvd.shutdown()``) meets on fresh
keys. Horovod 0.28.1's handler counts the finished ranks of all scopes in one list and clears
all of it when any scope completes: a scope of one rank (``cross_0`` on one host) completing
first wipes the others' counts, so ``global`` is never emptied, and a second ``hvd.init()``
can read a peer's address from the first one (a closed port) before the peer writes its new
one: Gloo then aborts the rank (SIGABRT). This store counts per scope.
"""

from __future__ import annotations

from typing import Any

OK = 200


def rendezvous_handler() -> type:
    """The request handler class for Horovod's ``RendezvousHTTPServer``."""
    from horovod.runner.http.http_server import RendezvousHandler

    class ScopedRendezvousHandler(RendezvousHandler):
        """Horovod's handler, with a scope's finished ranks counted for that scope alone."""

        server: Any

        def do_DELETE(self) -> None:  # noqa: N802 - the name http.server dispatches to
            parts = self.path.split("/")
            if len(parts) != 3 or parts[1] not in self.server.scope_size:
                super().do_DELETE()  # a malformed path, or a scope the clients made
                return
            scope, key = parts[1], parts[2]
            with self.server.finished_list_lock:
                finished = self.server.finished_list[scope]
                finished.append(key)
                if len(finished) >= self.server.scope_size[scope]:
                    with self.server.cache_lock:
                        self.server.cache.pop(scope, None)
                    del self.server.finished_list[scope]
            self.send_status_code(OK)

    return ScopedRendezvousHandler
