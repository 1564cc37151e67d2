"""The state_dropout adapter: a learned "no state" token for a drawn fraction of training samples."""

import pytest
import torch
from tiny_models import batch, tiny_vla

from dvla.adapters.state_dropout import StateDropoutConfig


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_hides_the_state_of_drawn_samples(head):
    """The drawn samples' loss does not depend on their robot state (a learned token stands in for
    it) and the others' does; at inference nothing is drawn and every state counts."""
    torch.manual_seed(0)
    model = tiny_vla(head, adapters={"state_dropout": StateDropoutConfig(0.5)})
    adapter = model.adapters["state_dropout"]
    data = batch(size=6)
    hidden = adapter.draw(6, "cpu", torch.Generator().manual_seed(1))  # (B,)
    assert 0 < int(hidden.sum()) < 6

    def loss_with_state(state):
        data.observation.state = state
        return float(model.compute_loss(data, generator=torch.Generator().manual_seed(1))[0].detach())

    state = data.observation.state.clone()
    base = loss_with_state(state)
    assert loss_with_state(torch.where(hidden[:, None], -state, state)) == pytest.approx(base, abs=1e-6)
    assert loss_with_state(torch.where(hidden[:, None], state, -state)) != pytest.approx(base, abs=1e-4)
    loss, _ = model.compute_loss(data)
    loss.backward()
    assert adapter.hidden_embed.grad is not None and adapter.hidden_embed.grad.abs().sum() > 0
    # outside training (no draws) the state token is the state's own
    embeds, _, inputs = model.prefix_embeds(data.observation)
    torch.testing.assert_close(embeds[:, inputs.state_position], model.state_proj(data.observation.state))
    with pytest.raises(ValueError, match="fraction"):
        StateDropoutConfig(1.0)
