"""A client for `dvla serve`, without torch (numpy, msgpack and websockets only), to run on a robot.

    client = PolicyClient("192.168.1.10", 8000)
    broker = ActionChunkBroker(client, request_ahead=4)
    while True:
        action = broker.act({"images": {"top": frame}, "state": joints, "prompt": "insert the peg"})

The server speaks openpi's wire format, so openpi's own `WebsocketClientPolicy` works with it too.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack

import numpy as np

from dvla.serving.wire import pack, unpack


class ServerError(RuntimeError):
    """The server refused a request (its reason is the message)."""


class PolicyClient:
    """One connection to a policy server; `infer(observation)` -> {"actions": (H, D), ...}."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, wait_s: float = 0.0):
        """Connect (retrying for up to `wait_s` seconds while the server starts) and read its metadata."""
        from websockets.sync.client import connect

        self.uri = host if "://" in host else f"ws://{host}:{port}"
        deadline = time.monotonic() + wait_s
        self._stack = ExitStack()  # owns the connection (websockets' connect is a context manager)
        while True:
            try:
                self._connection = self._stack.enter_context(
                    connect(self.uri, compression=None, max_size=None)
                )
                break
            except (ConnectionRefusedError, OSError):
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"no policy server at {self.uri} (start one with `dvla serve`)"
                    ) from None
                time.sleep(0.5)
        try:
            self.metadata = unpack(self._connection.recv())
        except BaseException:
            self._stack.close()
            raise

    def infer(self, observation: dict) -> dict:
        self._connection.send(pack(observation))
        reply = self._connection.recv()
        if isinstance(reply, str):
            raise ServerError(reply)
        return unpack(reply)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ActionChunkBroker:
    """One action per control tick from the server's chunks.

    The first `n_action_steps` actions of each chunk are executed (the server's default when None).
    With `request_ahead` = d > 0 the next chunk is requested, in a background thread, when d
    actions of the current window are left, from that tick's observation; the robot executes those
    d actions meanwhile and continues with the new chunk from its step d (which is meant for the
    tick it is executed at). d = 0 requests a chunk when the window has run out, and waits for it.
    """

    def __init__(self, client: PolicyClient, n_action_steps: int | None = None, request_ahead: int = 0):
        chunk = client.metadata["chunk_size"]
        self.client = client
        self.window = n_action_steps or client.metadata["n_action_steps"]
        if (
            not 1 <= self.window <= chunk
            or not 0 <= request_ahead <= self.window
            or request_ahead + self.window > chunk
        ):
            raise ValueError(
                f"need 1 <= n_action_steps <= {chunk} and 0 <= request_ahead <= n_action_steps with "
                f"request_ahead + n_action_steps <= {chunk}; got {self.window} and {request_ahead}"
            )
        self.ahead = request_ahead
        self._queue: deque[np.ndarray] = deque()
        self._pending: Future | None = None
        self._thread = ThreadPoolExecutor(1)

    def act(self, observation: dict) -> np.ndarray:
        """The action (D,) to execute at this tick."""
        if not self._queue:
            if self._pending is not None:  # continue the chunk asked for d ticks ago at its step d
                pending, self._pending = self._pending, None
                actions = pending.result()["actions"]
                self._queue.extend(actions[self.ahead : self.ahead + self.window])
            else:
                self._queue.extend(self.client.infer(observation)["actions"][: self.window])
        if self.ahead and self._pending is None and len(self._queue) == self.ahead:
            self._pending = self._thread.submit(self.client.infer, observation)
        return self._queue.popleft()

    def reset(self) -> None:
        """Forget the current chunk (a new episode)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.exception()  # waits until the connection is free again; its outcome is dropped
        self._queue.clear()
