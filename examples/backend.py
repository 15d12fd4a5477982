"""Your own local op under context parallelism: a kernel of FLA's signature, registered as a backend.

    torchrun --nproc-per-node 2 examples/backend.py          # CPU ranks over gloo (no GPU needed)

The op below is the gated delta rule token by token in plain torch (where a vendor kernel or an NPU build
would go: any op of flash-linear-attention's `chunk_gated_delta_rule` signature whose autograd covers
`initial_state`). register_backend names it and says what it takes; then every CP mode runs it on each
rank's shard (the summary modes call it at value width V + K to get the shard's state summary), and so do
the layer and the model (`backend="token_loop"`). Here cp_chunk_gated_delta_rule runs it in scan mode,
forward and backward, and the result is checked against gdn_cp's own chunked op on one device.

The registration sits at the top of the file and the run under `if __name__ == "__main__":`, so that the file
is also a module other processes import for its backend. torchrun's ranks each run the file; bench's ranks
and both sides of `bench compare REF REF` import only what they are told to (docs/library.md, "Your own
backend in worker processes"):

    PYTHONPATH=examples bench run cpu-smoke --backend-module backend \
        --set 'backend=[token_loop]' --filter mode=scan,cp=2,seq_len=1024,pass=forward --set rounds=1
    BENCH_BACKENDS=backend PYTHONPATH=examples bench run ...    # the same, from the environment

A package that ships such a kernel declares it once in its pyproject.toml instead, and any process that
looks the name up loads it (gdn_cp.ops.load_backend_plugins, once per process):

    [project.entry-points."gdn_cp.backends"]
    token_loop = "my_kernels.token_loop"      # or "my_kernels:register", a function that registers
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gdn_cp.distributed import (
    cp_chunk_gated_delta_rule,
    gather_sequence,
    shard_sequence,
    teardown_process_group,
)
from gdn_cp.ops import chunk_gated_delta_rule, register_backend
from gdn_cp.ops.ran import recording


def token_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **unused: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T, o_t = scale H_t^T q_t.

    q, k [B, T, H, K]; v [B, T, H, V]; g (log decay), beta [B, T, H]; initial_state [B, H, K, V].
    Returns o [B, T, H, V] and, with output_final_state, H_T [B, H, K, V] in fp32.
    """
    if use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    B, T, H, K = k.shape
    h = torch.zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(T):
        h = h * g[:, t].float().exp()[..., None, None]
        k_t = k[:, t].float()
        delta = (v[:, t].float() - torch.einsum("bhk,bhkv->bhv", k_t, h)) * beta[:, t, :, None].float()
        h = h + k_t[..., None] * delta[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t].float() * scale, h))
    return torch.stack(outputs, dim=1).to(v.dtype), (h if output_final_state else None)


# what it takes: fp32 on a CPU; no chunk_size or cu_seqlens argument (called once per document), and
# as many key heads as value heads (grouped_values=False: gdn_cp repeats the key heads for it)
register_backend("token_loop", token_loop, devices=("cpu",), dtypes=(torch.float32,))

REL_L2_BAR = 1e-4
"""fp32 (unit roundoff 6e-8) over 512 tokens: the token loop and the chunked op sum in other orders, a few
1e-7 relative apart; CP over a wrong state, O(1)."""


def main() -> None:
    """The op under CP in scan mode on this rank, forward and backward, against one device."""
    dist.init_process_group("gloo")  # one process per rank (torchrun); "nccl" on GPUs
    torch.manual_seed(0)  # the same inputs on every rank
    B, T, Hk, Hv, K, V = 1, 512, 2, 4, 16, 16
    q, k = torch.randn(B, T, Hk, K), torch.randn(B, T, Hk, K)
    v = torch.randn(B, T, Hv, V)
    g = -F.softplus(torch.randn(B, T, Hv))  # log decay, <= 0
    beta = torch.rand(B, T, Hv)
    inputs = [shard_sequence(x).requires_grad_() for x in (q, k, v, g, beta)]  # this rank's tokens
    options = {"mode": "scan", "backend": "token_loop"}  # the CP options (gdn_cp.CPOptions), by field
    with recording() as ran:  # what the call ran, as gdn_cp records it: the ops its backend seam called
        o_local, _ = cp_chunk_gated_delta_rule(*inputs, use_qk_l2norm_in_kernel=True, **options)
        o_local.square().sum().backward()  # the gradient runs back through every rank's op and the scan
    called = sorted({op.op for call in ran.calls for op in call.ops})
    o = gather_sequence(o_local.detach())
    dq = gather_sequence(inputs[0].grad)

    full = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    expected, _ = chunk_gated_delta_rule(*full, use_qk_l2norm_in_kernel=True)  # gdn_cp's own op, one device
    expected.square().sum().backward()
    errors = {
        "o": ((o - expected.detach()).norm() / expected.norm()).item(),
        "dq": ((dq - full[0].grad).norm() / full[0].grad.norm()).item(),
    }
    if dist.get_rank() == 0:
        shown = ", ".join(f"{name} {rel:.1e}" for name, rel in errors.items())
        print(
            f"{dist.get_world_size()} ranks, scan over {', '.join(called)}: rel-L2 against one device {shown}"
        )
    teardown_process_group()  # ends the group once every rank's last message is read
    if not called or any(not op.endswith(".token_loop") for op in called):
        raise SystemExit(f"the CP op called {called}, not this file's token_loop")
    if max(errors.values()) > REL_L2_BAR:
        raise SystemExit(f"rel-L2 {errors} against one device, above {REL_L2_BAR:.0e}")


if __name__ == "__main__":
    main()
