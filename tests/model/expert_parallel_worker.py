"""Run by tests/model/test_mixtral.py on 2 forked ranks (gloo): ``OUT EXPERTS TOP_K``, the MoE layer with its
experts split over the 2 ranks beside the whole layer on each rank's own tokens; rank 0 writes the largest
differences to OUT (JSON)."""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.mixtral import MixtralConfig, MoE

dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same layer on every rank
path, n_experts, top_k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = MixtralConfig(dim=32, ffn_dim=48, n_layers=2, n_experts=n_experts, experts_per_token=top_k)
whole = MoE(config, KernelConfig(), layer_id=0)
whole.experts.init_weights()
torch.nn.init.normal_(whole.gate.weight, std=0.5)
split = MoE(config, KernelConfig(), layer_id=0)
split.load_state_dict(whole.state_dict())
mesh = init_device_mesh('cpu', (world,))
for name in ('w1', 'w2', 'w3'):
    setattr(split.experts, name, torch.nn.Parameter(distribute_tensor(getattr(whole.experts, name).detach(), mesh,
                                                                      [Shard(0)])))
split.experts.expert_group = mesh.get_group()
torch.manual_seed(1 + rank)  # each rank its own tokens, of a different count: uneven all-to-all splits
x = torch.randn(1, 40 + 17 * rank, 32, requires_grad=True)
outputs, grads = [], []
for layer in (whole, split):
    out, statistics = layer(x)
    parameters = [x, layer.gate.weight, layer.experts.w1, layer.experts.w2, layer.experts.w3]
    grads.append(torch.autograd.grad((out ** 2).sum(), parameters))
    outputs.append(out)
whole_expert_grads = [grad.clone() for grad in grads[0][2:]]
for grad in whole_expert_grads:
    dist.all_reduce(grad)  # every rank's tokens reach every expert: the sum over the ranks
local = n_experts // world
mine = slice(rank * local, (rank + 1) * local)
differences = {
    'output': (outputs[0] - outputs[1]).abs().max().item(),
    'input_grad': (grads[0][0] - grads[1][0]).abs().max().item(),
    'router_grad': (grads[0][1] - grads[1][1]).abs().max().item(),
    'expert_grads': max((whole[mine] - split_grad.to_local()).abs().max().item()
                        for whole, split_grad in zip(whole_expert_grads, grads[1][2:])),
    'local_experts': split.experts.w1.to_local().shape[0],
    'scales': [outputs[0].abs().max().item(), grads[0][0].abs().max().item(), grads[0][1].abs().max().item(),
               max(whole.abs().max().item() for whole in whole_expert_grads)],
}
gathered = [None] * world
dist.all_gather_object(gathered, differences)
if rank == 0:
    with open(path, 'w') as file:
        json.dump(gathered, file)
dist.destroy_process_group()
