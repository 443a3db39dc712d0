"""Running the app: uvicorn on one host and port, with a draining shutdown.

SIGTERM (what ``kill``, systemd and Kubernetes send) drains: new requests get 503 at once, the queued
and running ones finish, and then uvicorn stops (exit code 0). A second SIGTERM, or Ctrl-C, stops at
once. uvicorn is chosen because FastAPI's own docs run on it, it is maintained by the same people as
Starlette, and its ``Server`` exposes the signal hook that a drain needs.

Example::

    $ lmforge serve --model runs/gpt/model --port 8000 &
    $ kill -TERM %1      # running requests finish; new ones get 503; then the server exits
"""

from __future__ import annotations

import signal
import sys
import threading

from lmforge.serve.served import ServedModel


def make_server(app, host: str, port: int, log_level: str = "warning"):
    """A uvicorn ``Server`` for ``app`` whose SIGTERM drains (see the module docstring)."""
    import uvicorn  # optional dependency (serve)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            state = app.state
            if sig == signal.SIGTERM and not state.draining:
                state.draining = True
                print("lmforge serve: SIGTERM: draining (new requests get 503)", file=sys.stderr, flush=True)
                threading.Thread(target=self._drain, daemon=True).start()
                return
            super().handle_exit(sig, frame)

        def _drain(self) -> None:
            for m in app.state.served.values():
                if m.scheduler is not None:
                    m.scheduler.drain()
            for m in app.state.served.values():
                if m.scheduler is not None:
                    m.scheduler.wait_idle()
            self.should_exit = True

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30,
                            lifespan="off")
    return DrainingServer(config)


def serve_forever(app, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM has drained it (or Ctrl-C); then stop the models' schedulers."""
    server = make_server(app, host, port)
    try:
        server.run()
    finally:
        for m in app.state.served.values():
            if isinstance(m, ServedModel):
                m.close()
