"""The output projection's matrix-multiply forms: equal to F.linear, chosen by shape alone."""

import pytest
import torch
import torch.nn.functional as F

from seqtrans.linear import fp32


@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("bias", [True, False])
def test_every_form_equals_f_linear(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(rows, 24), torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    expected = F.linear(x, w, b)
    for form in (fp32._plain, fp32._weight_first, fp32._TransposedCopies()):
        torch.testing.assert_close(form(x, w, b), expected)


def test_the_form_depends_on_the_number_of_rows_alone() -> None:
    assert fp32.form_for(1) is fp32._transposed
    assert all(fp32.form_for(m) is fp32._weight_first for m in (2, 4, 21, 84, 1024))


def test_the_projection_keeps_leading_dimensions_and_computes_the_same_bits_every_time() -> None:
    torch.manual_seed(0)
    w = torch.randn(300, 16)
    for lead in ((2, 5), (1, 1), (7, 1)):
        x = torch.randn(*lead, 16)
        with torch.inference_mode():
            out = fp32.output_projection(x, w)
            again = fp32.output_projection(x.clone(), w)
        assert out.shape == (*lead, 300)
        torch.testing.assert_close(out, F.linear(x, w))
        assert torch.equal(out, again)
        rows = x.reshape(-1, 16)
        assert torch.equal(out.reshape(-1, 300), fp32.form_for(rows.size(0))(rows, w, None))


def test_transposed_copy_follows_weight_updates() -> None:
    """A cached transposed weight must never outlive an in-place update of the weight."""
    copies = fp32._TransposedCopies()
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    copies(x, w, None)
    with torch.no_grad():
        w.mul_(2.0)
    torch.testing.assert_close(copies(x, w, None), x @ w.t())


def test_training_goes_through_f_linear_with_gradients() -> None:
    torch.manual_seed(0)
    w = torch.randn(4, 8, requires_grad=True)
    x = torch.randn(3, 8, requires_grad=True)
    fp32.output_projection(x, w).sum().backward()
    assert w.grad is not None and x.grad is not None
    torch.testing.assert_close(x.grad, w.detach().sum(0).expand(3, 8))
