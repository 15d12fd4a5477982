"""A whole model under context parallelism: one training step of the tiny Qwen3.5-style hybrid.

    torchrun --nproc-per-node 2 examples/model.py            # CPU ranks over gloo (no GPU needed)

gdn_cp.models.Qwen35Hybrid (3 Gated DeltaNet layers : 1 full attention) goes under CP with
apply_context_parallel: its GDN layers in p2p mode, full attention through Ulysses. Each rank feeds its
shard of the tokens and labels; the loss is a rank's share of the whole sequence's mean, so the gradients
are partial and all_reduce_gradients sums them over the CP ranks (as FSDP over the same ranks would); every
rank then takes the same AdamW step. The loss and the gradients are checked against the same model on one
device before the step.
"""

import copy

import torch
import torch.distributed as dist

from gdn_cp import all_reduce_gradients
from gdn_cp.distributed import shard_sequence, teardown_process_group
from gdn_cp.models import Qwen35Hybrid, Qwen35HybridConfig, apply_context_parallel

REL_BAR = 1e-4
"""fp32 (unit roundoff 6e-8): CP changes only the order of sums, 1e-7 on the loss and up to 1e-5 relative on
the smallest gradients (dt_bias', summed over every token); a wrong split or a lost gradient is O(1)."""

dist.init_process_group("gloo")  # one process per rank (torchrun); "nccl" on GPUs
torch.manual_seed(0)  # the same weights and tokens on every rank
config = Qwen35HybridConfig(vocab_size=256, hidden_size=64, chunk_size=16)
model = Qwen35Hybrid(config)
reference = copy.deepcopy(model)  # the same model on one device, to check against
tokens = torch.randint(0, config.vocab_size, (2, 257))  # [B, T + 1]
inputs, labels = tokens[:, :-1], tokens[:, 1:]  # next-token prediction on the global sequence

apply_context_parallel(model, dist.group.WORLD, mode="p2p")  # every GDN layer p2p; attention: Ulysses
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
out = model(shard_sequence(inputs), shard_sequence(labels))  # this rank's tokens: [B, T / cp]
out.loss.backward()  # this rank's share of the mean loss
all_reduce_gradients(model.parameters())  # summed over the CP ranks: every rank holds the whole gradient
loss = out.loss.detach().clone()
dist.all_reduce(loss)  # the whole sequence's loss
optimizer.step()

expected = reference(inputs, labels)
expected.loss.backward()
errors = {"loss": abs(loss.item() - expected.loss.item()) / abs(expected.loss.item())}
for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
    errors[name] = ((p.grad - q.grad).norm() / q.grad.norm().clamp_min(1e-30)).item()
worst = max(errors, key=errors.get)
if dist.get_rank() == 0:
    ranks, one = dist.get_world_size(), expected.loss.item()
    print(
        f"{ranks} ranks, p2p: loss {loss.item():.4f} (one device {one:.4f}); largest gradient rel-L2 "
        f"{errors[worst]:.1e} ({worst}); one AdamW step taken"
    )
teardown_process_group()  # ends the group once every rank's last message is read
if errors[worst] > REL_BAR:
    raise SystemExit(f"{worst}: rel-L2 {errors[worst]:.1e} against one device, above {REL_BAR:.0e}")
