"""The no_syncs check on a real GPU: a `.item()` hidden in a logging helper fails the test with its line, and
the same test passes once the helper keeps the value on the device. Run with `pytest -m gpu`."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

pytest_plugins = ["pytester"]

STEP = '''
import torch

model = torch.nn.Linear(8, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []

def log(loss):
    history.append({LOG})

def train_step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    log(loss)
'''

TEST = '''
import torch
from training import train_step

def test_step_never_waits(no_syncs):
    x, y = torch.randn(16, 8, device="cuda"), torch.randint(0, 4, (16,), device="cuda")
    for _ in no_syncs.steps(range(3), warmup=1):
        train_step(x, y)
'''


def test_an_item_in_a_logging_helper_fails_with_its_line_then_passes_after_the_fix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(training=STEP.replace("{LOG}", "loss.item()"), test_step=TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    # steps 1 and 2 each read the loss once; step 0 is warm-up
    result.stdout.fnmatch_lines(["*test_step_never_waits: 2 synchronizing calls under the no_syncs check "
                                 "(* more excused by warm-up or allow_syncs):",
                                 "*2x  *training.py:8  in log()*"])

    pytester.makepyfile(training=STEP.replace("{LOG}", "loss.detach()"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
