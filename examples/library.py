"""The README's library example, whole: one Gated DeltaNet layer under context parallelism.

    torchrun --nproc-per-node 2 examples/library.py          # CPU ranks over gloo (no GPU needed)

Every rank builds the same layer and input (one seed), puts the layer under CP in scan mode and runs its
shard of the sequence; the outputs, gathered, are then checked against the same layer on one device. The
lines between the `readme` markers are the README's "The library in a few lines" (tests/examples checks
that the two are equal).
"""

# --- readme: start
import torch
import torch.distributed as dist

from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig, LinearAttentionContextParallel
from gdn_cp.distributed import gather_sequence, shard_sequence, teardown_process_group

dist.init_process_group("gloo")  # one process per rank (torchrun); "nccl" on GPUs
cp_group = dist.group.WORLD  # every rank, or the CP dimension of a larger mesh
torch.manual_seed(0)  # the same weights and input on every rank
config = GatedDeltaNetConfig(hidden_size=128, num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)
layer = GatedDeltaNet(config)  # the Qwen3.5 GDN layer (from_hf_config maps a checkpoint's)
x = torch.randn(1, 1024, config.hidden_size)  # [B, T, hidden]: the whole sequence
LinearAttentionContextParallel(mode="scan").apply(layer, cp_group)  # or ulysses, p2p, all_gather
y_local = layer(shard_sequence(x, cp_group))  # this rank's tokens: [B, T / cp, hidden]
y = gather_sequence(y_local, cp_group)  # every rank's tokens, in order: [B, T, hidden]
teardown_process_group()  # ends the group once every rank's last message is read
# --- readme: end

REL_L2_BAR = 1e-4
"""fp32 (unit roundoff 6e-8) over 1024 tokens in chunks of 64: a correct CP layer differs from one device by
the order its sums run in, a few 1e-7 relative; a wrong one by O(1)."""

torch.manual_seed(0)  # the same draws again: the layer on one device, with the same weights
expected = GatedDeltaNet(config)(x).detach()
rel = ((y.detach() - expected).norm() / expected.norm()).item()
print(f"y {tuple(y.shape)} from {y_local.shape[1]} tokens a rank: rel-L2 {rel:.1e} against one device")
if rel > REL_L2_BAR:
    raise SystemExit(f"rel-L2 {rel:.1e} against one device, above {REL_L2_BAR:.0e}: CP is wrong here")
