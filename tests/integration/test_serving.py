"""`dvla serve` on 127.0.0.1, through its client and through raw openpi-format messages: the same
actions as in-process inference, batching across clients, malformed messages refused one by one
while everyone else is served, the chunk broker's timing, and /healthz."""

import threading
import urllib.request

import msgpack
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from dvla.cli import main
from dvla.policy import DiffusionVLAPolicy
from dvla.serving.client import ActionChunkBroker, PolicyClient, ServerError
from dvla.serving.server import PolicyServer, ServeConfig
from dvla.serving.wire import pack, unpack

CHECKPOINT = "tests/fixtures/checkpoint_v1"  # cameras corner2 (+ scene for questions), 4-D state


def observation(seed: int, size: int = 32) -> dict:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    state = rng.uniform(-0.5, 0.5, 4).astype(np.float32)
    return {"images": {"corner2": image}, "state": state, "prompt": "Reach a goal position"}


def in_process(policy, obs: dict) -> np.ndarray:
    images = {c: torch.from_numpy(image[None]) for c, image in obs["images"].items()}
    state = torch.from_numpy(obs["state"][None])
    return policy.predict_action_chunk(images, [obs["prompt"]], state)[0].numpy()


@pytest.fixture(scope="module")
def served():
    config = ServeConfig(CHECKPOINT, port=0, batch_window_ms=30, max_batch=8, max_message_bytes=2**20,
                         mixed_precision="no")  # fmt: skip
    policy = DiffusionVLAPolicy.from_pretrained(CHECKPOINT)
    server = PolicyServer(policy, config)
    port = server.start()
    yield port, DiffusionVLAPolicy.from_pretrained(CHECKPOINT)
    server.stop()


def test_a_round_trip_equals_in_process_inference(served):
    port, policy = served
    with PolicyClient("127.0.0.1", port) as client:
        meta = client.metadata
        assert meta["cameras"] == ["corner2"] and meta["state_dim"] == 4 and meta["chunk_size"] == 4
        for seed in range(3):
            obs = observation(seed)
            reply = client.infer(obs)
            assert reply["actions"].dtype == np.float32 and reply["actions"].shape == (4, 4)
            np.testing.assert_array_equal(reply["actions"], in_process(policy, obs))
            assert reply["server_timing"]["batch"] == 1 and reply["server_timing"]["infer_ms"] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        assert response.status == 200 and response.read() == b"OK\n"


def test_concurrent_clients_are_batched_and_each_gets_its_own_chunk(served):
    port, policy = served
    clients = [PolicyClient("127.0.0.1", port) for _ in range(4)]
    replies, barrier = {}, threading.Barrier(4)

    def ask(i):
        barrier.wait()
        replies[i] = clients[i].infer(observation(10 + i))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert max(r["server_timing"]["batch"] for r in replies.values()) > 1  # one forward for several
    for i, reply in replies.items():
        np.testing.assert_allclose(reply["actions"], in_process(policy, observation(10 + i)), atol=1e-5)
    for client in clients:
        client.close()


def malformed(i: int, rng: np.random.Generator):
    """The i-th malformed message (bytes or str) and a word its error must contain."""
    good = observation(i)
    short = {b"__ndarray__": True, b"data": b"xx", b"dtype": "<f4", b"shape": [8, 8, 3]}
    kinds = [
        lambda: (rng.bytes(int(rng.integers(1, 200))), "msgpack"),  # noise
        lambda: ("a text frame", "binary"),
        lambda: (msgpack.packb([1, 2, 3]), "map"),
        lambda: (pack({"images": good["images"], "state": good["state"]}), "prompt"),
        lambda: (pack({**good, "images": {"wrist": good["images"]["corner2"]}}), "cameras"),
        lambda: (
            pack({**good, "images": {"corner2": good["images"]["corner2"].astype(np.float32)}}),
            "uint8",
        ),
        lambda: (pack({**good, "images": {"corner2": good["images"]["corner2"][..., :2]}}), "shape"),
        lambda: (pack({**good, "state": np.zeros(int(rng.integers(5, 9)), np.float32)}), "state"),
        lambda: (pack({**good, "state": np.array([np.nan, 0, 0, 0], np.float32)}), "NaN"),
        lambda: (pack({**good, "state": "0,0,0,0"}), "state"),
        lambda: (pack({**good, "prompt": ""}), "prompt"),
        lambda: (pack({**good, "prompt": 7}), "prompt"),
        lambda: (msgpack.packb({"images": {"corner2": short}}), "msgpack"),  # 2 bytes for 8x8x3 floats
        lambda: (pack({**good, "images": {"corner2": np.zeros((2, 2, 3), np.uint8)}}), "px"),
    ]
    return kinds[i % len(kinds)]()


def test_a_thousand_malformed_messages_are_refused_and_serving_goes_on(served):
    port, policy = served
    rng = np.random.default_rng(0)
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as raw:  # the openpi client's way
        unpack(raw.recv())  # metadata first
        for i in range(1000):
            message, word = malformed(i, rng)
            raw.send(message)
            reply = raw.recv(timeout=30)
            assert isinstance(reply, str) and reply.startswith("error:") and word in reply, (i, reply)
        raw.send(pack(observation(99)))
        reply = unpack(raw.recv(timeout=30))
        np.testing.assert_array_equal(reply["actions"], in_process(policy, observation(99)))
    # a message over the size limit closes its own connection only
    bystander = PolicyClient("127.0.0.1", port)
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as raw:
        raw.recv()
        raw.send(b"\x00" * (2**20 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            raw.recv(timeout=30)
        assert closed.value.rcvd.code == 1009  # message too big
    with pytest.raises(ServerError, match="state must be"):
        bystander.infer({**observation(1), "state": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(
        bystander.infer(observation(5))["actions"], in_process(policy, observation(5))
    )
    bystander.close()


def test_the_broker_hands_out_one_action_per_tick_and_asks_ahead(served):
    port, policy = served
    with PolicyClient("127.0.0.1", port) as client:
        broker = ActionChunkBroker(client, n_action_steps=2, request_ahead=1)  # chunks of 4
        ticks = [observation(20 + t) for t in range(5)]
        actions = [broker.act(obs) for obs in ticks]
        first, second, third = (in_process(policy, ticks[t]) for t in (0, 1, 3))
        # tick 0 plans; tick 1 (1 action left) asks ahead from its observation, whose chunk runs
        # from its step 1 at tick 2; tick 3 asks again
        expected = [first[0], first[1], second[1], second[2], third[1]]
        np.testing.assert_array_equal(np.stack(actions), np.stack(expected))
        broker.reset()
        np.testing.assert_array_equal(broker.act(ticks[4]), in_process(policy, ticks[4])[0])
        with pytest.raises(ValueError, match="request_ahead"):
            ActionChunkBroker(client, n_action_steps=3, request_ahead=2)
        # asking ahead by a whole window: every chunk is requested as soon as the last one arrives
        piped = ActionChunkBroker(client, n_action_steps=2, request_ahead=2)
        actions = [piped.act(obs) for obs in ticks[:4]]
        first, second = in_process(policy, ticks[0]), in_process(policy, ticks[0])  # both asked at tick 0
        np.testing.assert_array_equal(np.stack(actions[:2]), first[:2])
        np.testing.assert_array_equal(np.stack(actions[2:]), second[2:4])


def test_a_port_in_use_is_reported_by_start(served):
    port, _ = served
    taken = PolicyServer(DiffusionVLAPolicy.from_pretrained(CHECKPOINT), ServeConfig(CHECKPOINT, port=port))
    with pytest.raises(OSError):
        taken.start()


def test_serve_refuses_bad_options(capsys):
    assert main(["serve"]) == 1
    assert "--checkpoint is required" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", CHECKPOINT, "--port", "70000"]) == 1
    assert "port must be in" in capsys.readouterr().err
