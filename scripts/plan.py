"""The run plan of a YAML on a machine you describe, on any machine (no GPU needed): every setting the auto keys
range over (micro-batch, activation checkpointing, reshard after forward, float8) with its predicted peak memory a
GPU, whether it fits, tokens/s a GPU, MFU, the time and GPU-hours to the YAML's max_duration, the YAML's own plan
marked *, and the time to 1T tokens.

  python scripts/plan.py yamls/llama8b.yaml --gpus 256 --gpu h100
  python scripts/plan.py yamls/llama70b.yaml --gpus 512 --gpu mi250x --json plan.json
  python scripts/plan.py yamls/llama1b.yaml device_microbatch_size=8 --gpus 1 --gpu 80

--gpu: h100, h200, mi250x (one GCD), mi300x, or a memory size in GiB. Exit status 2 when the YAML as set is
predicted not to fit (the line says what does).
"""
import argparse
import json
import sys

from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.machine import Machine, gpu_named, launched_as
from llmfoundry_ext.plan.table import plan_for, render, rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('yaml')
    parser.add_argument('overrides', nargs='*', help='key=value, as train.py takes them')
    parser.add_argument('--gpus', type=int, required=True)
    parser.add_argument('--gpu', required=True, help='h100, h200, mi250x, mi300x, or GiB')
    parser.add_argument('--gpus-per-node', type=int, default=8)
    parser.add_argument('--json', help='also write the table and the plan here')
    args = parser.parse_intermixed_args(argv)
    try:
        machine = Machine.described(args.gpus, gpu_named(args.gpu), args.gpus_per_node)
    except ValueError as error:
        parser.error(str(error))
    with launched_as(machine):  # the config is validated, and its batch split, for that machine's processes
        try:
            every, own = plan_for(args.yaml, args.overrides, machine)
        except ConfigError as error:
            print(f'config error: {error}', file=sys.stderr)
            return 2
        print(render(every, own, args.yaml))
        refused = isinstance(own, ConfigError)
        if args.json:
            with open(args.json, 'w') as file:
                json.dump({'yaml': args.yaml, 'overrides': args.overrides, 'gpus': args.gpus, 'gpu': machine.gpu.name,
                           'rows': rows(every, None if refused else own), 'refused': str(own) if refused else None,
                           'auto': [] if refused else list(own.auto_keys)}, file, indent=1)
    return 2 if refused else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
