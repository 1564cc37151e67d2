"""`dvla serve --checkpoint CKPT --port 8000`: a websocket policy server in openpi's wire format.

On connect the server sends its metadata (cameras, state and action sizes, chunk length, ...).
Each request is one observation {"images": {camera: uint8 (H, W, 3)}, "state": (S,) float,
"prompt": str}; the reply is {"actions": float32 (H, D) in robot units, "server_timing": {...}}.
Requests from several clients that arrive within `batch_window_ms` are decoded in one forward (a
lone client's request is not held back).
A malformed request gets a text frame naming the problem (openpi's client raises it as an error)
and the connection stays open; a message over `max_message_bytes` closes that connection only.
`GET /healthz` answers 200.
"""

from __future__ import annotations

import asyncio
import http
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from dvla.serving.wire import pack, unpack
from dvla.training.precision import autocast, check_precision, resolve_precision

MAX_PROMPT_CHARS = 2000
MAX_SIDE = 4096  # pixels per image side


class RequestError(ValueError):
    """A request the server cannot answer; its message goes back to the client."""


@dataclass
class ServeConfig:
    """Serve a checkpoint to robots: `dvla serve --checkpoint CKPT --port 8000`."""

    # A checkpoint folder, a training run's output_dir, or a hub model id.
    checkpoint: str | None = None
    # 127.0.0.1 serves this machine only; 0.0.0.0 every network interface (a robot on the LAN).
    host: str = "127.0.0.1"
    port: int = 8000
    # Requests arriving within this window of the first are decoded together (up to max_batch).
    batch_window_ms: float = 2.0
    max_batch: int = 8
    # Larger messages close their connection (the others are served on).
    max_message_bytes: int = 16 * 2**20
    # Denoising steps per chunk (None = the checkpoint's default decoding).
    decode_steps: int | None = None
    # "bf16", "no" (fp32) or "auto" (bf16 where it is fast; `dvla.training.precision`).
    mixed_precision: str = "auto"
    # "auto" = cuda when available, else cpu.
    device: str = "auto"

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a folder written by `dvla train` or a hub id")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535] (0 = any free port), got {self.port}")
        if self.batch_window_ms < 0 or self.max_batch < 1 or self.max_message_bytes < 1024:
            raise ValueError("batch_window_ms must be >= 0, max_batch >= 1 and max_message_bytes >= 1024")
        self.mixed_precision = check_precision(self.mixed_precision)


class PolicyServer:
    """Serves a `DiffusionVLAPolicy`; `run()` blocks, `start()` serves from a background thread."""

    def __init__(self, policy, config: ServeConfig):
        self.policy, self.config = policy, config
        self.device = policy.device
        self.autocast = autocast(resolve_precision(config.mixed_precision, self.device), self.device)
        model = policy.model.config
        self.metadata = {
            "server": "dvla",
            "cameras": list(policy.action_cameras),
            "state_dim": model.state_dim,
            "action_dim": model.action_dim,
            "chunk_size": model.chunk_size,
            "n_action_steps": policy.n_action_steps,
            "request": {
                "images": "{camera: uint8 (H, W, 3)}",
                "state": f"float ({model.state_dim},)",
                "prompt": "instruction (str)",
            },
        }
        # forwards run one at a time in one thread, off the event loop: the caller's main thread for
        # `dvla serve` (bf16 autocast runs 1.5x slower in a secondary thread on CPUs), else a worker
        self._jobs: queue.Queue = queue.Queue()
        self._running = threading.Event()
        self._queue: asyncio.Queue | None = None
        self._clients = 0  # open connections: a lone client's request is not held for a batch
        self._stopped: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None  # the bound port, once serving

    # ---- requests -------------------------------------------------------------------------------

    def check(self, message) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
        """A decoded request -> (images, state (S,) float32, prompt), or a RequestError naming what
        is wrong and how it should be."""
        if not isinstance(message, dict):
            raise RequestError(
                f"a request is a map with images, state and prompt; got a {type(message).__name__}"
            )
        missing = [key for key in ("images", "state", "prompt") if key not in message]
        if missing:
            raise RequestError(f"the request has no {missing}; it needs images, state and prompt")
        images, state, prompt = message["images"], message["state"], message["prompt"]
        cameras = self.metadata["cameras"]
        if not isinstance(images, dict) or set(images) != set(cameras):
            names = [str(name) for name in images] if isinstance(images, dict) else type(images).__name__
            raise RequestError(f"images must map exactly the cameras {cameras} to arrays; got {names}")
        checked = {}
        for camera in cameras:
            image = images[camera]
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
                kind = image.dtype if isinstance(image, np.ndarray) else type(image).__name__
                raise RequestError(f"image {camera!r} must be a uint8 array (H, W, 3); got {kind}")
            if (
                image.ndim != 3
                or image.shape[2] != 3
                or not 8 <= min(image.shape[:2]) <= max(image.shape[:2]) <= MAX_SIDE
            ):
                raise RequestError(
                    f"image {camera!r} must have shape (H, W, 3), 8..{MAX_SIDE} px; got {image.shape}"
                )
            checked[camera] = image
        dim = self.metadata["state_dim"]
        if not isinstance(state, np.ndarray) or state.dtype.kind not in "fiu" or state.shape != (dim,):
            kind = f"{state.dtype} {state.shape}" if isinstance(state, np.ndarray) else type(state).__name__
            raise RequestError(f"state must be a numeric array of shape ({dim},); got {kind}")
        state = state.astype(np.float32)
        if not np.isfinite(state).all():
            raise RequestError("state contains NaN or inf")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise RequestError(
                f"prompt must be a non-empty instruction of at most {MAX_PROMPT_CHARS} characters"
            )
        return checked, state, prompt

    def infer(self, requests: list[tuple[dict, np.ndarray, str]]) -> np.ndarray:
        """Checked requests with images of the same shapes -> actions (B, H, D) float32."""
        images = {c: torch.from_numpy(np.stack([r[0][c] for r in requests])) for c in requests[0][0]}
        state = torch.from_numpy(np.stack([r[1] for r in requests]))
        with self.autocast:
            chunk = self.policy.predict_action_chunk(images, [r[2] for r in requests], state)
        return chunk.float().cpu().numpy()

    # ---- the event loop -------------------------------------------------------------------------

    async def _batches(self) -> None:
        """Gather requests for `batch_window_ms` after the first, decode them by image shapes."""
        loop = asyncio.get_running_loop()
        window = self.config.batch_window_ms / 1000
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.config.max_batch and not self._queue.empty():  # came in meanwhile
                batch.append(self._queue.get_nowait())
            deadline = loop.time() + (window if self._clients > 1 else 0)
            while len(batch) < self.config.max_batch:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            groups = defaultdict(list)
            for item in batch:
                groups[tuple(image.shape for image in item[0][0].values())].append(item)
            for same in groups.values():
                start = time.perf_counter()
                try:
                    done = loop.create_future()
                    self._jobs.put(([item[0] for item in same], loop, done))
                    actions = await done
                except Exception as err:  # reported to the clients, the server goes on
                    for _, future, _ in same:
                        future.set_exception(err)
                    continue
                infer_ms = (time.perf_counter() - start) * 1000
                for row, (_, future, queued) in enumerate(same):
                    timing = {"infer_ms": infer_ms, "batch": len(same), "wait_ms": (start - queued) * 1000}
                    future.set_result((actions[row], timing))

    async def _handle(self, connection) -> None:
        from websockets.exceptions import ConnectionClosed

        loop = asyncio.get_running_loop()
        self._clients += 1
        try:
            await connection.send(pack(self.metadata))
            async for data in connection:
                received = time.perf_counter()
                try:
                    if isinstance(data, str):
                        raise RequestError("send binary msgpack frames, not text")
                    try:
                        message = unpack(data)
                    except Exception as err:  # anything msgpack or numpy raises
                        raise RequestError(f"not a msgpack message in openpi's format: {err}") from None
                    request = self.check(message)
                except RequestError as err:
                    await connection.send(f"error: {err}")
                    continue
                future = loop.create_future()
                await self._queue.put((request, future, received))
                try:
                    actions, timing = await future
                except Exception as err:  # reported to this client
                    await connection.send(f"error: inference failed: {err}")
                    continue
                timing["total_ms"] = (time.perf_counter() - received) * 1000
                await connection.send(pack({"actions": actions, "server_timing": timing}))
        except ConnectionClosed:
            pass
        finally:
            self._clients -= 1

    @staticmethod
    def _health(connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    async def serve(self, ready: threading.Event | None = None) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._queue, self._stopped = asyncio.Queue(), asyncio.Event()
        batcher = asyncio.create_task(self._batches())
        options = dict(compression=None, max_size=self.config.max_message_bytes, process_request=self._health)
        async with serve(self._handle, self.config.host, self.config.port, **options) as server:
            self.port = server.sockets[0].getsockname()[1]
            if ready is not None:
                ready.set()
            await self._stopped.wait()
        batcher.cancel()

    def _forwards(self) -> None:
        """Run queued forwards in this thread until the server stops."""
        while self._running.is_set():
            try:
                requests, loop, done = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                result = self.infer(requests)
            except Exception as err:  # handed to the waiting requests
                loop.call_soon_threadsafe(_settle, done, None, err)
            else:
                loop.call_soon_threadsafe(_settle, done, result, None)

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C): the network in a thread, forwards in this one."""
        self.start(forwards_here=True)

    def start(self, forwards_here: bool = False) -> int:
        """Serve from background threads; the bound port (config.port 0 = any free one). With
        `forwards_here` the forwards run in the calling thread, which blocks until `stop()`."""
        ready, failed = threading.Event(), []
        self._running.set()

        def serve() -> None:
            try:
                asyncio.run(self.serve(ready))
            except BaseException as err:  # e.g. the port is taken: raised in the caller's thread
                failed.append(err)
                ready.set()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(60):
            raise RuntimeError("the server did not start within 60 s")
        if failed:
            self._running.clear()
            raise failed[0]
        if forwards_here:
            try:
                self._forwards()
            finally:
                self.stop()
        else:
            self._worker = threading.Thread(target=self._forwards, daemon=True)
            self._worker.start()
        return self.port

    def stop(self) -> None:
        self._running.clear()
        if self._loop is not None and self._stopped is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(30)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def load_server(config: ServeConfig) -> PolicyServer:
    from dataclasses import replace

    from dvla.eval.rollout import resolve_device
    from dvla.policy import DiffusionVLAPolicy, PolicyConfig

    device = resolve_device(config.device)
    policy_config = PolicyConfig()
    if config.decode_steps is not None:
        policy_config = replace(
            policy_config, decode=replace(policy_config.decode, steps=config.decode_steps)
        )
    policy = DiffusionVLAPolicy.from_pretrained(config.checkpoint, policy_config, device)
    if not policy.acts:
        raise ValueError(f"{config.checkpoint} was trained without robot data: it has no actions to serve")
    return PolicyServer(policy, config)


def run(config: ServeConfig) -> None:
    server = load_server(config)
    where = f"{config.host}:{config.port}"
    print(f"serving {config.checkpoint} on ws://{where} (health: http://{where}/healthz); Ctrl-C stops")
    try:
        server.run()
    except KeyboardInterrupt:
        print("stopped")
