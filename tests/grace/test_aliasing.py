"""grace end to end on the CPU (Inductor partitioning CPU code, the capture stand-in): what a compiled
function returns aliases the caller's tensors exactly where eager's result does, and its inputs change
as eager changes them, on every call (the warm-up, the recording, replays, and once an input kept
moving). Values alone do not show it: an output made in the recording's memory has the right values."""

import pytest
import torch

CASES = {  # name: (function, inputs of call i)
    "slice_of_an_input": (lambda x: (x[1:], x * 2), lambda i: (torch.randn(8),)),
    "slice_of_a_slice_at_another_offset_each_call": (lambda x: (x[1:], x * 2),
                                                     lambda i: (torch.arange(40.0)[i:i + 8],)),
    "strided_slice": (lambda x: (x[..., ::2], x + 1), lambda i: (torch.randn(4, 6),)),
    "expanded_input": (lambda x: (x.unsqueeze(0).expand(3, -1, -1), x.sum()), lambda i: (torch.randn(4, 6),)),
    "diagonal": (lambda x: (x.diagonal(), x * 3), lambda i: (torch.randn(5, 5),)),
    "views_of_two_inputs": (lambda a, b: (a[0], b[1:], a + b), lambda i: (torch.randn(3, 3), torch.randn(3, 3))),
    "transposed_slice": (lambda x: (x.t()[1:], x.relu()), lambda i: (torch.randn(4, 6),)),
    "unbind": (lambda x: (*x.unbind(0), x * 2), lambda i: (torch.randn(3, 4),)),
    "view_in_another_dtype": (lambda x: (torch.view_as_real(x), x * 2),
                              lambda i: (torch.randn(4, dtype=torch.complex64),)),
    "view_of_an_intermediate": (lambda x: ((x * 2)[1:],), lambda i: (torch.randn(4),)),
    "reshape": (lambda x: (x.reshape(2, 2), x + 1), lambda i: (torch.randn(4),)),
    "input_returned": (lambda x: (x, x.sum()), lambda i: (torch.randn(4, 4).t(),)),
    "empty_view": (lambda x: (x[:0], x * 2), lambda i: (torch.randn(4),)),
    "integer_view": (lambda x: (x[1:], x * 2), lambda i: (torch.arange(6) + i,)),
    "written_and_returned": (lambda x: (x.mul_(2), x), lambda i: (torch.randn(4),)),
    "written_and_a_view_returned": (lambda x: (x[:2], x.add_(1)), lambda i: (torch.randn(4),)),
    "written_then_a_strided_view": (lambda x: (x.add_(1)[::2],), lambda i: (torch.randn(6),)),
    "two_inputs_written": (lambda a, b: (a.add_(b), b.mul_(2), a + b), lambda i: (torch.randn(4), torch.randn(4))),
    "a_view_of_an_input_written": (lambda x: (x[1:].mul_(3), x), lambda i: (torch.randn(4),)),
}


def _same_memory(t, a):
    return t.numel() > 0 and t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_alias_the_callers_tensors_as_eagers_do(cpu_partitions, name):
    fn, inputs = CASES[name]
    compiled = torch.compile(fn, backend="grace", options={"pi": False, "scg": False})
    for i in range(8):  # a new input each call: it moves, and is copied from the fourth move on
        args = inputs(i)
        eager_args = [a.clone() for a in args]
        want, got = fn(*eager_args), compiled(*args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        for a, ea in zip(args, eager_args):
            torch.testing.assert_close(a, ea)
        for g, w in zip(got, want):
            for a, ea in zip(args, eager_args):
                assert _same_memory(g, a) == _same_memory(w, ea), (i, name)
                if _same_memory(w, ea):
                    assert g.storage_offset() - a.storage_offset() == w.storage_offset() - ea.storage_offset()
