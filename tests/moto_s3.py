"""The tests' local S3 server: moto's threaded server, except that a PUT with a condition
(``If-None-Match`` or ``If-Match``) is checked and applied under one lock, atomically, as S3 does.

Moto checks a condition and then writes, so two concurrent conditional PUTs of one key can both
succeed. Lance commits each table version as such a PUT (``If-None-Match: *`` on the version's
manifest); on moto two writers racing on one dataset could both commit the same version, and the
later replaced the earlier's rows after it had read them back (seen once in a suite:
``test_on_the_local_s3_server_rows_are_written_searched_checked_and_removed``, one writer of six
found 0 rows). On S3 the check and the write are one step, which this server now reproduces."""
from __future__ import annotations

import threading

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server


class AtomicConditionalPuts:
    """WSGI middleware: conditional PUTs run one at a time, each to its response's end."""

    def __init__(self, app) -> None:
        self.app, self.lock = app, threading.Lock()

    def __call__(self, environ, start_response):
        conditional = environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MATCH")
        if environ["REQUEST_METHOD"] != "PUT" or not conditional:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))  # the object written before the lock is let go


class S3Server(ThreadedMotoServer):
    """``moto.server.ThreadedMotoServer`` serving through ``AtomicConditionalPuts``."""

    def _server_entry(self) -> None:
        app = AtomicConditionalPuts(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True)
        self._server_ready_event.set()
        self._server.serve_forever()
