import pytest
import torch
import torch.nn.functional as F

from seqtrans import kernels
from seqtrans.kernels import Linear, MatmulTuner


@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("bias", [True, False])
def test_every_form_equals_f_linear(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(rows, 24), torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    expected = F.linear(x, w, b)
    for form in (kernels._plain, kernels._weight_first, kernels._TransposedCopies()):
        torch.testing.assert_close(form(x, w, b), expected)


def test_tuner_keeps_leading_dimensions_and_values() -> None:
    torch.manual_seed(0)
    tuner = MatmulTuner()
    x, w, b = torch.randn(2, 5, 16), torch.randn(30, 16), torch.randn(30)
    with torch.inference_mode():
        out = tuner(x, w, b, allow_copy=True)
    assert out.shape == (2, 5, 30)
    torch.testing.assert_close(out, F.linear(x, w, b))
    assert len(tuner._choice) == 1  # measured once for this shape


def test_transposed_copy_follows_weight_updates() -> None:
    """A cached transposed weight must never outlive an in-place update of the weight."""
    copies = kernels._TransposedCopies()
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    copies(x, w, None)
    with torch.no_grad():
        w.mul_(2.0)
    torch.testing.assert_close(copies(x, w, None), x @ w.t())


def test_training_goes_through_f_linear_with_gradients() -> None:
    torch.manual_seed(0)
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is not None and x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 8))
