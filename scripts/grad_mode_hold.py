"""What holds a forward's outputs when a model runs in grad mode and the caller drops the result (the
corpus's inference_in_grad_mode): per recording, the references to its outputs right after capture
and now (Python, TensorImpl, storage), and the containers that hold a held one.

    python scripts/grad_mode_hold.py > results/replay_overhead/<device>/grad_mode_hold.log
"""
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for grace

import grace  # noqa: E402
from grace import runtime  # noqa: E402
from grace import torch_adapter as adapter  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("error: grad_mode_hold needs a CUDA GPU")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).cuda()
    f = torch.compile(m, backend="grace")
    x = torch.randn(2, 16, device="cuda")
    for _ in range(5):
        f(x).detach()
        gc.collect()
    for g in grace.REPORTS:
        print("graph", g.graph, g.call_path, [(s.backward, str(s.status), s.reason, s.replays, s.eager_calls,
                                               s.recorded_for) for s in g.partitions])
    for part in list(runtime._LIVE):
        for recordings in part.recordings.values():
            for r in recordings:
                print("backward", part.stats.backward, "baseline", r.baseline, "now",
                      adapter.references(r.tensors, r.storages))
                k = r.held_output()
                if k is not None:
                    t = r.tensors[k]
                    print("held", k, tuple(t.shape), [type(o).__name__ for o in gc.get_referrers(t)])
                    for o in gc.get_referrers(t):
                        if isinstance(o, (list, tuple)):
                            print("  in", type(o).__name__, len(o), [type(p).__name__ for p in gc.get_referrers(o)][:8])


if __name__ == "__main__":
    main()
