import pytest
import torch

from hybridflow.workers.utils.logprob import at_temperature, forward_response_log_probs
from tests.workers.actor.ppo_batch import tiny_causal_lm

VOCAB, P, R = 16, 6, 5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _model():
    return tiny_causal_lm(seed=0).eval()


def _rows():
    prompt_lens = torch.tensor([6, 3, 1, 4])
    response_lens = torch.tensor([5, 2, 4, 1])
    attention_mask = torch.cat(
        [(torch.arange(P) >= P - prompt_lens[:, None]), (torch.arange(R) < response_lens[:, None])], dim=1
    ).long()  # (B, P+R): left-padded prompt, right-padded response
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, VOCAB, attention_mask.shape, generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, prompt_lens, response_lens


def test_matches_naive_per_row_forward():
    model = _model()
    input_ids, attention_mask, position_ids, prompt_lens, response_lens = _rows()
    temperature = 0.7
    with torch.no_grad():
        log_probs, entropy = forward_response_log_probs(
            model, input_ids, attention_mask, position_ids, R, temperature=temperature, calculate_entropy=True
        )
    assert log_probs.shape == (4, R) and entropy.shape == (4, R)

    # Reference: each row alone, without padding. The logit at unpadded position p predicts token
    # p+1, so response token j (at unpadded position pl + j) is predicted by position pl + j - 1.
    for b in range(4):
        pl, rl = int(prompt_lens[b]), int(response_lens[b])
        tokens = input_ids[b][attention_mask[b].bool()]  # (pl + rl,)
        with torch.no_grad():
            logits = model(input_ids=tokens[None]).logits[0] / temperature  # (pl + rl, V)
        dist = torch.log_softmax(logits[pl - 1 : pl + rl - 1], dim=-1)  # (rl, V)
        expected = dist.gather(-1, tokens[pl:, None]).squeeze(-1)
        expected_entropy = -(dist.exp() * dist).sum(-1)
        torch.testing.assert_close(log_probs[b, :rl], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[b, :rl], expected_entropy, atol=1e-5, rtol=1e-5)


def test_entropy_only_on_request_and_gradients_flow():
    model = _model()
    input_ids, attention_mask, position_ids, _, _ = _rows()
    log_probs, entropy = forward_response_log_probs(model, input_ids, attention_mask, position_ids, R)
    assert entropy is None
    log_probs.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_temperature_one_is_no_pass_over_the_logits():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    assert at_temperature(logits, 1.0) is logits and at_temperature(logits, 1) is logits  # no copy, no backward op
    scaled = at_temperature(logits, 0.7)
    assert torch.equal(scaled, logits / 0.7)
    scaled.sum().backward()
    torch.testing.assert_close(logits.grad, torch.full_like(logits, 1 / 0.7))
