"""Run the app on uvicorn inside the caller's event loop, so the endpoint shares it with the proxy and the
controller (one loop: no locks between the routes and the training run).

Key decision: ``start()`` returns only once the socket is bound and reports the *bound* address, so a test
or a harness launcher reads the real port (``serve.port=0``) and checks it is loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

from asyncrl.serve.app import make_app
from asyncrl.serve.service import CompletionService

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0


class EndpointServer:
    """The endpoint of ``service`` on ``service.config.host:port``, plus the sweeper that ends silent
    trajectories (``serve.trajectory_timeout_s``)."""

    def __init__(self, service: CompletionService) -> None:
        self.service = service
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
        """Bind and start serving; raises if the socket cannot be bound (e.g. port in use)."""
        serving = asyncio.ensure_future(self._server.serve())
        self._tasks = [serving, asyncio.ensure_future(self._sweep())]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if serving.done():
                await self.stop()
                raise OSError(
                    f"the endpoint could not start on {self.service.config.host}:"
                    f"{self.service.config.port} (see the log above)"
                )
            if loop.time() > deadline:
                await self.stop()
                raise TimeoutError(f"the endpoint did not start within {STARTUP_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        socket = self._server.servers[0].sockets[0]
        self.address = socket.getsockname()[:2]
        logger.info("serving on %s", self.url)

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
