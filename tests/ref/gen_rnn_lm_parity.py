#!/usr/bin/python3
"""Gradient-parity reference for apps/rnn_lm (its --parity mode, test rnn_lm_parity).

The RPC tutorial's tiny RNNModel (ntoken 10, ninp 2, nhid 3, nlayers 4; input
[5, 3] token ids: 5 steps of 3 sequences, as its batch 5 x nindices 3), built
locally with PyTorch 1.13 exactly as the tutorial's three parts (EmbeddingTable:
Embedding ~ U(-0.1, 0.1); LSTM(2, 3, 4); Decoder: Linear(3, 10), weight ~
U(-0.1, 0.1), bias 0), dropout off. One forward with a random initial state,
cross entropy over the flattened [15, 10] scores, one backward:
    /usr/bin/python3 tests/ref/gen_rnn_lm_parity.py
writes tests/data/rnn_lm_parity.safetensors with the weights
("emb.encoder.weight", "rnn.weight_ih_l0", ..., "dec.decoder.weight",
"dec.decoder.bias"), "input", "target", "h0", "c0", "loss" and every
parameter's gradient ("grad.<name>"); metadata ntoken, ninp, nhid, nlayers.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_refs import save_safetensors  # noqa: E402

NTOKEN, NINP, NHID, NLAYERS, STEPS, NSEQ = 10, 2, 3, 4, 5, 3


def main():
    torch.manual_seed(20241124)
    encoder = nn.Embedding(NTOKEN, NINP)
    encoder.weight.data.uniform_(-0.1, 0.1)
    rnn = nn.LSTM(NINP, NHID, NLAYERS)
    decoder = nn.Linear(NHID, NTOKEN)
    decoder.bias.data.zero_()
    decoder.weight.data.uniform_(-0.1, 0.1)
    data = torch.randint(0, NTOKEN, (STEPS, NSEQ))
    target = torch.randint(0, NTOKEN, (STEPS, NSEQ))
    h0, c0 = torch.randn(NLAYERS, NSEQ, NHID), torch.randn(NLAYERS, NSEQ, NHID)

    out = {"emb.encoder.weight": encoder.weight.detach().clone()}
    for name, p in rnn.named_parameters():
        out["rnn." + name] = p.detach().clone()
    out["dec.decoder.weight"] = decoder.weight.detach().clone()
    out["dec.decoder.bias"] = decoder.bias.detach().clone()

    emb = encoder(data)
    output, _ = rnn(emb, (h0, c0))
    decoded = decoder(output)
    loss = nn.CrossEntropyLoss()(decoded.view(-1, NTOKEN), target.view(-1))
    loss.backward()

    out.update({"input": data, "target": target, "h0": h0, "c0": c0, "loss": loss.detach()})
    out["grad.emb.encoder.weight"] = encoder.weight.grad
    for name, p in rnn.named_parameters():
        out["grad.rnn." + name] = p.grad
    out["grad.dec.decoder.weight"] = decoder.weight.grad
    out["grad.dec.decoder.bias"] = decoder.bias.grad
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "rnn_lm_parity.safetensors")
    save_safetensors(path, out, {"ntoken": NTOKEN, "ninp": NINP, "nhid": NHID, "nlayers": NLAYERS})
    print("wrote", path, "loss", loss.item())


if __name__ == "__main__":
    main()
