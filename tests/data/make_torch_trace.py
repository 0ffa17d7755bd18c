"""Make tests/data/traces/torch_cpu_step.json: one training step of a small transformer profiled with
torch.profiler on the CPU (PyTorch's Kineto Chrome-trace JSON).

torch is needed only to regenerate the fixture, never by trainsim or its tests:

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
    /tmp/torchenv/bin/python tests/data/make_torch_trace.py

The model: 2 encoder layers (d_model 128, 4 heads, FFN 256) over a batch of 4 x 64 tokens, cross-entropy over a
1,000-token vocabulary, AdamW. Two warm-up steps run unprofiled; the third is recorded (ProfilerStep#2), with
operand shapes (`record_shapes`), so that matrix multiplies can be re-costed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(__file__).resolve().parent / "traces" / "torch_cpu_step.json"
VOCAB, D_MODEL, HEADS, FFN, LAYERS, BATCH, SEQ = 1000, 128, 4, 256, 2, 4, 64


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.embed(tokens)))


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=2, active=1, repeat=1),
                 on_trace_ready=lambda done: done.export_chrome_trace(str(OUT))) as prof:
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            prof.step()
    doc = json.loads(OUT.read_text())
    OUT.write_text(json.dumps(doc, separators=(",", ":")))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(doc['traceEvents'])} events)")


if __name__ == "__main__":
    main()
