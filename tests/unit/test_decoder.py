"""The parallel decoder, driven by toy logits functions whose behaviour is known."""

import pytest
import torch

from dvla.backbone.decoder import (
    Confidence,
    DecodeConfig,
    UnmaskSchedule,
    decode,
    decode_autoregressive,
)

MASK, V = 9, 10


class Oracle:
    """Puts most mass on `answer`, more confidently on some positions; counts its calls."""

    def __init__(self, answer: torch.Tensor, sureness: torch.Tensor | None = None):
        self.answer, self.calls, self.seen = answer, 0, []
        self.sureness = torch.linspace(6, 2, answer.shape[1]) if sureness is None else sureness

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.append(tokens.clone())
        logits = torch.zeros(*tokens.shape, V)
        return logits.scatter(
            -1, self.answer[..., None], self.sureness.expand_as(self.answer)[..., None].clone()
        )


def _blank(b=2, t=8):
    return torch.full((b, t), MASK)


@pytest.mark.parametrize("steps", [1, 2, 4, 8])
@pytest.mark.parametrize("schedule", list(UnmaskSchedule))
def test_forwards_equal_steps_and_the_answer_is_found(steps, schedule):
    answer = torch.randint(0, 9, (2, 8), generator=torch.Generator().manual_seed(steps))
    oracle = Oracle(answer)
    result = decode(oracle, _blank(), MASK, DecodeConfig(steps=steps, schedule=schedule, record_history=True))
    assert result.forwards == oracle.calls == steps
    assert torch.equal(result.tokens, answer)
    assert len(result.history) == steps
    hidden = [int((h == MASK).sum()) for h in result.history]
    assert hidden == sorted(hidden, reverse=True) and hidden[-1] == 0


def test_most_confident_positions_are_revealed_first():
    answer = torch.zeros(1, 4, dtype=torch.long)
    oracle = Oracle(answer, sureness=torch.tensor([1.0, 5.0, 3.0, 4.0]))
    result = decode(oracle, _blank(1, 4), MASK, DecodeConfig(steps=4, record_history=True))
    order = [int((h != MASK).nonzero()[-1, 1]) if i == 0 else None for i, h in enumerate(result.history)]
    assert order[0] == 1
    revealed = [set((h[0] != MASK).nonzero()[:, 0].tolist()) for h in result.history]
    assert revealed == [{1}, {1, 3}, {1, 2, 3}, {0, 1, 2, 3}]


def test_more_steps_than_tokens_uses_one_forward_per_token():
    oracle = Oracle(torch.zeros(2, 3, dtype=torch.long))
    assert decode(oracle, _blank(2, 3), MASK, DecodeConfig(steps=10)).forwards == 3


def test_vocabulary_constraints_are_respected():
    oracle = Oracle(torch.full((2, 6), 8))  # wants token 8 everywhere
    allowed = torch.zeros(6, V, dtype=torch.bool)
    allowed[:3, :4] = True  # positions 0-2: tokens 0-3 only
    allowed[3:, 4:8] = True  # positions 3-5: tokens 4-7 only
    tokens = decode(oracle, _blank(2, 6), MASK, DecodeConfig(steps=2), allowed=allowed).tokens
    assert (tokens[:, :3] < 4).all() and ((tokens[:, 3:] >= 4) & (tokens[:, 3:] < 8)).all()


def test_fixed_tokens_are_kept_and_seen_by_the_model():
    start = _blank(2, 6)
    start[:, :2] = 5  # already committed (inpainting)
    oracle = Oracle(torch.ones(2, 6, dtype=torch.long))
    result = decode(oracle, start, MASK, DecodeConfig(steps=4))
    assert (result.tokens[:, :2] == 5).all() and (result.tokens[:, 2:] == 1).all()
    assert all((seen[:, :2] == 5).all() for seen in oracle.seen)
    assert result.forwards == 4


def test_threshold_mode_reveals_all_confident_tokens_at_once():
    oracle = Oracle(torch.zeros(2, 8, dtype=torch.long), sureness=torch.full((8,), 12.0))
    result = decode(oracle, _blank(), MASK, DecodeConfig(steps=8, threshold=0.9))
    assert result.forwards == 1 and (result.tokens == 0).all()
    unsure = Oracle(torch.zeros(2, 8, dtype=torch.long), sureness=torch.zeros(8))  # uniform: never > 0.9
    assert decode(unsure, _blank(), MASK, DecodeConfig(steps=8, threshold=0.9)).forwards == 8


def test_remasking_lets_the_model_correct_an_early_mistake():
    class ChangesItsMind(Oracle):
        def __call__(self, tokens):
            logits = super().__call__(tokens)
            if self.calls == 1:  # first look: a confident wrong guess at position 0
                logits[:, 0] = 0
                logits[:, 0, 7] = 20
            else:  # later the right token is clear and the old guess looks unlikely
                logits[:, 0] = 0
                logits[:, 0, 3] = 20
            return logits

    answer = torch.full((1, 4), 3)
    plain = decode(ChangesItsMind(answer), _blank(1, 4), MASK, DecodeConfig(steps=4))
    assert plain.tokens[0, 0] == 7  # committed and never revisited
    fixed = decode(ChangesItsMind(answer), _blank(1, 4), MASK, DecodeConfig(steps=4, remask=0.5))
    assert fixed.tokens[0, 0] == 3 and fixed.forwards == 4


def test_confidence_measures_and_sampling():
    answer = torch.randint(0, 9, (2, 8), generator=torch.Generator().manual_seed(0))
    for confidence in Confidence:
        result = decode(Oracle(answer), _blank(), MASK, DecodeConfig(steps=3, confidence=confidence))
        assert torch.equal(result.tokens, answer)
    sure = Oracle(answer, sureness=torch.full((8,), 30.0))
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(
        decode(sure, _blank(), MASK, DecodeConfig(temperature=1.0), generator=gen).tokens, answer
    )


def test_autoregressive_mode_goes_left_to_right_one_forward_per_token():
    answer = torch.randint(0, 9, (2, 5), generator=torch.Generator().manual_seed(1))
    calls = []

    def step(k, previous):
        calls.append((k, None if previous is None else previous.clone()))
        return torch.nn.functional.one_hot(answer[:, k], V).float() * 10

    result = decode_autoregressive(step, _blank(2, 5), MASK, DecodeConfig(autoregressive=True))
    assert torch.equal(result.tokens, answer) and result.forwards == 5
    assert [k for k, _ in calls] == [0, 1, 2, 3, 4]
    assert calls[0][1] is None
    for k in range(1, 5):
        assert torch.equal(calls[k][1], answer[:, k - 1])  # each step sees the token chosen before it


def test_bad_decode_configs():
    with pytest.raises(ValueError, match="steps"):
        DecodeConfig(steps=0)
    with pytest.raises(ValueError, match="remask"):
        DecodeConfig(remask=1.0)
    with pytest.raises(ValueError, match="not a valid"):
        DecodeConfig(schedule="quadratic")
    with pytest.raises(ValueError, match="decode_autoregressive"):
        decode(
            Oracle(torch.zeros(1, 2, dtype=torch.long)), _blank(1, 2), MASK, DecodeConfig(autoregressive=True)
        )
