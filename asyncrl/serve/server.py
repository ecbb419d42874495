"""Run the app on uvicorn inside the caller's event loop, so the endpoint shares it with the proxy and the
controller (one loop: no locks between the routes and the training run).

Key decision: ``start()`` returns only once the socket is bound and reports the *bound* address, so a test
or a harness launcher reads the real port (``serve.port=0``) and checks it is loopback. The socket is bound
here, not by uvicorn (which logs a failed bind and exits), so a port still in use can be retried until a
deadline (a restarted training run binding its first attempt's port again) and fail by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket

import uvicorn

from asyncrl.serve.app import make_app
from asyncrl.serve.service import CompletionService

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0
BIND_RETRY_S = 0.1
"""How often a port still in use is tried again, until the server's ``bind_timeout_s``."""


class EndpointPortBusy(OSError):
    """The endpoint's port stayed in use for the whole of its bind deadline."""


class EndpointServer:
    """The endpoint of ``service`` on ``service.config.host:port``, plus the sweeper that ends silent
    trajectories (``serve.trajectory_timeout_s``). ``bind_timeout_s``: how long a port in use is retried
    (0: not at all, ``EndpointPortBusy`` at once)."""

    def __init__(self, service: CompletionService, bind_timeout_s: float = 0.0) -> None:
        self.service = service
        self.bind_timeout_s = bind_timeout_s
        config = service.config
        self._server = uvicorn.Server(
            uvicorn.Config(
                make_app(service),
                host=config.host,
                port=config.port,
                log_level="warning",
                lifespan="off",
                access_log=False,
                timeout_graceful_shutdown=5,
            )
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.address: tuple[str, int] | None = None

    @property
    def url(self) -> str:
        assert self.address is not None, "the server is not started"
        host, port = self.address
        return f"http://{host}:{port}"

    async def start(self) -> None:
        """Bind and start serving; ``EndpointPortBusy`` if the port stays in use past ``bind_timeout_s``, the
        ``OSError`` itself for any other bind failure."""
        listener = await self._bind()
        serving = asyncio.ensure_future(self._server.serve(sockets=[listener]))
        self._tasks = [serving, asyncio.ensure_future(self._sweep())]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if serving.done():
                await self.stop()
                listener.close()  # uvicorn failed before taking it over
                raise OSError(
                    f"the endpoint could not start on {self.service.config.host}:"
                    f"{self.service.config.port} (see the log above)"
                )
            if loop.time() > deadline:
                await self.stop()
                listener.close()
                raise TimeoutError(f"the endpoint did not start within {STARTUP_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        self.address = self._server.servers[0].sockets[0].getsockname()[:2]
        logger.info("serving on %s", self.url)

    async def _bind(self) -> socket.socket:
        """A socket bound to ``host:port`` (``SO_REUSEADDR`` as uvicorn sets it: a closed port's connections
        in TIME_WAIT do not hold it); an address in use is tried again every ``BIND_RETRY_S``."""
        host, port = self.service.config.host, self.service.config.port
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bind_timeout_s
        while True:
            listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((host, port))
                return listener
            except OSError as err:
                listener.close()
                if err.errno != errno.EADDRINUSE:
                    raise
                if loop.time() >= deadline:
                    raise EndpointPortBusy(
                        errno.EADDRINUSE,
                        f"the endpoint could not bind {host}:{port}: still in use after "
                        f"{self.bind_timeout_s:g} s (serve.bind_timeout_s); another process holds it",
                    ) from err
            await asyncio.sleep(BIND_RETRY_S)

    async def stop(self) -> None:
        self._server.should_exit = True
        for task in self._tasks[1:]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await task
        self._tasks = []

    async def _sweep(self) -> None:
        period = min(self.service.config.trajectory_timeout_s / 4, 5.0)
        while True:
            await asyncio.sleep(period)
            for trajectory in self.service.store.expire():
                logger.warning(
                    "trajectory %s ended as failed: %s", trajectory.trajectory_id, trajectory.reason
                )
